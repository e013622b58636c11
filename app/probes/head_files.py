"""A fitted head on disk: ``arrays.npz`` + ``head.json``, never a pickle.

Layout of a head directory::

    arrays.npz   np.savez of the head's fitted arrays (numbers or text only;
                 object arrays are refused, so np.load never needs pickle)
    head.json    {"format": "layerbank-head/1", "head": name, "params": ...,
                  "fitted": scalars such as C_, "arrays": [names],
                  "metadata": whatever the caller passed}

A head class declares what to store: ``name``, ``_arrays`` (fitted array
attributes), ``_scalars`` (fitted JSON scalars) and ``_restore()`` (rebuild
helpers after loading). ``read_head`` rebuilds with ``cls(**params)`` and
``np.load(..., allow_pickle=False)``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.utils.validation import check_is_fitted

__all__ = ["HEAD_FORMAT", "read_head", "write_head"]

HEAD_FORMAT = "layerbank-head/1"


def _plain(value: Any) -> Any:
    """A parameter or fitted scalar as JSON (numpy scalars and tuples too)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def _storable(name: str, array: Any) -> np.ndarray:
    a = np.asarray(array)
    if a.dtype == object:
        # object labels (e.g. Python str) would need pickle; store them as text
        if all(isinstance(v, str) for v in a.ravel()):
            return a.astype(str)
        raise ValueError(f"cannot save {name}: its values are Python objects, neither numbers nor text")
    return a


def write_head(head: Any, directory: str | Path, metadata: dict[str, Any]) -> int:
    """Write ``head`` under ``directory``; return the bytes written."""
    check_is_fitted(head)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {a: _storable(a, getattr(head, a)) for a in head._arrays}
    doc = {
        "format": HEAD_FORMAT,
        "head": head.name,
        "params": {k: _plain(v) for k, v in head.get_params().items()},
        "fitted": {s: _plain(getattr(head, s)) for s in (*head._scalars, "n_features_in_")},
        "arrays": sorted(arrays),
        "metadata": metadata,
    }
    text = json.dumps(doc, indent=2, sort_keys=True)  # fails before writing if metadata is not JSON
    np.savez(directory / "arrays.npz", **arrays)  # type: ignore[arg-type]  # numpy stubs: **kwds
    (directory / "head.json").write_text(text)
    return sum((directory / f).stat().st_size for f in ("arrays.npz", "head.json"))


def read_head(directory: str | Path, head_class: Callable[[str], type]) -> Any:
    """Rebuild the head saved under ``directory``; ``head_class(name)`` gives its class."""
    directory = Path(directory)
    doc = json.loads((directory / "head.json").read_text())
    if doc.get("format") != HEAD_FORMAT:
        raise ValueError(f"{directory} is not a saved head ({HEAD_FORMAT}); format={doc.get('format')!r}")
    cls = head_class(doc["head"])
    defaults = cls().get_params()
    # JSON turned tuples into lists; give parameters their declared type back
    params = {k: tuple(v) if isinstance(defaults.get(k), tuple) else v for k, v in doc["params"].items()}
    head = cls(**params)
    with np.load(directory / "arrays.npz", allow_pickle=False) as npz:
        for name in doc["arrays"]:
            setattr(head, name, npz[name])
    for name, value in doc["fitted"].items():
        setattr(head, name, value)
    head._restore()
    return head

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

Damage (issue 25): ``read_head`` raises ``HeadDamaged`` naming the file and
what is wrong with it when a file is missing or unreadable, ``head.json`` is
not a saved head, an array is missing or not finite, or the arrays do not fit
together (checked by predicting one all-zero row: the answer must be one
finite probability per class). ``write_head`` refuses non-finite arrays, so a
fit that diverged fails its job instead of saving NaN. The one infinity a head
may hold by design is ``scale_`` of a dimension dropped as rounding noise.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.utils.validation import check_is_fitted

__all__ = ["HEAD_FORMAT", "HeadDamaged", "check_finite", "read_head", "write_head"]

HEAD_FORMAT = "layerbank-head/1"
# +inf is how a head drops a noise dimension (layerbank.app.probes.heads.Head.fit); NaN never is
_INF_ALLOWED = frozenset({"scale_"})


class HeadDamaged(ValueError):
    """A saved head's files cannot give correct predictions; ``reason`` says why."""

    def __init__(self, directory: Path, reason: str) -> None:
        super().__init__(f"{directory}: {reason}")
        self.directory = directory
        self.reason = reason


def check_finite(arrays: dict[str, np.ndarray]) -> str | None:
    """Why these arrays are not all finite (None when they are)."""
    for name in sorted(arrays):
        a = arrays[name]
        if a.dtype.kind not in "fc":
            continue
        nan = int(np.isnan(a).sum())
        inf = 0 if name in _INF_ALLOWED else int(np.isinf(a).sum())
        if nan or inf:
            what = " and ".join(w for w, n in (("NaN", nan), ("infinite", inf)) if n)
            return f"{name} holds {what} values ({nan + inf} of {a.size})"
    return None


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
    bad = check_finite(arrays)
    if bad is not None:  # a diverged fit: its predictions would be NaN
        raise ValueError(f"cannot save the {head.name} head: {bad}")
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
    """Rebuild the head saved under ``directory``; ``head_class(name)`` gives its class.

    Raises ``HeadDamaged`` (a ValueError) when the files cannot give correct predictions."""
    directory = Path(directory)
    doc = _read_doc(directory)
    try:
        cls = head_class(doc["head"])
    except Exception as e:  # an unknown head name
        raise HeadDamaged(directory, f"head.json names no head this version knows "
                                     f"({doc['head']!r}): {e}") from None
    try:
        defaults = cls().get_params()
        # JSON turned tuples into lists; give parameters their declared type back
        params = {k: tuple(v) if isinstance(defaults.get(k), tuple) else v for k, v in doc["params"].items()}
        head = cls(**params)
    except (TypeError, ValueError, AttributeError) as e:
        raise HeadDamaged(directory, f"head.json's params do not build a {doc['head']} head: {e}") from None
    arrays = _read_arrays(directory, doc["arrays"])
    bad = check_finite(arrays)
    if bad is not None:
        raise HeadDamaged(directory, f"arrays.npz: {bad}")
    for name, value in arrays.items():
        setattr(head, name, value)
    for name, value in doc["fitted"].items():
        setattr(head, name, value)
    try:
        head._restore()
        _check_predicts(head)
    except HeadDamaged:
        raise
    except Exception as e:  # shapes that do not fit together, a scalar of the wrong type, ...
        raise HeadDamaged(directory, f"its arrays do not fit together (wrong shape?): "
                                     f"{type(e).__name__}: {e}") from None
    return head


def _read_doc(directory: Path) -> dict[str, Any]:
    path = directory / "head.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise HeadDamaged(directory, "head.json is missing") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise HeadDamaged(directory, f"head.json cannot be read: {type(e).__name__}: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != HEAD_FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise HeadDamaged(directory, f"head.json is not a saved head ({HEAD_FORMAT}); format={got!r}")
    kinds = {"head": str, "params": dict, "fitted": dict, "arrays": list}
    for key, kind in kinds.items():
        if not isinstance(doc.get(key), kind):
            raise HeadDamaged(directory, f"head.json: {key!r} is missing or not a {kind.__name__}")
    return doc


def _read_arrays(directory: Path, names: list[Any]) -> dict[str, np.ndarray]:
    path = directory / "arrays.npz"
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [n for n in names if n not in npz.files]
            if missing:
                raise HeadDamaged(directory, f"arrays.npz lacks {', '.join(map(str, missing))}")
            return {str(n): npz[n] for n in names}
    except FileNotFoundError:
        raise HeadDamaged(directory, "arrays.npz is missing") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise HeadDamaged(directory, f"arrays.npz cannot be read: {type(e).__name__}: {e}") from None


def _check_predicts(head: Any) -> None:
    """One all-zero row in: one finite probability per class out, or the head is damaged."""
    hidden = getattr(head, "hidden_size_", None)
    if hidden is not None:  # the scalar mix takes [n, H, d]; its mean_ is [H, d]
        if np.ndim(head.mean_) != 2 or np.shape(head.mean_)[1] != int(hidden):
            raise ValueError(f"mean_ has shape {np.shape(head.mean_)}, not [H, {hidden}]")
        x = np.zeros((1, *np.shape(head.mean_)))
    else:
        x = np.zeros((1, int(head.n_features_in_)))
    with np.errstate(all="ignore"):
        proba = np.asarray(head.predict_proba(x))
    k = len(head.classes_)
    if proba.shape != (1, k) or not np.isfinite(proba).all():
        raise ValueError(f"predicting one row gave shape {proba.shape} (expected (1, {k})) "
                         f"{'' if np.isfinite(proba).all() else 'with non-finite values'}".rstrip())

"""Writing a feature matrix in the format its file name says: .npy, .parquet, .h5.

``check_out_path`` runs before any work (reading, model loading, encoding),
so a name layerbank cannot honour is refused at once rather than after the
encoder ran; ``write_features`` then writes exactly that file (never
``X.parquet.npy``, which ``numpy.save`` makes of a foreign suffix).

Layouts (rows in input order, float32):

- ``.npy``: the array itself, ``[n, d]`` (``[n, H, d]`` for ``all_layers``).
- ``.parquet``: one row per text: ``text`` (string) and ``features``
  (fixed-size list of float32, nested once more for ``[n, H, d]``); the
  schema metadata carries ``view``, ``pooling``, ``model`` and ``shape``.
  ``pyarrow.parquet.read_table(p)["features"]`` reads it back, and pandas
  gives one array per row.
- ``.h5``: dataset ``/features`` (the array) and ``/texts`` (UTF-8 strings),
  with ``view``, ``pooling`` and ``model`` as attributes of ``/features``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["OUT_FORMATS", "OutPathError", "check_out_path", "write_features"]

OUT_FORMATS = (".npy", ".parquet", ".h5")


class OutPathError(ValueError):
    """An output path layerbank cannot write; the message says what to use."""


def check_out_path(path: str | Path) -> Path:
    """The path, or OutPathError when its suffix is not a format we write or
    its folder does not exist."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".hdf5":
        suffix = ".h5"
    if suffix not in OUT_FORMATS:
        raise OutPathError(f"cannot write {str(p)!r}: --out must end in {', '.join(OUT_FORMATS)} "
                           f"(the suffix says the format; got {p.suffix or 'no suffix'!r})")
    if not p.parent.is_dir():
        raise OutPathError(f"cannot write {str(p)!r}: the folder {str(p.parent)!r} does not exist")
    return p


def write_features(path: str | Path, x: np.ndarray, *, texts: Sequence[str], view: str,
                   pooling: str, model: str) -> Path:
    """Write ``x`` (one row per text) to ``path`` in the format of its suffix."""
    p = check_out_path(path)
    x = np.ascontiguousarray(x, dtype=np.float32)
    suffix = p.suffix.lower()
    if suffix == ".npy":
        with open(p, "wb") as fh:  # a file object: numpy.save appends nothing to its name
            np.save(fh, x)
    elif suffix == ".parquet":
        _write_parquet(p, x, texts, view, pooling, model)
    else:
        _write_h5(p, x, texts, view, pooling, model)
    return p


def _write_parquet(p: Path, x: np.ndarray, texts: Sequence[str], view: str, pooling: str,
                   model: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    col: pa.Array = pa.array(x.reshape(-1), type=pa.float32())
    for size in reversed(x.shape[1:]):  # innermost dimension first
        col = pa.FixedSizeListArray.from_arrays(col, size)
    meta = {"view": view, "pooling": pooling, "model": model, "shape": json.dumps(list(x.shape))}
    table = pa.table({"text": pa.array(list(texts), type=pa.string()), "features": col})
    pq.write_table(table.replace_schema_metadata(meta), p)


def _write_h5(p: Path, x: np.ndarray, texts: Sequence[str], view: str, pooling: str,
              model: str) -> None:
    import h5py

    with h5py.File(p, "w") as f:
        ds = f.create_dataset("features", data=x)
        ds.attrs.update({"view": view, "pooling": pooling, "model": model})
        f.create_dataset("texts", data=list(texts), dtype=h5py.string_dtype("utf-8"))

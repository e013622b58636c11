"""Texts (and labels) from the tables a data scientist already holds.

``table_texts(obj, text_column=, label_column=)`` reads, by column name:

- a pandas ``DataFrame``,
- a pyarrow ``Table``,
- a Hugging Face ``datasets.Dataset`` (in memory),
- a path: a ``.parquet`` file, or a directory written by
  ``Dataset.save_to_disk`` (what ``datasets.load_from_disk`` reads).

It answers the same ``TextTable`` as the file reader (layerbank.app.inputs), so
the client, the CLI and the in-process store treat every input alike: the
text column defaults to ``text`` or ``sentence``, labels are read only when a
label column is named, and empty texts are skipped and counted (by row,
1-based). Errors are ``InputError`` and name the columns present.

pandas, pyarrow and datasets are imported only when such an object or file
is given: ``import layerbank`` and the HTTP layer never load them.

Example::

    table = table_texts(df, text_column="review", label_column="stars")
    table.texts, table.labels
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from layerbank.app.blank import is_blank
from layerbank.app.text_table import InputError, TextTable

__all__ = ["is_table", "is_table_path", "read_table_path", "table_texts"]

_TEXT_GUESSES = ("text", "sentence")


def _kind(obj: Any) -> str | None:
    """'pandas', 'arrow', 'datasets' or 'datasetdict', by the object's class, without importing them."""
    module = type(obj).__module__ or ""
    name = type(obj).__name__
    if module.startswith("pandas") and name == "DataFrame":
        return "pandas"
    if module.startswith("pyarrow") and name == "Table":
        return "arrow"
    if module.startswith("datasets"):
        if name in ("DatasetDict", "IterableDatasetDict"):
            return "datasetdict"
        if name == "Dataset":
            return "datasets"
        if name == "IterableDataset":
            return "iterable"
    return None


def is_table(obj: Any) -> bool:
    """True for the in-memory tables ``table_texts`` reads (a DatasetDict too: it gets a clear error)."""
    return _kind(obj) is not None


def is_table_path(path: str | os.PathLike[str]) -> bool:
    """True for a ``.parquet`` file or a ``save_to_disk`` directory."""
    p = Path(path)
    if p.suffix.lower() == ".parquet":
        return True
    return p.is_dir() and any((p / f).is_file() for f in ("state.json", "dataset_dict.json"))


def _columns(obj: Any, kind: str) -> list[str]:
    if kind == "pandas":
        return [str(c) for c in obj.columns]
    return list(obj.column_names)


def _values(obj: Any, kind: str, column: str) -> list[Any]:
    if kind == "pandas":
        col = next(c for c in obj.columns if str(c) == column)
        # object columns keep Python values; .tolist() turns numpy scalars into int/float/bool
        return obj[col].tolist()
    if kind == "arrow":
        return obj.column(column).to_pylist()
    return list(obj[column])  # a Dataset honours its indices (after select/shuffle/filter)


def _pick(columns: list[str], name: str | None, what: str) -> str | None:
    if name is None:
        if what == "label":
            return None
        guess = next((c for c in _TEXT_GUESSES if c in columns), None)
        if guess is None:
            raise InputError(f"say which column holds the texts (text_column=...): the columns are {columns}")
        return guess
    if name not in columns:
        raise InputError(f"no {what} column {name!r}; the columns are {columns}")
    return name


def table_texts(obj: Any, *, text_column: str | None = None,
                label_column: str | None = None) -> TextTable:
    """The texts (and labels, when ``label_column`` is named) of a DataFrame, an Arrow
    table, a ``datasets.Dataset`` or a table path, in row order."""
    if isinstance(obj, (str, os.PathLike)):
        return read_table_path(obj, text_column=text_column, label_column=label_column)
    kind = _kind(obj)
    if kind == "datasetdict":
        raise InputError(f"a DatasetDict holds several splits {list(obj)}; give one of them, "
                         f"e.g. ds[{next(iter(obj), 'train')!r}]")
    if kind == "iterable":
        raise InputError("an IterableDataset streams without an end; materialise the rows first "
                         "(datasets.Dataset.from_generator, or .take(n) then list)")
    if kind is None:
        raise InputError(f"cannot read texts from a {type(obj).__name__}; give a list of strings, a "
                         "pandas DataFrame, a pyarrow Table, a datasets.Dataset or a .parquet path")
    columns = _columns(obj, kind)
    tcol = _pick(columns, text_column, "text")
    lcol = _pick(columns, label_column, "label")
    assert tcol is not None
    texts = _values(obj, kind, tcol)
    labels = _values(obj, kind, lcol) if lcol is not None else None
    kept: list[int] = []
    skipped: list[int] = []
    for row, text in enumerate(texts, start=1):
        if text is None or (isinstance(text, float) and text != text):  # None, or pandas' NaN
            raise InputError(f"row {row}: column {tcol!r} has no value")
        if not isinstance(text, str):
            raise InputError(f"row {row}: column {tcol!r} holds {text!r} ({type(text).__name__}), "
                             "not a text")
        (skipped if is_blank(text) else kept).append(row)  # zero-width only is blank too
    if not kept:
        raise InputError(f"no non-empty texts in column {tcol!r}")
    return TextTable([texts[r - 1] for r in kept],
                     None if labels is None else [labels[r - 1] for r in kept],
                     kept, skipped, columns)


def read_table_path(path: str | os.PathLike[str], *, text_column: str | None = None,
                    label_column: str | None = None) -> TextTable:
    """A ``.parquet`` file (via pyarrow) or a ``save_to_disk`` directory (via datasets)."""
    p = Path(path)
    if p.is_dir():
        if (p / "dataset_dict.json").is_file():
            splits = sorted(d.name for d in p.iterdir() if d.is_dir())
            raise InputError(f"{p} holds several splits {splits}; give one of them, e.g. {p / splits[0]}"
                             if splits else f"{p} holds a DatasetDict with no splits")
        if not (p / "state.json").is_file():
            raise InputError(f"{p} is a directory, not a file nor a dataset saved with save_to_disk")
        import datasets

        try:  # a missing or garbage .arrow, a garbage state.json: one line, not a traceback
            obj: Any = datasets.load_from_disk(os.fspath(p))
        except Exception as e:  # noqa: BLE001  (datasets, pyarrow, json and OS errors alike)
            why = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise InputError(f"{p} is not a readable save_to_disk dataset ({type(e).__name__}: {why}); "
                             "save it again") from None
    elif p.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        if not p.is_file():
            raise InputError(f"no such file: {p}")
        try:
            obj = pq.read_table(p)
        except Exception as e:  # pyarrow raises ArrowInvalid (a ValueError) and OSError subclasses
            raise InputError(f"{p} is not a readable Parquet file: {e}") from None
    else:
        raise InputError(f"{p}: not a .parquet file or a save_to_disk directory")
    try:
        return table_texts(obj, text_column=text_column, label_column=label_column)
    except InputError as e:
        raise InputError(f"{p}: {e}") from None

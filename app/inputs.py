"""Reading texts (and labels) from the files users have: .txt, .jsonl, .csv, .tsv
(and, through layerbank.app.tables, .parquet and ``save_to_disk`` directories).

- ``.txt``: one text per line.
- ``.jsonl``: one JSON object per line; ``--text-column`` names the field.
- ``.csv``: RFC 4180 with a header row.
- ``.tsv``: a header row, fields split on tabs, no quoting (as GLUE and the
  files in shared/data are published: quotes are part of the text).
  A TSV without a header (AG News) is read with ``--no-header``; columns are
  then named ``0``, ``1``, ...

Empty or whitespace-only texts are skipped, counted and reported by line, not
encoded. A file that is not UTF-8 is an error naming the line.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from layerbank.app.blank import is_blank
from layerbank.app.text_table import InputError, TextTable  # shared with layerbank.app.tables

__all__ = ["InputError", "TextTable", "read_texts", "parse_texts", "FORMATS"]

FORMATS = ("txt", "jsonl", "csv", "tsv")


def _decode_lines(data: bytes) -> list[str]:
    lines = data.split(b"\n")
    out = []
    for i, raw in enumerate(lines, start=1):
        try:
            out.append(raw.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as e:
            raise InputError(f"line {i} is not valid UTF-8 (byte {e.start + 1}): "
                             "convert the file to UTF-8") from None
    if out and out[-1] == "":
        out.pop()
    if out and out[0].startswith("\ufeff"):
        out[0] = out[0][1:]
    return out


def _column(columns: list[str], name: str | None, what: str, default_first: bool) -> int | None:
    if name is None:
        if default_first:
            for guess in ("text", "sentence", "0"):
                if guess in columns:
                    return columns.index(guess)
            raise InputError(f"say which column holds the {what}: --text-column one of {columns}")
        return None
    if name not in columns:
        raise InputError(f"no {what} column {name!r}; the columns are {columns}")
    return columns.index(name)


def _separator_hint(columns: list[str], fmt: str) -> str:
    """When one header cell holds the other separator, the file was named for the wrong format."""
    if len(columns) != 1:
        return ""
    if fmt == "tsv" and "," in columns[0]:
        return "; this looks comma-separated: use --format csv or rename the file to .csv"
    if fmt == "csv" and "\t" in columns[0]:
        return "; this looks tab-separated: use --format tsv or rename the file to .tsv"
    return ""


def parse_texts(data: bytes, fmt: str, *, text_column: str | None = None,
                label_column: str | None = None, header: bool = True) -> TextTable:
    """Parse an uploaded or read file's bytes in format ``fmt``."""
    if fmt not in FORMATS:
        raise InputError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    lines = _decode_lines(data)
    rows: list[tuple[int, str, Any]] = []
    columns: list[str] = []
    if fmt == "txt":
        if label_column is not None:
            raise InputError("a .txt file has no columns; use .tsv, .csv or .jsonl for labels")
        rows = [(i, line, None) for i, line in enumerate(lines, start=1)]
    elif fmt == "jsonl":
        for i, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"line {i} is not valid JSON: {e.msg}") from None
            except RecursionError:
                raise InputError(f"line {i} is not valid JSON: it is nested too deeply") from None
            except ValueError as e:  # e.g. an integer of more than 4,300 digits
                raise InputError(f"line {i} cannot be read: {str(e).split(':')[0]}") from None
            if not isinstance(obj, dict):
                raise InputError(f"line {i}: expected a JSON object, got {type(obj).__name__}")
            if not columns:
                columns = list(obj)
            tcol = text_column or next((c for c in ("text", "sentence") if c in obj), None)
            if tcol is None or tcol not in obj:
                raise InputError(f"line {i}: no text field {tcol or 'text'!r}; fields are {list(obj)}")
            if label_column is not None and label_column not in obj:
                raise InputError(f"line {i}: no label field {label_column!r}; fields are {list(obj)}")
            text = obj[tcol]
            if not isinstance(text, str):
                raise InputError(f"line {i}: field {tcol!r} must be a string")
            rows.append((i, text, obj.get(label_column) if label_column else None))
    else:
        if fmt == "csv":
            # parse the decoded text itself, not the split lines: a quoted field may
            # hold "\r\n", which must reach the key unchanged (texts are hashed as given)
            reader = csv.reader(io.StringIO(data.decode("utf-8").removeprefix("\ufeff"), newline=""))
            table: list[tuple[list[str], int]] = []
            start = 1  # a record spanning lines is reported by its first line
            try:
                for r in reader:
                    table.append((r, start))
                    start = reader.line_num + 1
            except csv.Error as e:  # e.g. a field past csv's size limit
                raise InputError(f"line {start}: {e}") from None
        else:
            table = [(line.split("\t"), i) for i, line in enumerate(lines, start=1)]
        if not table:
            raise InputError("the file is empty")
        if header:
            columns = table[0][0]
            table = table[1:]
        else:
            columns = [str(i) for i in range(len(table[0][0]))]
        try:
            tc = _column(columns, text_column, "text", default_first=True)
            lc = _column(columns, label_column, "label", default_first=False)
        except InputError as e:
            raise InputError(f"{e}{_separator_hint(columns, fmt)}") from None
        assert tc is not None
        for cells, i in table:
            if len(cells) <= 1 and not "".join(cells).strip():  # csv gives [] for a blank line
                rows.append((i, "", None))
                continue
            if len(cells) != len(columns):
                raise InputError(f"line {i} has {len(cells)} fields, the header has {len(columns)}")
            rows.append((i, cells[tc], cells[lc] if lc is not None else None))
    kept = [(i, t, lab) for i, t, lab in rows if not is_blank(t)]  # zero-width only is blank too
    skipped = [i for i, t, _ in rows if is_blank(t)]
    if not kept:
        raise InputError("no non-empty texts in the input")
    labels = [lab for _, _, lab in kept] if label_column is not None else None
    return TextTable([t for _, t, _ in kept], labels, [i for i, _, _ in kept], skipped, columns)


def read_texts(path: str | Path, *, text_column: str | None = None,
               label_column: str | None = None, header: bool = True,
               fmt: str | None = None) -> TextTable:
    """Read a file of texts; the format comes from the suffix unless given.
    A ``.parquet`` file or a ``datasets`` ``save_to_disk`` directory is read by
    column name through layerbank.app.tables (pyarrow / datasets, loaded only then)."""
    p = Path(path)
    from layerbank.app.tables import is_table_path, read_table_path

    if fmt == "parquet" or (fmt is None and (p.is_dir() or is_table_path(p))):
        return read_table_path(p, text_column=text_column, label_column=label_column)
    fmt = fmt or p.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise InputError(f"{p}: cannot tell the format from {p.suffix!r}; use one of "
                         f"{', '.join('.' + f for f in FORMATS)}, .parquet or --format")
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"no such file: {p}") from None
    except IsADirectoryError:
        raise InputError(f"{p} is a directory, not a file") from None
    try:
        return parse_texts(data, fmt, text_column=text_column, label_column=label_column,
                           header=header)
    except InputError as e:
        raise InputError(f"{p}: {e}") from None

"""What every text reader answers: a ``TextTable`` (texts, labels, where each came
from), or an ``InputError`` that says where the input went wrong.

Its own module so that the file reader (layerbank.app.inputs) and the table
reader (layerbank.app.tables) share the types without importing each other:
inputs hands .parquet files to tables, and tables answers inputs' types.

Example::

    TextTable(texts=["a", "b"], labels=None, lines=[1, 2])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["InputError", "TextTable"]


class InputError(ValueError):
    """A file or upload that cannot be read as texts; the message says where."""


@dataclass
class TextTable:
    texts: list[str]
    labels: list[Any] | None
    lines: list[int]  # 1-based line of each kept text, for messages
    skipped_empty: list[int] = field(default_factory=list)  # lines of skipped texts
    columns: list[str] = field(default_factory=list)

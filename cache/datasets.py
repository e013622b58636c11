"""Datasets: named lists of texts (with labels, or words and tags), kept in
the catalog so that jobs, probes and heads can refer to them by id.

A dataset and all its items are inserted in one transaction: a crash or a bad
upload never leaves half a dataset registered. Deleting a dataset deletes its
items, not the cached features, which other datasets may share.

Labels keep their type: the ``label`` column is text, and the dataset's
``label_type`` (in its meta: ``int``, ``float``, ``bool`` or ``str``, the one
type every label shares; mixed labels are ``str``) turns each back into what
was uploaded, so ints go in and ints come out of probes, heads and predict.
A ``None`` label is no label: stored as NULL, never a class. A dataset
written before ``label_type`` existed reads as ``str``, as it always did.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .catalog import Catalog

__all__ = ["Dataset", "DatasetItems", "DatasetStore", "decode_label", "label_type"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS datasets (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, task TEXT NOT NULL, n_items INTEGER NOT NULL,
    model TEXT NOT NULL, config TEXT NOT NULL, job_id TEXT, meta TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS dataset_items (
    dataset_id TEXT NOT NULL REFERENCES datasets(id) ON DELETE CASCADE, idx INTEGER NOT NULL,
    text TEXT NOT NULL, label TEXT, words TEXT, tags TEXT, PRIMARY KEY (dataset_id, idx));
"""


@dataclass
class Dataset:
    id: str
    name: str
    task: str  # "sentence" | "token"
    n_items: int
    model: str  # model name or path used to extract it
    config: str  # ExtractionConfig.canonical()
    job_id: str | None
    meta: dict[str, Any]
    created: float

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "task": self.task, "n_items": self.n_items,
                "model": self.model, "job_id": self.job_id, "created": self.created, **self.meta}


@dataclass
class DatasetItems:
    texts: list[str]
    labels: list[Any]  # as uploaded: int, float, bool or str (the dataset's label_type); None: none
    words: list[list[str]] | None
    tags: list[list[str]] | None


def label_type(labels: Sequence[Any]) -> str:
    """The one type of the labels that are not None: bool, int, float (ints and floats
    together read as floats) or str; anything mixed, or of another type, is str."""
    kinds = {type(x) for x in labels if x is not None}
    if kinds == {bool}:
        return "bool"
    if kinds == {int}:
        return "int"
    if kinds and kinds <= {int, float}:
        return "float"
    return "str"


def _encode(label: Any, kind: str) -> str:
    return repr(float(label)) if kind == "float" else str(label)


def decode_label(text: str | None, kind: str) -> Any:
    """A stored label as the type it was uploaded with (None stays None)."""
    if text is None or kind == "str":
        return text
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "bool":
        return text == "True"
    raise ValueError(f"unknown label type {kind!r}")


def _ds(r: Sequence[Any]) -> Dataset:
    return Dataset(r[0], r[1], r[2], r[3], r[4], r[5], r[6], json.loads(r[7]), r[8])


class DatasetStore:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        catalog.conn().executescript(_SCHEMA)

    def create(self, name: str, texts: Sequence[str], *, labels: Sequence[Any] | None = None,
               words: Sequence[Sequence[str]] | None = None, tags: Sequence[Sequence[str]] | None = None,
               model: str, config: str, job_id: str | None = None,
               meta: dict[str, Any] | None = None, dataset_id: str | None = None) -> Dataset:
        """Insert a dataset and all its items atomically."""
        ds_id = dataset_id or "ds_" + uuid.uuid4().hex[:12]
        task = "token" if words is not None else "sentence"
        meta = dict(meta or {})
        kind = "str"
        if labels is not None and any(x is not None for x in labels):
            kind = meta["label_type"] = label_type(labels)
            # the classes, as uploaded and in their own order (1 < 2 < 10 for ints)
            meta["labels"] = sorted({decode_label(_encode(x, kind), kind) for x in labels if x is not None})
        elif labels is not None:
            meta["labels"] = []
        rows = []
        for i, t in enumerate(texts):
            lab = None if labels is None or labels[i] is None else _encode(labels[i], kind)
            w = None if words is None else json.dumps(list(words[i]))
            tg = None if tags is None else json.dumps(list(tags[i]))
            rows.append((ds_id, i, t, lab, w, tg))
        with self.catalog.tx() as db:
            db.execute("INSERT INTO datasets VALUES (?,?,?,?,?,?,?,?,?)",
                       (ds_id, name, task, len(rows), model, config, job_id, json.dumps(meta), time.time()))
            db.executemany("INSERT INTO dataset_items VALUES (?,?,?,?,?,?)", rows)
        got = self.get(ds_id)
        assert got is not None
        return got

    def get(self, dataset_id: str) -> Dataset | None:
        r = self.catalog.conn().execute("SELECT * FROM datasets WHERE id=?", (dataset_id,)).fetchone()
        return None if r is None else _ds(r)

    def list(self) -> list[Dataset]:
        return [_ds(r) for r in self.catalog.conn().execute("SELECT * FROM datasets ORDER BY created")]

    def items(self, dataset_id: str) -> DatasetItems:
        rows = self.catalog.conn().execute(
            "SELECT text, label, words, tags FROM dataset_items WHERE dataset_id=? ORDER BY idx",
            (dataset_id,)).fetchall()
        token = bool(rows) and rows[0][2] is not None
        ds = self.get(dataset_id)
        kind = str(ds.meta.get("label_type", "str")) if ds is not None else "str"
        return DatasetItems([r[0] for r in rows], [decode_label(r[1], kind) for r in rows],
                            [json.loads(r[2]) for r in rows] if token else None,
                            [json.loads(r[3]) for r in rows] if token and rows[0][3] is not None else None)

    def delete(self, dataset_id: str) -> bool:
        with self.catalog.tx() as db:
            db.execute("DELETE FROM dataset_items WHERE dataset_id=?", (dataset_id,))
            cur = db.execute("DELETE FROM datasets WHERE id=?", (dataset_id,))
            return cur.rowcount == 1

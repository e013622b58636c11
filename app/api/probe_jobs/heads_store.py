"""Saved heads: one row per head in the catalog's ``heads`` table, its files
under ``<data_dir>/heads/<id>/``.

A head is registered when it is asked for (``POST /v1/heads``), before its
fitting job has run, so that its id can be answered at once; ``n_bytes`` is
set when the job has written the files. The head's state is its job's
(queued, running, succeeded, failed, cancelled).

Ids are made here (``hd_`` + 12 hex digits) and are the only thing a path is
built from: names and dataset ids given by users are data, never paths.

Files (layerbank.app.probes.head_files): ``arrays.npz`` (numpy arrays, no pickle) and
``head.json`` (head name, parameters, fitted scalars, metadata). A fitting
job writes them into a temporary sibling directory and renames it into
place, so a head directory is either complete or absent, and a re-run of
the job (after a crash) replaces it whole.

Example::

    heads = HeadStore(catalog, data_dir)
    rec = heads.create(name="sst2", job_id=job_id, dataset_id="ds_1", head="logistic",
                       view="layer:4", pooling="mean", fingerprint=fp, config=cfg, model="MiniLM")
    heads.publish(rec.id, tmp_dir)            # in the job, once the files are written
    heads.get(rec.id).n_bytes
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerbank.cache.catalog import Catalog

__all__ = ["HEAD_FILES", "HeadRecord", "HeadStore"]

HEAD_FILES = ("arrays.npz", "head.json")
_ID = re.compile(r"^hd_[0-9a-f]{12}$")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS heads (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, job_id TEXT NOT NULL, dataset_id TEXT NOT NULL,
    head TEXT NOT NULL, view TEXT NOT NULL, pooling TEXT NOT NULL, fingerprint TEXT NOT NULL,
    config TEXT NOT NULL, model TEXT NOT NULL, n_bytes INTEGER, meta TEXT NOT NULL,
    created REAL NOT NULL);
"""
_COLS = "id, name, job_id, dataset_id, head, view, pooling, fingerprint, config, model, n_bytes, meta, created"


@dataclass
class HeadRecord:
    id: str
    name: str
    job_id: str
    dataset_id: str
    head: str  # logistic, ridge, linear_svm, mlp, knn, scalar_mix
    view: str  # a layerbank.cache.views spec, or "scalar_mix"
    pooling: str
    fingerprint: str  # the model the features came from
    config: str  # ExtractionConfig.canonical() of those features
    model: str  # the model's name, for people
    n_bytes: int | None  # arrays.npz + head.json; None until the job wrote them
    meta: dict[str, Any]  # classes, class_counts, n_examples, seed, ... (set by the job)
    created: float


def _record(r: Sequence[Any]) -> HeadRecord:
    return HeadRecord(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10],
                      json.loads(r[11]), r[12])


class HeadStore:
    """The ``heads`` table and the ``heads/`` directory of one data dir."""

    def __init__(self, catalog: Catalog, data_dir: str | os.PathLike[str]) -> None:
        self.catalog = catalog
        self.root = Path(data_dir) / "heads"
        self.root.mkdir(parents=True, exist_ok=True)
        catalog.conn().executescript(_SCHEMA)

    @staticmethod
    def new_id() -> str:
        return "hd_" + uuid.uuid4().hex[:12]

    def directory(self, head_id: str) -> Path:
        """Where a head's files live; refuses anything but an id made by ``new_id``."""
        if not _ID.fullmatch(head_id):  # not match: its "$" also matches before a final newline
            raise ValueError(f"not a head id: {head_id!r}")
        return self.root / head_id

    def create(self, *, name: str, job_id: str, dataset_id: str, head: str, view: str, pooling: str,
               fingerprint: str, config: str, model: str, meta: dict[str, Any] | None = None,
               head_id: str | None = None) -> HeadRecord:
        head_id = head_id or self.new_id()
        self.directory(head_id)  # checks the id
        with self.catalog.tx() as db:
            db.execute(f"INSERT INTO heads ({_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                       (head_id, name, job_id, dataset_id, head, view, pooling, fingerprint, config,
                        model, None, json.dumps(meta or {}), time.time()))
        got = self.get(head_id)
        assert got is not None
        return got

    def get(self, head_id: str) -> HeadRecord | None:
        r = self.catalog.conn().execute(f"SELECT {_COLS} FROM heads WHERE id=?", (head_id,)).fetchone()
        return None if r is None else _record(r)

    def list(self) -> list[HeadRecord]:
        rows = self.catalog.conn().execute(f"SELECT {_COLS} FROM heads ORDER BY created")
        return [_record(r) for r in rows]

    def temp_directory(self, head_id: str) -> Path:
        """A fresh directory for a job to write a head into before ``publish``."""
        tmp = self.root / f".{head_id}.tmp-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.directory(head_id)  # checks the id
        tmp.mkdir(parents=True)
        return tmp

    def publish(self, head_id: str, written: Path, meta: dict[str, Any]) -> HeadRecord:
        """Move a complete head directory into place and record its size and ``meta``.

        Returns the updated record; raises LookupError if the head was deleted
        while it was being fitted (its files are then removed).
        """
        final = self.directory(head_id)
        n_bytes = sum((written / f).stat().st_size for f in HEAD_FILES)
        if self.get(head_id) is None:
            shutil.rmtree(written, ignore_errors=True)
            raise LookupError(f"head {head_id} was deleted while it was being fitted")
        if final.exists():  # a re-run of the job: the new files replace the old ones whole
            shutil.rmtree(final)
        os.replace(written, final)
        with self.catalog.tx() as db:
            db.execute("UPDATE heads SET n_bytes=?, meta=? WHERE id=?", (n_bytes, json.dumps(meta), head_id))
        got = self.get(head_id)
        if got is None:  # deleted between the check and the update
            shutil.rmtree(final, ignore_errors=True)
            raise LookupError(f"head {head_id} was deleted while it was being fitted")
        return got

    def file_sizes(self, head_id: str) -> dict[str, int]:
        """Bytes of each file on disk now (empty while the head is being fitted)."""
        d = self.directory(head_id)
        return {f: (d / f).stat().st_size for f in HEAD_FILES if (d / f).exists()}

    def delete(self, head_id: str) -> bool:
        with self.catalog.tx() as db:
            gone = db.execute("DELETE FROM heads WHERE id=?", (head_id,)).rowcount == 1
        if gone:
            shutil.rmtree(self.directory(head_id), ignore_errors=True)
        return gone

    def clean(self) -> int:
        """Remove temp directories left by a crash (call when no job is running)."""
        n = 0
        for p in self.root.glob(".hd_*.tmp-*"):
            shutil.rmtree(p, ignore_errors=True)
            n += 1
        return n

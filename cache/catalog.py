"""The catalog: an index from keys to (shard, row), and the tables that other
parts of layerbank keep beside it (models, datasets, jobs, heads).

Two backends with one schema and the same statements: SQLite in WAL mode
(the embedded default, ``data_dir/catalog.sqlite``) and PostgreSQL for
several API replicas (``LAYERBANK_CATALOG_URL=postgresql://...``,
cache/postgres.py translates the few dialect differences).

Only committed shards are listed. A shard and all its rows are registered in
one transaction, after the file is durable under its final name, so a reader
that finds a key always finds its data.

Example::

    cat = Catalog("data/catalog.sqlite")
    cat.commit_shard("job1-00000.h5", model, config, keys, n_tokens, truncated, has_tokens=False, n_bytes=123)
    cat.lookup(keys)  # {key: Entry(shard="job1-00000.h5", row=0, ...)}
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .poolings import LEGACY_POOLINGS
from .postgres import INDEX_WRITER_LOCK_SQL, PostgresCatalogDb, is_postgres_url

if TYPE_CHECKING:  # for annotations only: the catalog itself needs no numpy
    import numpy as np

__all__ = ["CATALOG_URL_ENV", "Catalog", "Entry", "catalog_url", "redacted"]

CATALOG_URL_ENV = "LAYERBANK_CATALOG_URL"


def catalog_url(url: str | None = None) -> str | None:
    """The PostgreSQL catalog's URL if one is configured (``url``; when None, the
    setting ``catalog_url``, read by layerbank/settings.py from ``LAYERBANK_CATALOG_URL``,
    which ``serve`` passes on to its worker and probe processes); None: the data
    directory's own SQLite catalog (``url=""`` asks for it whatever the setting says)."""
    if url is None:
        from layerbank.settings import environment_value  # the one reader of the environment

        url = environment_value("catalog_url")
    url = url or None
    if url is not None and not is_postgres_url(url):
        raise ValueError(f"catalog URL {url!r}: only postgresql://... is supported "
                         "(leave it unset for the data directory's SQLite catalog)")
    return url

_SCHEMA = """
CREATE TABLE IF NOT EXISTS shards (
    name TEXT PRIMARY KEY, model TEXT NOT NULL, config TEXT NOT NULL,
    n_rows INTEGER NOT NULL, n_bytes INTEGER NOT NULL, has_tokens INTEGER NOT NULL,
    created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY, shard TEXT NOT NULL REFERENCES shards(name), row INTEGER NOT NULL,
    n_tokens INTEGER NOT NULL, truncated INTEGER NOT NULL, has_tokens INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS entries_shard ON entries(shard);
CREATE TABLE IF NOT EXISTS models (
    fingerprint TEXT PRIMARY KEY, name TEXT NOT NULL, info TEXT NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
# versioned changes of the shards and entries tables (cache/migrations.py); append only
_SHARD_STEPS = [
    # the poolings a shard holds, comma-separated; NULL in a catalog made before this
    # column until FeatureStore fills it in from the shard file
    "ALTER TABLE shards ADD COLUMN poolings TEXT",
]

# forget shard ? if no key points at it (an index search on entries(shard), not a scan)
_DROP_IF_EMPTY = ("DELETE FROM shards WHERE name = ? AND NOT EXISTS "
                  "(SELECT 1 FROM entries WHERE entries.shard = shards.name)")


@dataclass(frozen=True)
class Entry:
    """Where one key's row lives."""

    key: str
    shard: str
    row: int
    n_tokens: int
    truncated: bool
    has_tokens: bool
    poolings: tuple[str, ...] = LEGACY_POOLINGS  # what its shard holds


def redacted(url: str) -> str:
    """The URL as logs and messages show it: without its password."""
    return re.sub(r"(://[^/:@]*):[^/@]*@", r"\1:***@", url)


class Catalog:
    """Thread-safe access to the catalog: SQLite at ``path`` (one connection per
    thread), or the PostgreSQL database at ``url`` (a connection pool); ``url``
    None: as configured (``catalog_url``), "": SQLite whatever is configured."""

    def __init__(self, path: str | Path, url: str | None = None) -> None:
        self.path = str(path)
        self.url = url = catalog_url(url)
        self._local = threading.local()
        self._pg = PostgresCatalogDb(url) if url is not None else None
        self.dialect = "sqlite" if self._pg is None else "postgres"
        self.conn().executescript(_SCHEMA)
        from .migrations import migrate  # it imports Catalog

        migrate(self, "shards", _SHARD_STEPS)

    # -- connections ------------------------------------------------------
    def conn(self) -> sqlite3.Connection:
        if self._pg is not None:
            return self._pg.session()  # type: ignore[return-value]  # the same methods
        db = getattr(self._local, "db", None)
        if db is None:
            # isolation_level=None: we open transactions ourselves (BEGIN IMMEDIATE),
            # so a writer never upgrades a read lock midway and deadlocks.
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None,
                                 check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable at checkpoint
            db.execute("PRAGMA busy_timeout=30000")
            db.execute("PRAGMA foreign_keys=ON")
            self._local.db = db
        return db

    def tx(self) -> _Tx:
        if self._pg is not None:
            return self._pg.tx()  # type: ignore[return-value]  # same interface as _Tx (duck-typed)
        return _Tx(self.conn())

    def close(self) -> None:
        if self._pg is not None:
            self._pg.close()
            return
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    # -- shards and entries ----------------------------------------------
    def commit_shard(self, name: str, model: str, config: str, keys: Sequence[str],
                     n_tokens: Sequence[int] | np.ndarray, truncated: Sequence[bool] | np.ndarray, *,
                     has_tokens: bool, n_bytes: int, replaces: Sequence[str] = (),
                     poolings: Sequence[str] | None = None) -> None:
        """Register a durable shard and point its keys at it, atomically.

        ``replaces`` names shards whose rows this one takes over (compaction):
        they are forgotten in the same transaction once no key points at them.

        Re-committing the same name (a re-run of the same job part) replaces
        the earlier registration. A key already stored with token-level states
        is not repointed to a shard without them, unless this shard holds a
        pooling the old one lacks (then the key was re-encoded for that pooling,
        docs/decisions.md). ``poolings``: what the shard holds (None: unknown,
        read as the three every shard held before shards recorded them).
        """
        rows = [(k, name, i, int(t), int(bool(tr)), int(has_tokens))
                for i, (k, t, tr) in enumerate(zip(keys, n_tokens, truncated))]
        held = None if poolings is None else ",".join(poolings)
        with self.tx() as db:
            self._one_index_writer(db)
            db.execute("DELETE FROM entries WHERE shard = ?", (name,))
            db.execute("DELETE FROM shards WHERE name = ?", (name,))
            db.execute("INSERT INTO shards (name, model, config, n_rows, n_bytes, has_tokens, created, "
                       "poolings) VALUES (?,?,?,?,?,?,?,?)",
                       (name, model, config, len(rows), int(n_bytes), int(has_tokens), time.time(), held))
            gaining = [] if has_tokens or poolings is None else self._gaining(db, rows, set(poolings))
            db.executemany(
                "INSERT INTO entries VALUES (?,?,?,?,?,?) ON CONFLICT(key) DO UPDATE SET "
                "shard=excluded.shard, row=excluded.row, n_tokens=excluded.n_tokens, "
                "truncated=excluded.truncated, has_tokens=excluded.has_tokens "
                "WHERE excluded.has_tokens >= entries.has_tokens", rows)
            db.executemany("UPDATE entries SET shard=?, row=?, n_tokens=?, truncated=?, has_tokens=? "
                           "WHERE key=?", [(r[1], r[2], r[3], r[4], r[5], r[0]) for r in gaining])
            # a shard whose every key moved elsewhere holds nothing readable. NOT EXISTS, not
            # NOT IN (SELECT DISTINCT shard ...): SQLite lists that subquery by scanning the whole
            # entries index, once per statement, so every commit cost O(stored keys) (bench/scale.py)
            for gone in (name, *replaces):
                db.execute(_DROP_IF_EMPTY, (gone,))

    def _one_index_writer(self, db: sqlite3.Connection) -> None:
        """On PostgreSQL, shard commits and drops take turns, as SQLite's one writer does:
        two replicas committing shards that share keys (the same text encoded by both)
        would otherwise lock the same entries rows in different orders and deadlock.
        A commit takes milliseconds; the encoding before it runs in parallel."""
        if self._pg is not None:
            db.execute(INDEX_WRITER_LOCK_SQL)

    @staticmethod
    def _gaining(db: sqlite3.Connection, rows: list[tuple], new: set[str]) -> list[tuple]:
        """Rows whose key now sits with token states in a shard that lacks one of ``new``."""
        old: dict[str, str | None] = {}
        for i in range(0, len(rows), 900):  # SQLite host-parameter limit
            chunk = [r[0] for r in rows[i : i + 900]]
            old.update(db.execute("SELECT e.key, s.poolings FROM entries e JOIN shards s ON s.name = e.shard "
                                  f"WHERE e.has_tokens = 1 AND e.key IN ({','.join('?' * len(chunk))})",
                                  chunk).fetchall())
        return [r for r in rows if r[0] in old and not new <= set(_held(old[r[0]]))]

    def lookup(self, keys: Iterable[str], need_tokens: bool = False,
               poolings: Iterable[str] = ()) -> dict[str, Entry]:
        """Entries for the keys that are stored (with token states if asked, and
        in a shard that holds every one of ``poolings``: a pooling a shard lacks is a miss)."""
        need = set(poolings)
        seen: dict[str | None, tuple[tuple[str, ...], bool]] = {}
        out: dict[str, Entry] = {}
        keys = list(dict.fromkeys(keys))
        db = self.conn()
        for i in range(0, len(keys), 900):  # SQLite host-parameter limit
            chunk = keys[i : i + 900]
            q = ("SELECT e.key, e.shard, e.row, e.n_tokens, e.truncated, e.has_tokens, s.poolings "
                 "FROM entries e JOIN shards s ON s.name = e.shard "
                 f"WHERE e.key IN ({','.join('?' * len(chunk))})")
            for k, s, r, n, t, h, p in db.execute(q, chunk):
                if p not in seen:  # a few shards serve many keys: parse each one's list once
                    seen[p] = (_held(p), need <= set(_held(p)))
                held, has_all = seen[p]
                if (need_tokens and not h) or not has_all:
                    continue
                out[k] = Entry(k, s, r, n, bool(t), bool(h), held)
        return out

    def shard_names(self) -> set[str]:
        return {r[0] for r in self.conn().execute("SELECT name FROM shards")}

    def shard_info(self, name: str) -> dict | None:
        r = self.conn().execute("SELECT name, model, config, n_rows, n_bytes, has_tokens, poolings "
                                "FROM shards WHERE name = ?", (name,)).fetchone()
        if r is None:
            return None
        info = dict(zip(("name", "model", "config", "n_rows", "n_bytes", "has_tokens"), r))
        return {**info, "poolings": _held(r[6])}

    def shards_without_poolings(self) -> list[str]:
        """Shards registered before the catalog recorded poolings (FeatureStore fills them in)."""
        return [r[0] for r in self.conn().execute("SELECT name FROM shards WHERE poolings IS NULL")]

    def set_poolings(self, name: str, poolings: Sequence[str]) -> None:
        with self.tx() as db:
            db.execute("UPDATE shards SET poolings = ? WHERE name = ?", (",".join(poolings), name))

    def small_shards(self, max_rows: int) -> list[dict]:
        """Committed pooled-only shards under ``max_rows`` rows (compaction input)."""
        rows = self.conn().execute(
            "SELECT name, model, config, n_rows, poolings FROM shards WHERE has_tokens = 0 AND n_rows < ? "
            "ORDER BY created", (max_rows,)).fetchall()
        return [{**dict(zip(("name", "model", "config", "n_rows"), r)), "poolings": _held(r[4])}
                for r in rows]

    def live_rows(self, shard: str) -> list[tuple[str, int, int, bool]]:
        """(key, row, n_tokens, truncated) of the keys that still point at ``shard``."""
        return [(k, r, n, bool(t)) for k, r, n, t in self.conn().execute(
            "SELECT key, row, n_tokens, truncated FROM entries WHERE shard = ? ORDER BY row", (shard,))]

    def drop_shard(self, name: str) -> list[str]:
        """Forget a shard (quarantine, compaction); returns the keys it held."""
        with self.tx() as db:
            self._one_index_writer(db)
            keys = [r[0] for r in db.execute("SELECT key FROM entries WHERE shard = ?", (name,))]
            db.execute("DELETE FROM entries WHERE shard = ?", (name,))
            db.execute("DELETE FROM shards WHERE name = ?", (name,))
        return keys

    def stats(self) -> dict[str, int]:
        db = self.conn()
        n_keys = db.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
        n_shards, n_bytes = db.execute("SELECT COUNT(*), COALESCE(SUM(n_bytes),0) FROM shards").fetchone()
        return {"keys": int(n_keys), "shards": int(n_shards), "bytes": int(n_bytes)}  # PostgreSQL's SUM is a Decimal

    # -- models -----------------------------------------------------------
    def register_model(self, fingerprint: str, name: str, info: dict) -> None:
        with self.tx() as db:
            db.execute("INSERT INTO models VALUES (?,?,?,?) ON CONFLICT(fingerprint) DO UPDATE SET "
                       "name=excluded.name, info=excluded.info, updated=excluded.updated",
                       (fingerprint, name, json.dumps(info), time.time()))

    def model_info(self, fingerprint: str) -> dict | None:
        r = self.conn().execute("SELECT info FROM models WHERE fingerprint = ?",
                                (fingerprint,)).fetchone()
        return None if r is None else json.loads(r[0])

    # -- counters (quarantines and the like, visible to every process) ----
    def bump(self, name: str, by: int = 1) -> None:
        with self.tx() as db:
            db.execute("INSERT INTO counters VALUES (?, ?) ON CONFLICT(name) DO UPDATE "
                       "SET value = counters.value + excluded.value", (name, by))

    def counter(self, name: str) -> int:
        r = self.conn().execute("SELECT value FROM counters WHERE name = ?", (name,)).fetchone()
        return 0 if r is None else int(r[0])


def _held(poolings: str | None) -> tuple[str, ...]:
    """A shard's poolings column as names; NULL (not yet read from the file) is the legacy three."""
    return LEGACY_POOLINGS if poolings is None else tuple(p for p in poolings.split(",") if p)


class _Tx:
    """``with catalog.tx() as db:`` — BEGIN IMMEDIATE … COMMIT, ROLLBACK on error.

    Nested in another ``tx()`` of the same thread it becomes a savepoint, so
    that several writes (a dataset and its job) commit together or not at all.
    """

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.savepoint: str | None = None

    def __enter__(self) -> sqlite3.Connection:
        if self.db.in_transaction:
            self.savepoint = f"lb_{id(self):x}"
            self.db.execute(f"SAVEPOINT {self.savepoint}")
        else:
            self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.savepoint is not None:
            if exc_type:
                self.db.execute(f"ROLLBACK TO {self.savepoint}")
            self.db.execute(f"RELEASE {self.savepoint}")
            return
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")

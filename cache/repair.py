"""Catalog integrity: check it, and rebuild it from the shards when it is damaged.

The catalog is an index; the shards are the truth. Every shard carries its
keys, ``n_tokens``, ``truncated``, and as attributes the model fingerprint
and extraction config (cache/shard.py), so the key index (tables ``shards``
and ``entries``) can be rebuilt from the files alone. The other tables
(models, datasets and their items, jobs, heads, counters) exist only in the
catalog: ``repair_catalog`` copies every row of them it can still read into
the new file and says what it could not.

    check_catalog(path)     -> None if sound, else the reason (PRAGMA quick_check)
    repair_catalog(data_dir)-> RepairReport (the damaged file is kept beside it)

Call ``repair_catalog`` only with the data directory locked (no server or
worker running on it): it replaces the catalog file.

A PostgreSQL catalog (replicas) is never rebuilt from a file: PostgreSQL
keeps its own pages sound. What can still go out of step is the key index
against the shard directory (a database restored from an older backup, a
shard directory restored without its catalog): ``reindex_catalog`` makes
the index match the files, with every replica stopped.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .catalog import Catalog
from .datasets import DatasetStore
from .jobs import JobQueue
from .shard import CorruptShardError, StoredShard
from .storage import DEFAULT_STORAGE, ShardStorage, open_storage

__all__ = ["CatalogDamaged", "PostgresDirectory", "RepairReport", "check_catalog",
           "refuse_postgres_directory", "reindex_catalog", "repair_catalog"]

log = logging.getLogger("layerbank.repair")
_INDEX_TABLES = {"shards", "entries"}  # rebuilt from the shard files, never copied
_CHECK_ROWS = 20  # quick_check lists up to this many problems


class CatalogDamaged(RuntimeError):
    """The catalog cannot be used as it is; the message names ``layerbank repair``."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(f"the catalog {os.fspath(path)} is damaged ({reason}); stop the server and run "
                         f"`layerbank repair --data-dir {Path(path).parent}` to rebuild it from the shards")
        self.reason = reason


def check_catalog(path: str | os.PathLike[str]) -> str | None:
    """None when SQLite's ``quick_check`` finds the catalog sound, else the reason.

    quick_check reads every page (table, index and free-list structure, not
    index contents), so it costs about one read of the file. A missing file
    is sound (a new store).
    """
    p = Path(path)
    if not p.exists():
        return None
    try:
        db = sqlite3.connect(f"file:{p}?mode=ro", uri=True, timeout=30.0)
        try:
            rows = [r[0] for r in db.execute(f"PRAGMA quick_check({_CHECK_ROWS})")]
        finally:
            db.close()
    except sqlite3.DatabaseError as e:
        return str(e)
    return None if rows == ["ok"] else "; ".join(rows[:3])


@dataclass
class RepairReport:
    """What a repair did: the shards and keys re-indexed, the tables kept, what was lost."""

    damaged_file: str | None = None  # where the old catalog was moved (None: there was none)
    shards: int = 0
    keys: int = 0
    quarantined: list[str] = field(default_factory=list)
    kept: dict[str, int] = field(default_factory=dict)  # table -> rows copied
    lost: dict[str, str] = field(default_factory=dict)  # table -> why (rows not copied)

    def lines(self) -> list[str]:
        out = [f"re-indexed {self.keys:,} keys from {self.shards} shards"]
        if self.damaged_file:
            out.append(f"the damaged catalog is kept as {self.damaged_file}")
        for name in self.quarantined:
            out.append(f"shard {name} could not be read and was moved to quarantine/ (its texts will "
                       "be encoded again when asked for)")
        for table, n in sorted(self.kept.items()):
            out.append(f"kept {n:,} rows of {table}")
        for table, why in sorted(self.lost.items()):
            out.append(f"LOST {table}: {why}")
        return out


def _salvage(path: Path, report: RepairReport) -> tuple[dict[str, str], dict[str, list[tuple]]]:
    """The CREATE statements and the readable rows of every table but the key index."""
    schema: dict[str, str] = {}
    rows: dict[str, list[tuple]] = {}
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.DatabaseError as e:
        report.lost["every table but the key index"] = f"the file cannot be opened: {e}"
        return schema, rows
    try:
        try:
            schema = {n: s for n, s in db.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL")}
        except sqlite3.DatabaseError as e:
            report.lost["every table but the key index"] = f"the schema cannot be read: {e}"
            return {}, rows
        for table in schema:
            if table in _INDEX_TABLES or table.startswith("sqlite_"):
                continue
            got: list[tuple] = []
            try:
                for r in db.execute(f'SELECT * FROM "{table}"'):  # row by row: keep what precedes damage
                    got.append(tuple(r))
            except sqlite3.DatabaseError as e:
                report.lost[table] = f"rows after the first {len(got):,} could not be read ({e})"
            rows[table] = got
    finally:
        db.close()
    return schema, rows


def _shard_files(storage: ShardStorage) -> Iterator[StoredShard]:
    # oldest first: where two shards hold a key (a re-run, a compaction), the later wins,
    # as it did when they were committed
    yield from sorted(storage.list(), key=lambda s: (s.mtime, s.name))


def _index_shard(cat: Catalog, storage: ShardStorage, shard: StoredShard) -> int:
    """Register one shard from what it carries; CorruptShardError (an OSError) if it is damaged."""
    reader = storage.open(shard.name)
    try:
        index = reader.read_index()
    finally:
        reader.close()
    # poolings are left for FeatureStore to read from the file when it opens the store
    cat.commit_shard(shard.name, index.model, index.config, index.keys, index.n_tokens, index.truncated,
                     has_tokens=index.has_tokens, n_bytes=shard.n_bytes)
    return len(index.keys)


# every key's winner in one sorted pass (repair_catalog): rank orders the copies of a key as
# commit_shard would have let them win, shard by shard, oldest first: a later copy replaces an
# earlier one unless that one has token states and it has not
_STAGE = ("CREATE TEMP TABLE repair_staged (key TEXT NOT NULL, shard TEXT NOT NULL, row INTEGER NOT NULL, "
          "n_tokens INTEGER NOT NULL, truncated INTEGER NOT NULL, has_tokens INTEGER NOT NULL, "
          "rank INTEGER NOT NULL)")
# SQLite takes a bare column of an aggregate query from the row that gave max(); GROUP BY sorts
# the keys (on disk, not in memory), so entries and its key index grow in key order
_WINNERS = ("INSERT INTO entries (key, shard, row, n_tokens, truncated, has_tokens) "
            "SELECT key, shard, row, n_tokens, truncated, has_tokens FROM "
            "(SELECT key, shard, row, n_tokens, truncated, has_tokens, max(rank) FROM repair_staged GROUP BY key)")
# commit_shard forgets the shard it commits if no key points at it then (every key of a shard
# without token states already held with them by an earlier one): a shard that won a key at
# its commit stays listed even when later shards took every key over, as in the live catalog
_FORGET_UNWON = [
    "CREATE TEMP TABLE repair_first_tokens (key TEXT PRIMARY KEY, first INTEGER NOT NULL)",
    "INSERT INTO repair_first_tokens SELECT key, min(rank) FROM repair_staged WHERE has_tokens = 1 GROUP BY key",
    "CREATE TEMP TABLE repair_won AS SELECT DISTINCT s.shard AS name FROM repair_staged s "
    "LEFT JOIN repair_first_tokens f ON f.key = s.key "
    "WHERE s.has_tokens = 1 OR f.key IS NULL OR ((f.first - (1 << 62)) >> 31) > (s.rank >> 31)",
    "DELETE FROM shards WHERE name NOT IN (SELECT name FROM repair_won) "
    "AND NOT EXISTS (SELECT 1 FROM entries WHERE entries.shard = shards.name)",
]
_REPAIR_CACHE_KB = 64 * 1024  # the rebuild's page cache: bounded whatever the store's size


def _index_all(cat: Catalog, storage: ShardStorage, report: RepairReport) -> None:
    """Register every shard file of ``storage`` in a new, empty SQLite catalog, in one transaction.

    What ``commit_shard`` per shard would give (``_index_shard``: kept for PostgreSQL), without
    its cost on a large store: each of its commits inserted ~2,000 random keys into a key index
    larger than the page cache, a page read and written per key, so a repair took 7.7 s at 10^4
    texts and 490 s at 10^6 (bench/scale.py). Here the shards' keys are staged in file order,
    then every key's winner is inserted once, sorted: O(n log n) with a bounded cache.
    """
    db = cat.conn()
    db.execute(f"PRAGMA cache_size=-{_REPAIR_CACHE_KB}")
    db.execute(_STAGE)
    try:
        with cat.tx() as tx:
            for seq, shard in enumerate(_shard_files(storage)):
                try:
                    reader = storage.open(shard.name)
                    try:
                        index = reader.read_index()
                    finally:
                        reader.close()
                except (OSError, KeyError, ValueError, TypeError, RuntimeError) as e:
                    _quarantine(storage, shard, e, report)
                    continue
                tokens = int(index.has_tokens)
                # poolings (NULL) are left for FeatureStore to read from the file when it opens the store
                tx.execute("INSERT INTO shards (name, model, config, n_rows, n_bytes, has_tokens, created) "
                           "VALUES (?,?,?,?,?,?,?)", (shard.name, index.model, index.config, len(index.keys),
                                                      int(shard.n_bytes), tokens, time.time()))
                base = (tokens << 62) | (seq << 31)  # rows of a shard: under 2**31
                tx.executemany("INSERT INTO repair_staged VALUES (?,?,?,?,?,?,?)",
                               [(k, shard.name, i, int(n), int(bool(t)), tokens, base | i)
                                for i, (k, n, t) in enumerate(zip(index.keys, index.n_tokens, index.truncated))])
                report.shards += 1
            # built after the rows, in one sort, rather than grown row by row at ~500 places
            tx.execute("DROP INDEX IF EXISTS entries_shard")
            tx.execute(_WINNERS)
            tx.execute("CREATE INDEX entries_shard ON entries(shard)")
            for sql in _FORGET_UNWON:
                tx.execute(sql)
    finally:
        for table in ("repair_staged", "repair_first_tokens", "repair_won"):
            db.execute(f"DROP TABLE IF EXISTS temp.{table}")


def _quarantine(storage: ShardStorage, shard: StoredShard, error: Exception, report: RepairReport) -> None:
    if isinstance(error, CorruptShardError):  # what HDF5 said, not the reader's wrapping of it
        error = error.__cause__ if isinstance(error.__cause__, Exception) else ValueError(error.reason)
    log.error("shard %s cannot be read (%s): moved to quarantine/", shard.name, error)
    storage.quarantine(shard.name)
    report.quarantined.append(shard.name)


class PostgresDirectory(RuntimeError):
    """A directory whose shards a PostgreSQL catalog indexes: no SQLite catalog is rebuilt there."""


def refuse_postgres_directory(root: Path) -> None:
    """Replicas share this directory through a PostgreSQL catalog (the store's marker): a
    ``catalog.sqlite`` written here would be a second, partial index beside the running
    replicas, and a store opened on it would delete their shards at its start-up clean-up."""
    from .store import POSTGRES_MARKER

    marker = root / POSTGRES_MARKER
    if marker.exists():
        try:
            named = marker.read_text().strip()
        except OSError:
            named = ""
        raise PostgresDirectory(
            f"the shards in {root} are indexed by a PostgreSQL catalog ({named or 'see ' + str(marker)}); "
            "repair that one with `layerbank repair --catalog-url postgresql://...` (stop every replica "
            "first); no catalog.sqlite is written here, with or without --force")


def repair_catalog(data_dir: str | os.PathLike[str], storage: ShardStorage | None = None) -> RepairReport:
    """Rebuild ``data_dir/catalog.sqlite``: key index from the shards (in ``storage``, default the
    data directory's own), other tables salvaged."""
    root = Path(data_dir)
    path = root / "catalog.sqlite"
    refuse_postgres_directory(root)
    report = RepairReport()
    schema: dict[str, str] = {}
    rows: dict[str, list[tuple]] = {}
    if path.exists():
        schema, rows = _salvage(path, report)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = root / f"catalog.sqlite.damaged-{stamp}"
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(path) + suffix)
            if src.exists():
                shutil.move(str(src), str(aside) + suffix)
        report.damaged_file = str(aside)
    cat = Catalog(path, url="")  # this file, whatever catalog the environment names
    try:
        JobQueue(cat)  # their tables, as a new store has them
        DatasetStore(cat)
        db = cat.conn()
        for table, sql in schema.items():  # tables made by app/ (heads, ...) come from the old schema
            if table not in _INDEX_TABLES and not table.startswith("sqlite_"):
                db.execute(sql.replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1)
                           if "IF NOT EXISTS" not in sql else sql)
        for table, got in rows.items():
            if not got:
                report.kept.setdefault(table, 0)
                continue
            marks = ",".join("?" * len(got[0]))
            try:
                with cat.tx() as tx:
                    # the new file's schema_versions rows (same versions) give way to the old ones
                    tx.executemany(f'INSERT OR REPLACE INTO "{table}" VALUES ({marks})', got)
            except sqlite3.DatabaseError as e:  # rows of another schema version, say
                report.lost[table] = f"{len(got):,} rows read but not accepted by the new catalog ({e})"
                continue
            report.kept[table] = len(got)
        _index_all(cat, storage or open_storage(DEFAULT_STORAGE, root=root), report)
        report.keys = cat.stats()["keys"]  # distinct keys (a key in two shards counts once)
    finally:
        cat.close()
    for line in report.lines():
        log.warning("repair: %s", line)
    return report


def reindex_catalog(data_dir: str | os.PathLike[str], url: str,
                    storage: ShardStorage | None = None) -> RepairReport:
    """Make a PostgreSQL catalog's key index match the shard files (the truth).

    A shard the catalog lists whose file is gone is forgotten (its keys become
    misses, encoded again when asked for); a file the catalog does not list is
    registered from what it carries, or quarantined if it cannot be read. The
    other tables are left as they are. Run it with no replica running: a
    shard renamed into place but not yet committed would be registered.
    """
    root = Path(data_dir)
    report = RepairReport()
    cat = Catalog(root / "catalog.sqlite", url)
    shards = storage or open_storage(DEFAULT_STORAGE, root=root)
    try:
        files = {s.name for s in shards.list()}
        for name in sorted(cat.shard_names() - files):
            keys = cat.drop_shard(name)
            report.lost[f"shard {name}"] = f"its file is missing; its {len(keys):,} keys will be encoded again"
        listed = cat.shard_names()
        for shard in _shard_files(shards):
            if shard.name in listed:
                continue
            try:
                _index_shard(cat, shards, shard)
                report.shards += 1
            except (OSError, KeyError, ValueError, TypeError, RuntimeError) as e:
                _quarantine(shards, shard, e, report)
        report.keys = cat.stats()["keys"]
    finally:
        cat.close()
    for line in report.lines():
        log.warning("repair: %s", line)
    return report

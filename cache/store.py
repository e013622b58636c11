"""FeatureStore: the one object readers and writers use.

Directory layout under ``data_dir``::

    catalog.sqlite      the catalog (WAL mode; keep it on local disk), unless
                        LAYERBANK_CATALOG_URL names a PostgreSQL one (replicas)
    catalog.postgresql  with a PostgreSQL catalog: which one (a SQLite store refuses
                        to open the directory, so it never cleans away its shards)
    shards/*.h5         committed, write-once shards
    quarantine/*.h5     shards whose checksum failed, kept for inspection

(the last two are the default shard storage's, cache/storage_local.py; every
shard file is reached through the store's ``storage``, cache/storage.py).

Reads gather rows by key across shards and return them in the caller's
order. A shard that fails its checksum is quarantined on the spot: its keys
are dropped from the catalog (so they become misses and are recomputed) and
the caller is told which keys were not served. Wrong numbers are never
returned.

Example::

    store = FeatureStore("data")
    rows, found = store.read_pooled(keys, "mean", layers=[5])
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from .catalog import Catalog, Entry, catalog_url, redacted
from .keys import ExtractionConfig, text_key
from .poolings import POOLING_NAMES
from .reader_budget import READER_MEMORY_MB, open_reader_budget
from .shard import CorruptShardError, ShardContents, ShardReader, TokenRows
from .storage import DEFAULT_STORAGE, ShardStorage, open_storage
from .storage_local import LocalShardStorage
from .views import View

__all__ = ["POSTGRES_MARKER", "READER_MEMORY_MB", "CatalogMismatch", "FeatureStore", "ReadResult",
           "open_reader_budget"]

# written by the first store opened on a PostgreSQL catalog: names the catalog (no password)
POSTGRES_MARKER = "catalog.postgresql"

log = logging.getLogger("layerbank.store")
class CatalogMismatch(RuntimeError):
    """The directory's shards belong to another catalog than the one asked for."""


class ReadResult:
    """Rows read for a list of keys: ``data[i]`` is valid where ``found[i]``."""

    def __init__(self, data: np.ndarray, found: np.ndarray, entries: list[Entry | None]) -> None:
        self.data = data
        self.found = found
        self.entries = entries

    @property
    def missing(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(~self.found)]


def _default_reader_budget() -> int:
    """``open_reader_budget`` of the setting ``reader_memory_mb`` (LAYERBANK_READER_MEMORY_MB), so a
    Bank, the CLI and probe processes take the operator's budget as the server and worker do."""
    from layerbank.settings import setting  # the one reader of the environment

    return open_reader_budget(setting("reader_memory_mb"))


class FeatureStore:
    """Keys in, feature rows out; shards written once and committed atomically."""

    def __init__(self, data_dir: str | os.PathLike[str], *, clean: bool = False,
                 catalog_url: str | None = None, storage: str | ShardStorage = DEFAULT_STORAGE,
                 max_open_readers: int | None = None) -> None:
        """``catalog_url``: a PostgreSQL catalog (default: ``LAYERBANK_CATALOG_URL``, else
        ``catalog.sqlite`` in ``data_dir``). ``clean``: remove a crash's leftovers, for a
        process that holds the directory alone (SQLite); beside replicas only the
        worker's careful clean-up runs (cache/leftovers.py). ``storage``: where the shards
        live, a registered name (cache/storage.py) or a storage itself. ``max_open_readers``:
        shard files kept open for reads (default ``open_reader_budget`` of the setting
        ``reader_memory_mb``)."""
        self.root = Path(data_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self.storage = open_storage(storage, root=self.root) if isinstance(storage, str) else storage
        self._check_catalog_kind(catalog_url)
        self.catalog = Catalog(self.root / "catalog.sqlite", catalog_url)
        if self.catalog.dialect == "postgres":
            self._mark_postgres()
        self._record_poolings()
        self._readers: OrderedDict[str, ShardReader] = OrderedDict()
        self.max_open_readers = max_open_readers or _default_reader_budget()
        self._busy: dict[str, int] = {}  # shard -> reads going through its handle now (never closed)
        self._lock = threading.Lock()
        if clean and self.catalog.dialect == "sqlite":
            self.clean()

    @property
    def shard_dir(self) -> Path:
        """The shard directory of the default (local) storage, for tests and tools that look
        at the files; the store itself goes through ``storage``."""
        return self._local().shard_dir

    @property
    def quarantine_dir(self) -> Path:
        return self._local().quarantine_dir

    def _local(self) -> LocalShardStorage:
        if not isinstance(self.storage, LocalShardStorage):
            raise AttributeError(f"the {self.storage.name!r} shard storage has no local directory")
        return self.storage

    # -- which catalog indexes this directory ------------------------------
    def _check_catalog_kind(self, url: str | None) -> None:
        """Refuse to open, on its own SQLite catalog, a directory whose shards a PostgreSQL
        catalog indexes: its start-up clean-up would delete every shard that SQLite file
        does not list, the replicas' shards."""
        marker = self.root / POSTGRES_MARKER
        if catalog_url(url) is None and marker.exists():
            raise CatalogMismatch(
                f"the shards in {self.root} are indexed by a PostgreSQL catalog "
                f"({marker.read_text().strip() or 'see ' + str(marker)}); open the directory with "
                "--catalog-url / LAYERBANK_CATALOG_URL, not with a catalog.sqlite of its own")

    def _mark_postgres(self) -> None:
        marker = self.root / POSTGRES_MARKER
        if not marker.exists():
            tmp = marker.with_name(f"{marker.name}.{os.getpid()}.tmp")
            tmp.write_text(redacted(str(self.catalog.url)) + "\n")
            os.replace(tmp, marker)

    # -- keys -------------------------------------------------------------
    @staticmethod
    def key(model_fingerprint: str, config: ExtractionConfig | str, text: str) -> str:
        return text_key(model_fingerprint, config, text)

    # -- maintenance ------------------------------------------------------
    def clean(self) -> dict[str, int]:
        """Remove what a crash can leave: temp files and unregistered shards.

        Call only when no writer is running (at start, under the data lock).
        """
        committed = self.catalog.shard_names()
        removed_tmp = removed_orphans = 0
        for s in self.storage.list(temp=True):
            if s.temp:
                self.storage.delete(s.name)
                removed_tmp += 1
            elif s.name not in committed:
                # written and renamed, but the process died before the catalog commit
                self.storage.delete(s.name)
                removed_orphans += 1
        if removed_tmp or removed_orphans:
            log.warning("removed %d temp files and %d uncommitted shards left by a crash",
                        removed_tmp, removed_orphans)
        return {"temp_files": removed_tmp, "uncommitted_shards": removed_orphans}

    def _record_poolings(self) -> None:
        """Fill in the poolings of shards a catalog listed before it recorded them,
        from the files (their ``/pooled/*`` datasets): once per old catalog.

        A file that cannot be read stays unrecorded (read as mean, cls, max, what
        every such shard held); its first read quarantines it as before.
        """
        for name in self.catalog.shards_without_poolings():
            reader = self.storage.open(name)
            try:
                self.catalog.set_poolings(name, reader.poolings())
            except CorruptShardError as e:
                log.warning("could not read which poolings shard %s holds: %s", name, e)
            finally:
                reader.close()

    # -- writing ----------------------------------------------------------
    def write(self, name: str, contents: ShardContents, *, model: str, config: ExtractionConfig,
              replaces: Sequence[str] = ()) -> int:
        """Write a shard named ``name`` (``<job>-<part>``) and commit it; return bytes."""
        if "/" in name or name.startswith("."):
            raise ValueError(f"bad shard name {name!r}")
        fname = name + ".h5"
        contents.attrs.setdefault("model_fingerprint", model)
        contents.attrs.setdefault("extraction_config", config.canonical())
        self._forget_reader(fname)
        n_bytes = self.storage.write(fname, contents, config.storage_dtype)
        self.commit(name, model=model, config=config.canonical(), keys=contents.keys,
                    n_tokens=contents.n_tokens, truncated=contents.truncated,
                    has_tokens=contents.tokens is not None, n_bytes=n_bytes,
                    poolings=list(contents.pooled), replaces=replaces)
        return n_bytes

    def commit(self, name: str, *, model: str, config: str, keys: Sequence[str],
               n_tokens: Sequence[int] | np.ndarray, truncated: Sequence[bool] | np.ndarray,
               has_tokens: bool, n_bytes: int, poolings: Sequence[str],
               replaces: Sequence[str] = ()) -> None:
        """Commit shard ``name`` (``<job>-<part>``), already written to ``storage`` by another
        process (a Ray actor); ``write`` does both steps. ``config``: its canonical JSON."""
        fname = name + ".h5"
        self._forget_reader(fname)  # a handle on the file this name had before
        try:
            self.catalog.commit_shard(fname, model, config, keys, n_tokens, truncated,
                                      has_tokens=has_tokens, n_bytes=n_bytes, poolings=list(poolings),
                                      replaces=replaces)
        except BaseException:
            # not in the catalog, so never read: give its space back now, not at the next start
            try:
                if fname not in self.catalog.shard_names():
                    self.storage.delete(fname)
            except Exception:  # the catalog is unreadable too: the next start removes it
                log.exception("could not remove uncommitted shard %s", fname)
            raise

    def discard(self, shards: Sequence[str]) -> None:
        """Delete the files of shards the catalog no longer lists (a compaction replaced them)."""
        for shard in shards:
            self._forget_reader(shard)
            self.storage.delete(shard)

    def is_committed(self, name: str) -> bool:
        return self.catalog.shard_info(name + ".h5") is not None

    # -- reading ----------------------------------------------------------
    def lookup(self, keys: Sequence[str], need_tokens: bool = False,
               poolings: Sequence[str] = ()) -> dict[str, Entry]:
        return self.catalog.lookup(keys, need_tokens, poolings)

    def _reader(self, shard: str) -> ShardReader:
        with self._lock:
            r = self._readers.get(shard)
            if r is None:
                r = self.storage.open(shard)
                self._readers[shard] = r
                self._close_idle()
            else:
                self._readers.move_to_end(shard)
            return r

    def _close_idle(self) -> None:
        """Close least recently used handles past the budget (under ``_lock``), never one a
        read is going through: closing it under another thread's read made h5py fail there,
        which looked like damage and quarantined a sound shard. Busy handles may exceed the
        budget by the reads in flight."""
        if len(self._readers) <= self.max_open_readers:
            return
        for name in list(self._readers):
            if len(self._readers) <= self.max_open_readers:
                break
            if name not in self._busy:
                self._readers.pop(name).close()

    @contextlib.contextmanager
    def _pinned(self, shard: str) -> Iterator[None]:
        """Keep ``shard``'s handle open (not closed for room) while the block reads through it."""
        with self._lock:
            self._busy[shard] = self._busy.get(shard, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                if self._busy[shard] == 1:
                    del self._busy[shard]
                else:
                    self._busy[shard] -= 1
                self._close_idle()

    def _forget_reader(self, shard: str) -> None:
        with self._lock:
            r = self._readers.pop(shard, None)
        if r is not None:
            r.close()

    def quarantine(self, shard: str, reason: str) -> list[str]:
        """Move a damaged shard aside and drop its keys so they are recomputed."""
        self._forget_reader(shard)
        keys = self.catalog.drop_shard(shard)
        self.storage.quarantine(shard)
        self.catalog.bump("quarantined_shards")
        log.error("quarantined shard %s (%s); %d keys will be recomputed", shard, reason, len(keys))
        return keys

    def read_pooled(self, keys: Sequence[str], pooling: str,
                    layers: Sequence[int] | None = None, _retried: bool = False) -> ReadResult:
        """[len(keys), len(layers) or H, d] float32 rows in the order of ``keys``.

        An unknown pooling is the caller's mistake (ValueError), checked before
        any file is touched; whatever then fails inside a shard is damage to it
        (quarantined, its keys reported missing), never "unknown pooling".
        """
        if pooling not in POOLING_NAMES:
            raise ValueError(f"unknown pooling {pooling!r}; known: {', '.join(POOLING_NAMES)}")
        # a key whose shard lacks this pooling is a miss (recomputed), never an error
        entries = self.catalog.lookup(keys, poolings=(pooling,))
        by_shard: dict[str, list[int]] = {}
        for i, k in enumerate(keys):
            e = entries.get(k)
            if e is not None:
                by_shard.setdefault(e.shard, []).append(i)
        found = np.zeros(len(keys), dtype=bool)
        data: np.ndarray | None = None
        for shard, idx in sorted(by_shard.items()):
            rows = np.array([entries[keys[i]].row for i in idx], dtype=np.int64)
            try:
                with self._pinned(shard):
                    block = self._checked_reader(shard, rows, [keys[i] for i in idx]).read_pooled(rows, pooling)
            except CorruptShardError as e:
                if self.catalog.shard_info(shard) is None and not _retried:
                    # compacted (or re-committed) between our lookup and our read:
                    # the rows live elsewhere now, look them up again
                    again = self.read_pooled([keys[i] for i in idx], pooling, layers, _retried=True)
                    if again.data.size:
                        if data is None:
                            data = np.zeros((len(keys),) + again.data.shape[1:], dtype=np.float32)
                        data[idx] = again.data
                    found[idx] = again.found
                    continue
                self.quarantine(shard, str(e))
                continue
            if layers is not None:
                block = block[:, list(layers)]
            if data is None:
                data = np.zeros((len(keys),) + block.shape[1:], dtype=np.float32)
            data[idx] = block
            found[idx] = True
        if data is None:
            data = np.zeros((len(keys), 0, 0), dtype=np.float32)
        return ReadResult(data, found, [entries.get(k) for k in keys])

    def _checked_reader(self, shard: str, rows: np.ndarray, want: list[str]) -> ShardReader:
        """The shard's reader, once its ``rows`` are seen to hold the keys asked for.

        A handle cached before its shard name was re-committed (a re-run of
        the same job part) would point at the old file; reading the keys
        before the rows catches that, and the handle is reopened once.
        Still other keys: the shard is damaged (CorruptShardError).
        """
        for _ in (0, 1):
            reader = self._reader(shard)
            if reader.read_keys(rows) == want:
                return reader
            self._forget_reader(shard)
        raise CorruptShardError(reader.path, "rows do not hold the keys the catalog lists")

    def read_view(self, keys: Sequence[str], view: View, pooling: str,
                  n_hidden_states: int) -> ReadResult:
        """Rows of ``view`` (reading only the layers it needs)."""
        needed = view.needed_layers(n_hidden_states)
        res = self.read_pooled(keys, pooling, layers=needed)
        if res.data.size == 0:
            return res
        return ReadResult(view.combine(res.data, n_hidden_states), res.found, res.entries)

    def read_tokens(self, key: str, layers: Sequence[int] | None = None) -> TokenRows | None:
        """Token-level rows of one key, or None if not stored with tokens."""
        e = self.lookup([key], need_tokens=True).get(key)
        if e is None:
            return None
        try:
            with self._pinned(e.shard):
                return self._reader(e.shard).read_tokens(e.row, None if layers is None else list(layers))
        except CorruptShardError as err:
            self.quarantine(e.shard, str(err))
            return None

    def read_tokens_many(self, keys: Sequence[str],
                         layers: Sequence[int] | None = None) -> list[TokenRows | None]:
        """Token-level rows of many keys, in ``keys`` order; None where not stored with tokens.

        One catalog lookup and one read per shard (not per key). Rows are
        checked against the keys the catalog lists, as for pooled reads; a
        damaged shard is quarantined and its keys come back None. The
        returned states may be views of one block per shard: copy what you keep.
        """
        entries = self.lookup(keys, need_tokens=True)
        by_shard: dict[str, list[int]] = {}
        for i, k in enumerate(keys):
            e = entries.get(k)
            if e is not None:
                by_shard.setdefault(e.shard, []).append(i)
        out: list[TokenRows | None] = [None] * len(keys)
        wanted = None if layers is None else list(layers)
        for shard, idx in sorted(by_shard.items()):
            rows = np.array([entries[keys[i]].row for i in idx], dtype=np.int64)
            try:
                with self._pinned(shard):
                    got = self._checked_reader(shard, rows, [keys[i] for i in idx]).read_tokens_many(rows, wanted)
            except CorruptShardError as err:
                self.quarantine(shard, str(err))
                continue
            for i, t in zip(idx, got):
                out[i] = t
        return out

    def close(self) -> None:
        with self._lock:
            for r in self._readers.values():
                r.close()
            self._readers.clear()
        self.catalog.close()

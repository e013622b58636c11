"""An in-memory tier above the feature store: recently read rows, bounded in bytes.

A key names one text under one model and extraction config, so its stored
numbers never change: a row read once (and checksum-verified by the store)
can be served again from memory. Entries hold the full stored row ``[H, d]``
of one pooling in the storage dtype, so any view of that pooling is computed
from them without touching SQLite or HDF5. The least recently used rows go
first when ``max_bytes`` is reached.

``try_read`` answers only when every key is in memory (cheap enough to run on
the event loop); ``read`` falls back to the store for the rest (run it in a
thread).

``try_fragments`` serves the hot path of cached one-text reads (issue 28): a
row's answer for one view, pooling and encoding (its JSON text, or base64)
is kept beside the row as ready bytes, made once by the same code as the slow
path's, so a repeated read formats no floats. The fragments count towards
``max_bytes`` and leave with their row.

Example::

    cache = RowCache(64 << 20, dtype="float16")
    res = cache.try_read(keys, view, "mean", 7) or cache.read(store, keys, view, "mean", 7)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

import numpy as np

from layerbank.cache.catalog import Entry
from layerbank.cache.store import FeatureStore, ReadResult
from layerbank.cache.views import View

__all__ = ["ROW_CACHE_BYTES", "ROW_OVERHEAD_BYTES", "RowCache"]

ROW_CACHE_BYTES = 64 << 20  # ~11,000 rows of a 6-layer, 384-wide model in float16
# what one held row costs beside its numbers: the array's header, the key and value tuples,
# the OrderedDict slot, the Entry and its key and shard strings (the cache is often their
# only holder). Measured with tracemalloc: 615-735 B a row (bench/scale.py found the
# budget 5x undercounted for a tiny model's rows, 16% for the bundled model's, without it)
ROW_OVERHEAD_BYTES = 700


class RowCache:
    def __init__(self, max_bytes: int = ROW_CACHE_BYTES, dtype: str = "float16") -> None:
        self.max_bytes = max_bytes
        self.dtype = np.dtype(dtype)
        self.bytes = 0
        self.hits = 0
        # (key, pooling) -> (row, entry, {variant: ready answer bytes of this row})
        self._rows: OrderedDict[tuple[str, str], tuple[np.ndarray, Entry, dict[Hashable, bytes]]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._rows)

    def _get(self, keys: Sequence[str], pooling: str) -> tuple[list[np.ndarray | None], list[Entry | None]]:
        rows: list[np.ndarray | None] = [None] * len(keys)
        entries: list[Entry | None] = [None] * len(keys)
        with self._lock:
            for i, k in enumerate(keys):
                hit = self._rows.get((k, pooling))
                if hit is not None:
                    self._rows.move_to_end((k, pooling))
                    rows[i], entries[i] = hit[0], hit[1]
        return rows, entries

    def _put(self, key: str, pooling: str, row: np.ndarray, entry: Entry) -> None:
        if self.max_bytes <= 0:
            return
        row = np.ascontiguousarray(row, dtype=self.dtype)
        with self._lock:
            if (key, pooling) in self._rows:
                return
            self._rows[(key, pooling)] = (row, entry, {})
            self.bytes += row.nbytes + ROW_OVERHEAD_BYTES
            self._evict()

    def _evict(self) -> None:
        while self.bytes > self.max_bytes and self._rows:
            old, _, frags = self._rows.popitem(last=False)[1]
            self.bytes -= old.nbytes + ROW_OVERHEAD_BYTES + sum(len(f) for f in frags.values())

    @staticmethod
    def _result(rows: list[np.ndarray | None], entries: list[Entry | None], view: View,
                n_states: int) -> ReadResult:
        found = np.array([r is not None for r in rows], dtype=bool)
        present = [r for r in rows if r is not None]
        if not present:
            return ReadResult(np.zeros((len(rows), 0, 0), dtype=np.float32), found, entries)
        needed = view.needed_layers(n_states)
        block = np.stack(present)[:, needed].astype(np.float32)
        data = np.zeros((len(rows),) + block.shape[1:], dtype=np.float32)
        data[found] = block
        return ReadResult(view.combine(data, n_states), found, entries)

    def try_read(self, keys: Sequence[str], view: View, pooling: str, n_states: int) -> ReadResult | None:
        """The view's rows if every key is in memory, else None."""
        rows, entries = self._get(keys, pooling)
        if any(r is None for r in rows):
            return None
        self.hits += len(keys)
        return self._result(rows, entries, view, n_states)

    def try_fragments(self, keys: Sequence[str], view: View, pooling: str, n_states: int, variant: Hashable,
                      render: Callable[[np.ndarray], list[bytes]]) -> tuple[list[bytes], list[Entry]] | None:
        """Each key's ready answer bytes for ``variant`` (what, besides view and pooling, decides
        them), or None unless every key is in memory. Rows without them yet get them from
        ``render`` (the view's float32 rows -> one fragment per row), and keep them."""
        hits = []
        with self._lock:
            for k in keys:
                hit = self._rows.get((k, pooling))
                if hit is None:
                    return None
                self._rows.move_to_end((k, pooling))
                hits.append(hit)
        self.hits += len(keys)
        frags = [h[2].get(variant) for h in hits]
        todo = [i for i, f in enumerate(frags) if f is None]
        if todo:
            res = self._result([hits[i][0] for i in todo], [hits[i][1] for i in todo], view, n_states)
            made = render(res.data)
            with self._lock:
                for i, f in zip(todo, made):
                    frags[i] = f
                    if variant not in hits[i][2] and (keys[i], pooling) in self._rows:
                        hits[i][2][variant] = f
                        self.bytes += len(f)
                self._evict()
        return frags, [h[1] for h in hits]  # type: ignore[return-value]  # every None in frags was filled

    def warm(self, store: FeatureStore, keys: Sequence[str], pooling: str) -> None:
        """Read the keys not in memory yet, in one store read, and keep them."""
        rows, _ = self._get(keys, pooling)
        missing = list(dict.fromkeys(k for k, r in zip(keys, rows) if r is None))
        if missing:
            got = store.read_pooled(missing, pooling)
            for j, k in enumerate(missing):
                e = got.entries[j]
                if got.found[j] and e is not None:
                    self._put(k, pooling, got.data[j], e)

    def read(self, store: FeatureStore, keys: Sequence[str], view: View, pooling: str,
             n_states: int) -> ReadResult:
        """Rows from memory where held, from the store otherwise (and kept)."""
        rows, entries = self._get(keys, pooling)
        missing = [i for i, r in enumerate(rows) if r is None]
        self.hits += len(keys) - len(missing)
        if missing:
            got = store.read_pooled([keys[i] for i in missing], pooling)
            for j, i in enumerate(missing):
                e = got.entries[j]
                if got.found[j] and e is not None:
                    rows[i], entries[i] = got.data[j], e
                    self._put(keys[i], pooling, got.data[j], e)
        return self._result(rows, entries, view, n_states)

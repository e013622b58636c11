"""layerbank.app.api.rowcache: rows served from memory equal the store's, within a byte budget."""

from __future__ import annotations

import secrets
import tracemalloc

import numpy as np
import pytest

from layerbank.app.api.rowcache import ROW_OVERHEAD_BYTES, RowCache
from layerbank.cache.catalog import Entry
from layerbank.cache.views import parse_view
from layerbank.workers.extract import extract


def test_memory_rows_equal_store_rows_and_the_budget_holds(store, tiny_encoder) -> None:  # type: ignore[no-untyped-def]
    texts = [f"row cache text {i}" for i in range(5)]
    keys = extract(texts, store, tiny_encoder, job_id="rc").keys
    view = parse_view("layers:0,2")
    row_cost = 3 * 32 * 2 + ROW_OVERHEAD_BYTES  # a [3, 32] float16 row and what holds it
    cache = RowCache(max_bytes=3 * row_cost, dtype="float16")  # room for three
    assert cache.try_read(keys[:1], view, "mean", 3) is None
    first = cache.read(store, keys, view, "mean", 3)
    want = store.read_view(keys, view, "mean", 3)
    np.testing.assert_array_equal(first.data, want.data)
    assert first.found.all() and [e.key for e in first.entries] == keys  # type: ignore[union-attr]
    assert len(cache) == 3 and cache.bytes == 3 * row_cost  # the two oldest went
    hit = cache.try_read(keys[2:], view, "mean", 3)
    assert hit is not None
    np.testing.assert_array_equal(hit.data, want.data[2:])
    assert cache.try_read(keys[:1], view, "mean", 3) is None
    assert cache.try_read(keys[2:], view, "max", 3) is None  # one entry per pooling


def test_unknown_keys_are_reported_missing(store, tiny_encoder) -> None:  # type: ignore[no-untyped-def]
    keys = extract(["a stored text"], store, tiny_encoder, job_id="rc2").keys
    cache = RowCache(dtype="float16")
    res = cache.read(store, [keys[0], "0" * 64], parse_view("all_layers"), "cls", 3)
    assert res.found.tolist() == [True, False] and res.entries[1] is None
    assert res.data.shape == (2, 3, 32) and not res.data[1].any()


@pytest.mark.parametrize("shape", [(3, 32), (7, 384)])  # a tiny model's row, the bundled model's
def test_the_budget_counts_what_the_rows_take_in_memory(shape: tuple[int, int]) -> None:
    """What the cache counts is within 25% of what its rows allocate (tracemalloc), so
    max_bytes bounds the process's memory: it counted only the numbers once (5x under
    for tiny rows)."""
    rng = np.random.default_rng(0)
    rows = [rng.random(shape, dtype=np.float32) for _ in range(1000)]
    cache = RowCache(1 << 40, dtype="float16")
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i, row in enumerate(rows):  # keys and entries made here: the cache is their only holder
        key = secrets.token_hex(32)
        cache._put(key, "mean", row, Entry(key, f"shard-{i % 50:05d}-{secrets.token_hex(4)}.h5", i, 10, False, False))  # noqa: SLF001
    allocated = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert 0.75 * allocated <= cache.bytes <= 1.25 * allocated, (cache.bytes, allocated)

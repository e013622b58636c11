"""layerbank.app.api.rowcache: rows served from memory equal the store's, within a byte budget."""

from __future__ import annotations

import numpy as np

from layerbank.app.api.rowcache import RowCache
from layerbank.cache.views import parse_view
from layerbank.workers.extract import extract


def test_memory_rows_equal_store_rows_and_the_budget_holds(store, tiny_encoder) -> None:  # type: ignore[no-untyped-def]
    texts = [f"row cache text {i}" for i in range(5)]
    keys = extract(texts, store, tiny_encoder, job_id="rc").keys
    view = parse_view("layers:0,2")
    cache = RowCache(max_bytes=3 * 3 * 32 * 2, dtype="float16")  # three [3, 32] float16 rows
    assert cache.try_read(keys[:1], view, "mean", 3) is None
    first = cache.read(store, keys, view, "mean", 3)
    want = store.read_view(keys, view, "mean", 3)
    np.testing.assert_array_equal(first.data, want.data)
    assert first.found.all() and [e.key for e in first.entries] == keys  # type: ignore[union-attr]
    assert len(cache) == 3 and cache.bytes == 3 * 3 * 32 * 2  # the two oldest went
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

"""Compaction merges small shards and changes nothing a reader sees."""

from __future__ import annotations

import numpy as np

from layerbank.cache.compact import compact
from layerbank.cache.keys import ExtractionConfig
from layerbank.cache.shard import ShardContents
from layerbank.cache.store import FeatureStore

CFG = ExtractionConfig(max_length=32, storage_dtype="float16")


def _shard(store: FeatureStore, name: str, keys: list[str], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    pooled = {p: rng.normal(size=(len(keys), 3, 4)).astype(np.float32) for p in ("mean", "cls", "max")}
    store.write(name, ShardContents(keys, np.arange(len(keys)) + 2, np.zeros(len(keys), bool), pooled),
                model="m", config=CFG)
    return pooled


def test_compaction_merges_small_shards_and_keeps_every_row(tmp_path):
    store = FeatureStore(tmp_path)
    expected = {}
    for s in range(5):
        keys = [f"{s:02d}{i:062d}" for i in range(3)]
        pooled = _shard(store, f"job{s}-00000", keys, s)
        for i, k in enumerate(keys):
            expected[k] = pooled["mean"][i].astype(np.float16).astype(np.float32)
    all_keys = list(expected)
    before = store.read_pooled(all_keys, "mean").data
    # a reader holding cached handles on the old shards
    summary = compact(store, max_rows=10)
    assert summary.shards_merged == 5 and summary.shards_written == 1 and summary.rows == 15
    files = sorted(p.name for p in store.shard_dir.iterdir())
    assert len(files) == 1 and files[0].startswith("compact-")
    assert store.catalog.stats()["shards"] == 1 and store.catalog.stats()["keys"] == 15
    after = store.read_pooled(all_keys, "mean")
    assert after.found.all()
    np.testing.assert_array_equal(after.data, before)
    np.testing.assert_array_equal(after.data, np.stack([expected[k] for k in all_keys]))
    # a second store (another process's view) sees the same rows
    other = FeatureStore(tmp_path)
    np.testing.assert_array_equal(other.read_pooled(all_keys, "mean").data, before)


def test_compaction_leaves_large_shards_alone(tmp_path):
    store = FeatureStore(tmp_path)
    _shard(store, "big-00000", [f"b{i:063d}" for i in range(20)], 0)
    _shard(store, "small-00000", [f"s{i:063d}" for i in range(2)], 1)
    summary = compact(store, max_rows=10)
    assert summary.shards_written == 0  # one small shard: nothing to merge
    assert sorted(p.name for p in store.shard_dir.iterdir()) == ["big-00000.h5", "small-00000.h5"]


def test_reader_with_stale_lookup_finds_rows_after_compaction(tmp_path):
    store = FeatureStore(tmp_path)
    keys = []
    for s in range(3):
        ks = [f"{s}{i:063d}" for i in range(2)]
        _shard(store, f"j{s}-00000", ks, s)
        keys += ks
    reader = FeatureStore(tmp_path)
    want = reader.read_pooled(keys, "cls").data
    reader.close()  # drop cached handles: the next read must open files anew
    compact(store, max_rows=10)
    got = reader.read_pooled(keys, "cls")
    assert got.found.all()
    np.testing.assert_array_equal(got.data, want)
    assert reader.catalog.counter("quarantined_shards") == 0

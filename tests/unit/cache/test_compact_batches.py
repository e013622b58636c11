"""Compaction's batches, its summary, shards with no live rows and damaged shards met on
the way: what a reader and the worker's log line ("compacted N small shards into M")
see. Written for the mutants of cache/compact.py that bench/mutation.sh found surviving."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from layerbank.cache.compact import CompactSummary, compact
from layerbank.cache.keys import ExtractionConfig
from layerbank.cache.shard import ShardContents
from layerbank.cache.store import FeatureStore

CFG = ExtractionConfig(max_length=32, storage_dtype="float32")


def _shard(store: FeatureStore, name: str, keys: list[str], seed: int) -> None:
    rng = np.random.default_rng(seed)
    pooled = {p: rng.normal(size=(len(keys), 2, 3)).astype(np.float32) for p in ("mean", "cls", "max")}
    store.write(name, ShardContents(keys, np.full(len(keys), 2), np.zeros(len(keys), bool), pooled),
                model="m", config=CFG)


def _key(i: int) -> str:
    return f"{i:064x}"


def test_batches_stop_at_the_target_and_the_summary_adds_them_up(tmp_path: Path) -> None:
    store = FeatureStore(tmp_path)
    keys = [_key(i) for i in range(6)]
    for i, k in enumerate(keys):  # six one-row shards
        _shard(store, f"miss{i}-00000", [k], i)
    before = store.read_pooled(keys, "max").data
    s = compact(store, max_rows=10, target_rows=2)
    assert s == CompactSummary(shards_merged=6, shards_written=3, rows=6, quarantined=0)
    assert sorted(store.catalog.shard_info(n)["n_rows"] for n in store.catalog.shard_names()) == [2, 2, 2]  # type: ignore[index]
    np.testing.assert_array_equal(store.read_pooled(keys, "max").data, before)


def test_a_shard_with_no_live_rows_is_dropped_and_the_rest_still_merged(tmp_path: Path) -> None:
    store = FeatureStore(tmp_path)
    _shard(store, "old-00000", [_key(0), _key(1)], 0)
    _shard(store, "again-00000", [_key(0), _key(1)], 0)  # the same texts committed again: old holds none
    _shard(store, "c-00000", [_key(2)], 2)
    _shard(store, "d-00000", [_key(3)], 3)
    keys = [_key(i) for i in range(4)]
    before = store.read_pooled(keys, "mean").data
    s = compact(store, max_rows=10)
    assert s == CompactSummary(shards_merged=4, shards_written=1, rows=4, quarantined=0)
    assert len(store.catalog.shard_names()) == 1 and len(list(store.shard_dir.iterdir())) == 1
    np.testing.assert_array_equal(store.read_pooled(keys, "mean").data, before)


def test_damaged_shards_met_by_compaction_are_quarantined_and_the_rest_merged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = FeatureStore(tmp_path)
    for i in range(5):
        _shard(store, f"s{i}-00000", [_key(i)], i)
    good = [_key(0), _key(2), _key(4)]
    before = store.read_pooled(good, "cls").data
    (store.shard_dir / "s1-00000.h5").write_bytes(b"not HDF5 any more")
    # a file swapped under the catalog: sound HDF5, other keys
    (store.shard_dir / "s3-00000.h5").write_bytes((store.shard_dir / "s4-00000.h5").read_bytes())
    with caplog.at_level(logging.ERROR, logger="layerbank"):
        s = compact(store, max_rows=10)
    assert s == CompactSummary(shards_merged=3, shards_written=1, rows=3, quarantined=2)
    assert (f"quarantined shard s3-00000.h5 (shard {store.shard_dir / 's3-00000.h5'} is damaged: rows do not "
            "hold the keys the catalog lists); 1 keys will be recomputed") in [r.getMessage() for r in caplog.records]
    assert sorted(p.name for p in (tmp_path / "quarantine").iterdir()) == ["s1-00000.h5", "s3-00000.h5"]
    got = store.read_pooled([_key(i) for i in range(5)], "cls")
    assert got.found.tolist() == [True, False, True, False, True]
    np.testing.assert_array_equal(got.data[[0, 2, 4]], before)
    assert store.catalog.counter("quarantined_shards") == 2

"""``repair_catalog`` rebuilds the key index in one sorted pass (cache/repair.py ``_index_all``):
the same index that committing the shards one by one, oldest first, gave, and so the same
rows read back, where shards overlap (a re-run, a compaction, a key stored again with tokens)."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

from layerbank.cache.catalog import Catalog
from layerbank.cache.keys import ExtractionConfig
from layerbank.cache.repair import _index_shard, _shard_files, repair_catalog
from layerbank.cache.shard import ShardContents, TokenRows
from layerbank.cache.storage_local import LocalShardStorage
from layerbank.cache.store import FeatureStore

CFG = ExtractionConfig(max_length=64, storage_dtype="float32")
pytestmark = pytest.mark.sqlite_only  # a SQLite catalog rebuilt from the files (PostgreSQL: reindex_catalog)


def _contents(keys: list[str], seed: int, tokens: bool) -> ShardContents:
    rng = np.random.default_rng(seed)
    n = len(keys)
    pooled = {p: rng.normal(size=(n, 2, 3)).astype(np.float32) for p in ("mean", "cls", "max")}
    rows = None
    if tokens:
        rows = [TokenRows(rng.normal(size=(2, 2, 3)).astype(np.float32), np.array([101, 102], np.int32),
                          np.zeros((2, 2), np.int32), np.array([-1, -1], np.int32)) for _ in keys]
    return ShardContents(keys, rng.integers(2, 9, n).astype(np.int32), rng.random(n) < 0.3, pooled, rows)


def _index(path: Path) -> tuple[dict[str, tuple], set[str]]:
    db = sqlite3.connect(path)
    try:
        entries = {r[0]: tuple(r[1:]) for r in db.execute(
            "SELECT key, shard, row, n_tokens, truncated, has_tokens FROM entries")}
        shards = {r[0] for r in db.execute("SELECT name FROM shards")}
    finally:
        db.close()
    return entries, shards


def test_overlapping_shards_are_indexed_as_one_by_one_commits_did(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = FeatureStore(data)
    k = [store.key("local:m", CFG, f"text {i}") for i in range(30)]
    # oldest first: (name, keys, has token states)
    plan = [("a", k[0:10], False), ("b", k[5:15], True), ("c", k[0:8], False), ("d", k[20:23], False),
            ("e", k[20:23] + k[25:27], False), ("f", k[12:14] + k[12:13], True),  # f: a key twice
            ("g", k[9:12], False)]  # g: every key held with token states by b
    written = {}
    t0 = time.time() - 100
    for seq, (name, keys, tokens) in enumerate(plan):
        c = _contents(keys, seq, tokens)
        store.write(name, c, model="local:m", config=CFG)
        os.utime(store.shard_dir / f"{name}.h5", (t0 + seq, t0 + seq))  # the order repair reads them in
        written[name] = c
    store.close()

    # what the per-shard commits give, oldest first (the path repair took before, and still
    # takes for a PostgreSQL catalog)
    storage = LocalShardStorage(data)
    ref = Catalog(tmp_path / "reference.sqlite", url="")
    for shard in _shard_files(storage):
        _index_shard(ref, storage, shard)
    ref.close()

    report = repair_catalog(data)
    assert report.shards == len(plan) and not report.quarantined
    got, want = _index(data / "catalog.sqlite"), _index(tmp_path / "reference.sqlite")
    assert got == want
    entries, shards = got
    assert report.keys == len(entries) == 15 + 3 + 2  # k0..k14, k20..k22, k25, k26
    assert "g.h5" not in shards  # no key pointed at it when it was committed: forgotten
    assert "d.h5" in shards  # every key moved on to e later: still listed, as the live catalog keeps it
    assert entries[k[6]][0] == "b.h5"  # with token states: not taken back by c, which has none
    assert entries[k[2]][0] == "c.h5" and entries[k[12]][:2] == ("f.h5", 2)  # the later copy wins

    # and a user reads the winners' numbers
    store = FeatureStore(data)
    try:
        res = store.read_pooled(k[:15], "mean")
        assert res.found.all()
        for i, key in enumerate(k[:15]):
            name, row = entries[key][:2]
            np.testing.assert_array_equal(res.data[i], written[name[:-3]].pooled["mean"][row])
    finally:
        store.close()

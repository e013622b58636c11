"""Shards and the catalog record which poolings a shard holds; a pooling a
shard lacks is a miss, never an error; compaction merges mixed stores.

Covers: the registry's parser, the ``poolings`` shard attribute, the catalog
migration of a catalog made before the column existed (filled in from each
shard's ``/pooled/*`` datasets), reads of a pooling a shard lacks, the
repoint rule for a key re-encoded for a new pooling, and compaction of a
store whose shards hold different poolings.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import h5py
import numpy as np
import pytest

from layerbank.cache.compact import compact
from layerbank.cache.keys import ExtractionConfig
from layerbank.cache.poolings import POOLING_NAMES, parse_poolings
from layerbank.cache.shard import ShardContents, ShardReader
from layerbank.cache.store import FeatureStore

CFG = ExtractionConfig(max_length=16)
H, D = 3, 4


def k(i: int) -> str:
    return f"{i:064x}"


def contents(first: int, n: int, poolings: tuple[str, ...], tokens: bool = False) -> ShardContents:
    """Rows whose every value encodes (key, pooling), so a wrong row or pooling shows."""
    keys = [k(first + i) for i in range(n)]
    pooled = {p: np.full((n, H, D), 0.0, dtype=np.float32) + (first + np.arange(n))[:, None, None]
              + POOLING_NAMES.index(p) / 4 for p in poolings}
    toks = None
    if tokens:
        from layerbank.cache.shard import TokenRows
        toks = [TokenRows(np.ones((2, H, D), np.float32), np.array([1, 2], np.int32),
                          np.zeros((2, 2), np.int32), np.array([-1, 0], np.int32)) for _ in range(n)]
    return ShardContents(keys, np.full(n, 5), np.zeros(n, dtype=bool), pooled, toks)


def expected(i: int, pooling: str) -> np.ndarray:
    return np.full((H, D), i + POOLING_NAMES.index(pooling) / 4, dtype=np.float32)


def test_parse_poolings_keeps_order_and_names_the_known_ones() -> None:
    assert parse_poolings(" max,mean ,max") == ("max", "mean")
    with pytest.raises(ValueError, match="unknown pooling 'avg'; known: mean, cls, max"):
        parse_poolings("mean,avg")
    with pytest.raises(ValueError, match="at least one"):
        parse_poolings(" , ")


def test_a_shard_records_its_poolings_and_the_catalog_too(store: FeatureStore) -> None:
    store.write("a-00000", contents(0, 3, ("mean", "max")), model="local:m", config=CFG)
    path = store.shard_dir / "a-00000.h5"
    with h5py.File(path, "r") as f:
        assert f.attrs["poolings"] == "mean,max"
        assert sorted(f["pooled"]) == ["max", "mean"]
    assert ShardReader(path).poolings() == ("mean", "max")
    assert store.catalog.shard_info("a-00000.h5")["poolings"] == ("mean", "max")  # type: ignore[index]


def test_a_pooling_a_shard_lacks_is_a_miss_not_an_error(store: FeatureStore) -> None:
    store.write("a-00000", contents(0, 2, ("mean",)), model="local:m", config=CFG)
    store.write("b-00000", contents(2, 2, ("mean", "cls", "max")), model="local:m", config=CFG)
    keys = [k(0), k(2), k(1), k(3)]
    mean = store.read_pooled(keys, "mean")
    assert mean.found.tolist() == [True] * 4
    np.testing.assert_array_equal(mean.data[1], expected(2, "mean"))
    cls = store.read_pooled(keys, "cls")
    assert cls.found.tolist() == [False, True, False, True]
    np.testing.assert_array_equal(cls.data[3], expected(3, "cls"))
    # nothing was taken for damage: the shard stays, nothing quarantined
    assert store.catalog.counter("quarantined_shards") == 0
    assert (store.shard_dir / "a-00000.h5").exists()
    assert set(store.lookup(keys, poolings=("cls",))) == {k(2), k(3)}
    with pytest.raises(ValueError, match="unknown pooling 'avg'"):
        store.read_pooled(keys, "avg")


# the catalog's tables as layerbank wrote them before shards recorded their poolings
_OLD_SCHEMA = """
CREATE TABLE shards (
    name TEXT PRIMARY KEY, model TEXT NOT NULL, config TEXT NOT NULL,
    n_rows INTEGER NOT NULL, n_bytes INTEGER NOT NULL, has_tokens INTEGER NOT NULL,
    created REAL NOT NULL);
CREATE TABLE entries (
    key TEXT PRIMARY KEY, shard TEXT NOT NULL REFERENCES shards(name), row INTEGER NOT NULL,
    n_tokens INTEGER NOT NULL, truncated INTEGER NOT NULL, has_tokens INTEGER NOT NULL);
"""


def _old_data_dir(root: Path) -> Path:
    """A data directory as an earlier layerbank left it: no poolings column, no
    shard attribute; one shard with the three poolings, one with mean only."""
    from layerbank.cache.shard import write_shard

    (root / "shards").mkdir(parents=True)
    db = sqlite3.connect(root / "catalog.sqlite")
    db.executescript(_OLD_SCHEMA)
    for name, first, poolings in (("old-00000.h5", 0, ("mean", "cls", "max")), ("old-00001.h5", 10, ("mean",))):
        c = contents(first, 2, poolings)
        n_bytes = write_shard(root / "shards" / name, c, "float16")
        with h5py.File(root / "shards" / name, "a") as f:
            del f.attrs["poolings"]
        db.execute("INSERT INTO shards VALUES (?,?,?,?,?,?,?)", (name, "local:m", CFG.canonical(), 2, n_bytes, 0, 1.0))
        db.executemany("INSERT INTO entries VALUES (?,?,?,?,?,?)",
                       [(key, name, i, 5, 0, 0) for i, key in enumerate(c.keys)])
    db.commit()
    db.close()
    return root


@pytest.mark.sqlite_only  # an old catalog.sqlite file
def test_an_old_catalog_is_migrated_and_learns_poolings_from_the_shard_files(tmp_path: Path) -> None:
    root = _old_data_dir(tmp_path / "data")
    store = FeatureStore(root)
    try:
        assert store.catalog.shard_info("old-00000.h5")["poolings"] == ("mean", "cls", "max")  # type: ignore[index]
        assert store.catalog.shard_info("old-00001.h5")["poolings"] == ("mean",)  # type: ignore[index]
        assert store.catalog.shards_without_poolings() == []
        db = sqlite3.connect(root / "catalog.sqlite")
        assert db.execute("SELECT version FROM schema_versions WHERE part = 'shards'").fetchone() == (1,)
        db.close()
        keys = [k(0), k(10)]
        assert store.read_pooled(keys, "mean").found.tolist() == [True, True]
        assert store.read_pooled(keys, "max").found.tolist() == [True, False]
        assert store.catalog.counter("quarantined_shards") == 0
    finally:
        store.close()
    # opened again: nothing left to migrate, the rows still answer
    again = FeatureStore(root)
    np.testing.assert_array_equal(again.read_pooled([k(11)], "mean").data[0], expected(11, "mean"))
    again.close()


def test_a_key_re_encoded_for_a_new_pooling_moves_even_from_a_shard_with_tokens(store: FeatureStore) -> None:
    store.write("tok-00000", contents(0, 2, ("mean",), tokens=True), model="local:m", config=CFG)
    # the same poolings without tokens: the key keeps its token states
    store.write("same-00000", contents(0, 2, ("mean",)), model="local:m", config=CFG)
    assert store.lookup([k(0)])[k(0)].shard == "tok-00000.h5"
    # a shard that adds a pooling: the key moves (it was re-encoded for that pooling)
    store.write("more-00000", contents(0, 1, ("mean", "cls")), model="local:m", config=CFG)
    e = store.lookup([k(0), k(1)])
    assert (e[k(0)].shard, e[k(0)].poolings, e[k(0)].has_tokens) == ("more-00000.h5", ("mean", "cls"), False)
    assert e[k(1)].shard == "tok-00000.h5"
    assert store.read_pooled([k(0)], "cls").found.tolist() == [True]


def test_compaction_merges_a_store_of_mixed_poolings(store: FeatureStore) -> None:
    for j, poolings in enumerate([("mean", "cls", "max"), ("mean",), ("mean", "cls", "max"), ("mean",)]):
        store.write(f"s-{j:05d}", contents(10 * j, 3, poolings), model="local:m", config=CFG)
    keys = [k(10 * j + i) for j in range(4) for i in range(3)]
    before = {p: store.read_pooled(keys, p) for p in ("mean", "cls", "max")}
    summary = compact(store, max_rows=100)
    assert (summary.shards_merged, summary.shards_written, summary.rows) == (4, 2, 12)
    assert sorted(info["poolings"] for info in (store.catalog.shard_info(n) for n in store.catalog.shard_names())) \
        == [("mean",), ("mean", "cls", "max")]  # type: ignore[index]
    for p in ("mean", "cls", "max"):
        after = store.read_pooled(keys, p)
        assert after.found.tolist() == before[p].found.tolist()
        np.testing.assert_array_equal(after.data[after.found], before[p].data[before[p].found])
    assert store.read_pooled(keys, "cls").found.tolist() == [True] * 3 + [False] * 3 + [True] * 3 + [False] * 3
    assert sorted(p.name for p in store.shard_dir.iterdir()) == sorted(store.catalog.shard_names())

"""layerbank.cache.store.FeatureStore: rows come back in the caller's order, damaged
shards are quarantined (never served), and crash debris is cleaned."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from layerbank.cache.keys import ExtractionConfig
from layerbank.cache.shard import ShardContents, TokenRows
from layerbank.cache.store import FeatureStore
from layerbank.cache.views import parse_view

H, D = 3, 4
CFG = ExtractionConfig(max_length=64, storage_dtype="float32")
CFG16 = ExtractionConfig(max_length=64)


def contents(keys: list[str], seed: int, tokens: bool = False) -> ShardContents:
    rng = np.random.default_rng(seed)
    n = len(keys)
    pooled = {p: rng.normal(size=(n, H, D)).astype(np.float32) for p in ("mean", "cls", "max")}
    rows = None
    if tokens:
        rows = [TokenRows(rng.normal(size=(2, H, D)).astype(np.float32), np.array([101, 102], np.int32),
                          np.zeros((2, 2), np.int32), np.array([-1, -1], np.int32)) for _ in keys]
    return ShardContents(list(keys), np.full(n, 2, np.int32), np.zeros(n, bool), pooled, rows)


def key(store: FeatureStore, text: str) -> str:
    return store.key("local:m", CFG, text)


@pytest.fixture
def three_shards(store: FeatureStore) -> dict[str, np.ndarray]:
    """Shards a, b, c of 3, 2 and 4 texts; returns each text's mean rows."""
    want: dict[str, np.ndarray] = {}
    for seed, (name, texts) in enumerate([("a", ["t0", "t1", "t2"]), ("b", ["t3", "t4"]),
                                          ("c", ["t5", "t6", "t7", "t8"])]):
        c = contents([key(store, t) for t in texts], seed)
        store.write(name, c, model="local:m", config=CFG)
        want.update({t: c.pooled["mean"][i] for i, t in enumerate(texts)})
    return want


def test_read_pooled_follows_the_callers_order_with_repeats(store: FeatureStore, three_shards) -> None:  # type: ignore[no-untyped-def]
    order = ["t7", "t0", "t3", "t7", "t2", "nope", "t5", "t0", "t4"]
    res = store.read_pooled([key(store, t) for t in order], "mean")
    assert res.data.shape == (len(order), H, D) and res.data.dtype == np.float32
    assert res.found.tolist() == [t != "nope" for t in order]
    assert res.missing == [5]
    for i, t in enumerate(order):
        if t != "nope":
            np.testing.assert_array_equal(res.data[i], three_shards[t])
    assert [e.shard if e else None for e in res.entries] == \
        ["c.h5", "a.h5", "b.h5", "c.h5", "a.h5", None, "c.h5", "a.h5", "b.h5"]


def test_read_pooled_selects_layers(store: FeatureStore, three_shards) -> None:  # type: ignore[no-untyped-def]
    res = store.read_pooled([key(store, "t6"), key(store, "t1")], "mean", layers=[2, 0])
    np.testing.assert_array_equal(res.data[0], three_shards["t6"][[2, 0]])
    np.testing.assert_array_equal(res.data[1], three_shards["t1"][[2, 0]])


def test_read_view_combines_the_stored_layers(store: FeatureStore, three_shards) -> None:  # type: ignore[no-untyped-def]
    res = store.read_view([key(store, "t8"), key(store, "t0")], parse_view("layers:-1,0"), "mean", H)
    want = np.stack([np.concatenate([three_shards[t][2], three_shards[t][0]]) for t in ("t8", "t0")])
    np.testing.assert_array_equal(res.data, want)


def test_unknown_pooling_is_a_value_error(store: FeatureStore, three_shards) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="unknown pooling 'median'"):
        store.read_pooled([key(store, "t0")], "median")


def test_nothing_found_gives_an_empty_result(store: FeatureStore) -> None:
    res = store.read_pooled(["0" * 64, "1" * 64], "mean")
    assert res.found.tolist() == [False, False]
    assert res.missing == [0, 1]


def test_float16_rows_come_back_as_float32_within_float16_rounding(store: FeatureStore) -> None:
    c = contents([store.key("local:m", CFG16, "x")], 5)
    store.write("h", c, model="local:m", config=CFG16)
    res = store.read_pooled(c.keys, "max")
    assert res.data.dtype == np.float32
    np.testing.assert_allclose(res.data[0], c.pooled["max"][0], rtol=2 ** -11, atol=1e-7)
    assert not np.array_equal(res.data[0], c.pooled["max"][0])  # really stored as float16


def corrupt(path: Path) -> None:
    import h5py

    with h5py.File(path, "r") as f:
        info = f["pooled/mean"].id.get_chunk_info(0)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(b"\xde\xad\xbe\xef")


def test_a_damaged_shard_is_quarantined_and_its_keys_become_misses(store: FeatureStore, three_shards) -> None:  # type: ignore[no-untyped-def]
    corrupt(store.shard_dir / "b.h5")
    order = ["t3", "t0", "t4", "t5"]
    keys = [key(store, t) for t in order]
    res = store.read_pooled(keys, "mean")
    assert res.found.tolist() == [False, True, False, True]
    np.testing.assert_array_equal(res.data[1], three_shards["t0"])
    np.testing.assert_array_equal(res.data[3], three_shards["t5"])
    assert not np.isin(res.data[[0, 2]], three_shards["t3"]).any()  # no damaged numbers served
    assert not (store.shard_dir / "b.h5").exists()
    assert (store.quarantine_dir / "b.h5").exists()
    assert store.catalog.counter("quarantined_shards") == 1
    assert store.lookup(keys).keys() == {keys[1], keys[3]}
    assert "b.h5" not in store.catalog.shard_names()
    # a second read is a plain miss, not a second quarantine
    assert store.read_pooled(keys, "mean").found.tolist() == [False, True, False, True]
    assert store.catalog.counter("quarantined_shards") == 1


def test_a_shard_whose_rows_do_not_hold_the_listed_keys_is_quarantined(store: FeatureStore, three_shards) -> None:  # type: ignore[no-untyped-def]
    # a file swapped under the catalog (restored from the wrong backup, say)
    shutil.copy(store.shard_dir / "a.h5", store.shard_dir / "c.h5")
    res = store.read_pooled([key(store, "t5"), key(store, "t1")], "mean")
    assert res.found.tolist() == [False, True]
    assert (store.quarantine_dir / "c.h5").exists()


def test_a_recommitted_shard_is_read_fresh_not_from_a_stale_handle(store: FeatureStore) -> None:
    keys = [key(store, t) for t in ("x", "y")]
    store.write("job-00000", contents(keys, 1), model="local:m", config=CFG)
    store.read_pooled(keys, "mean")  # caches an open handle
    other = FeatureStore(store.root)  # a second process re-runs the same part
    c2 = contents(keys[::-1], 2)
    other.write("job-00000", c2, model="local:m", config=CFG)
    other.close()
    res = store.read_pooled(keys, "mean")
    assert res.found.all()
    np.testing.assert_array_equal(res.data[0], c2.pooled["mean"][1])
    assert store.catalog.counter("quarantined_shards") == 0


@pytest.mark.sqlite_only  # clean at open is the lone SQLite server's; replicas: test_leftovers
def test_clean_removes_temp_files_and_uncommitted_shards(store: FeatureStore, three_shards) -> None:  # type: ignore[no-untyped-def]
    (store.shard_dir / "job-00001.h5.tmp").write_bytes(b"half a shard")
    shutil.copy(store.shard_dir / "a.h5", store.shard_dir / "crashed-00000.h5")
    assert store.clean() == {"temp_files": 1, "uncommitted_shards": 1}
    assert sorted(p.name for p in store.shard_dir.iterdir()) == ["a.h5", "b.h5", "c.h5"]
    # opening with clean=True does the same
    (store.shard_dir / "x.h5.tmp").write_bytes(b"")
    FeatureStore(store.root, clean=True).close()
    assert not (store.shard_dir / "x.h5.tmp").exists()
    assert store.read_pooled([key(store, "t0")], "mean").found.all()


def test_token_rows_round_trip_and_need_tokens(store: FeatureStore) -> None:
    keys = [key(store, "w")]
    c = contents(keys, 3, tokens=True)
    store.write("tok", c, model="local:m", config=CFG)
    t = store.read_tokens(keys[0], layers=[1])
    assert t is not None
    np.testing.assert_array_equal(t.states[:, 0], c.tokens[0].states[:, 1])  # type: ignore[index]
    assert store.read_tokens(key(store, "never")) is None


def test_shard_names_are_checked(store: FeatureStore) -> None:
    c = contents([key(store, "x")], 0)
    for bad in ("../evil", ".hidden", "a/b"):
        with pytest.raises(ValueError, match="bad shard name"):
            store.write(bad, c, model="local:m", config=CFG)
    assert list(store.shard_dir.iterdir()) == []


def test_written_shard_carries_model_and_config_attributes(store: FeatureStore) -> None:
    import h5py

    store.write("s", contents([key(store, "x")], 0), model="local:m", config=CFG)
    with h5py.File(store.shard_dir / "s.h5", "r") as f:
        assert f.attrs["model_fingerprint"] == "local:m"
        assert f.attrs["extraction_config"] == CFG.canonical()
    assert store.is_committed("s") and not store.is_committed("t")

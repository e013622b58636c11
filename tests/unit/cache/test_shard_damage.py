"""Damage anywhere in a shard is one thing: quarantine, and the keys become misses.

Bytes are flipped in the *object header* of each dataset (what h5py reads to
open it: a ``KeyError`` there used to escape as "unknown pooling" and a 500)
and inside data chunks, for pooled and token-level reads. Every case must
end the same way: the read reports the keys missing, the shard is in
``quarantine/``, the catalog forgets it, and no exception reaches the caller.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from layerbank.cache.store import FeatureStore

from .test_store import CFG, contents, key


def flip_header(path: Path, dataset: str) -> None:
    """XOR 40 bytes of the dataset's object header (its type, shape and layout)."""
    with h5py.File(path, "r") as f:
        addr = h5py.h5o.get_info(f[dataset].id).addr
    with open(path, "r+b") as fh:
        fh.seek(addr)
        b = bytearray(fh.read(40))
        fh.seek(addr)
        fh.write(bytes(x ^ 0x5A for x in b))


def flip_chunk(path: Path, dataset: str) -> None:
    with h5py.File(path, "r") as f:
        info = f[dataset].id.get_chunk_info(0)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(b"\xde\xad\xbe\xef")


@pytest.fixture
def two_shards(store: FeatureStore) -> tuple[list[str], list[str]]:
    ok = [key(store, f"ok{i}") for i in range(3)]
    bad = [key(store, f"bad{i}") for i in range(4)]
    store.write("ok", contents(ok, 0, tokens=True), model="local:m", config=CFG)
    store.write("bad", contents(bad, 1, tokens=True), model="local:m", config=CFG)
    return ok, bad


def assert_quarantined(store: FeatureStore, bad: list[str]) -> None:
    assert (store.quarantine_dir / "bad.h5").exists() and not (store.shard_dir / "bad.h5").exists()
    assert "bad.h5" not in store.catalog.shard_names()
    assert store.lookup(bad) == {}
    assert store.catalog.counter("quarantined_shards") == 1


@pytest.mark.parametrize("damage", [flip_header, flip_chunk])
@pytest.mark.parametrize("dataset,pooling", [("pooled/mean", "mean"), ("pooled/cls", "cls"),
                                             ("pooled/max", "max"), ("keys", "mean")])
def test_pooled_read_of_any_damaged_dataset_quarantines(store: FeatureStore, two_shards, damage,  # type: ignore[no-untyped-def]
                                                         dataset: str, pooling: str) -> None:
    ok, bad = two_shards
    damage(store.shard_dir / "bad.h5", dataset)
    res = store.read_pooled(bad + ok, pooling)  # no exception: damage is never "unknown pooling"
    assert res.found.tolist() == [False] * len(bad) + [True] * len(ok)
    assert_quarantined(store, bad)
    again = store.read_pooled(bad + ok, pooling)  # now plain misses
    assert again.found.tolist() == res.found.tolist()
    assert store.catalog.counter("quarantined_shards") == 1


@pytest.mark.parametrize("damage", [flip_header, flip_chunk])
@pytest.mark.parametrize("dataset", ["tokens/layer_1", "tokens/offsets", "tokens/ids"])
def test_token_read_of_a_damaged_shard_quarantines(store: FeatureStore, two_shards, damage,  # type: ignore[no-untyped-def]
                                                    dataset: str) -> None:
    ok, bad = two_shards
    damage(store.shard_dir / "bad.h5", dataset)
    got = store.read_tokens_many(bad + ok)
    assert [g is None for g in got] == [True] * len(bad) + [False] * len(ok)
    assert_quarantined(store, bad)


def test_one_token_read_of_a_damaged_shard_quarantines(store: FeatureStore, two_shards) -> None:  # type: ignore[no-untyped-def]
    ok, bad = two_shards
    flip_header(store.shard_dir / "bad.h5", "tokens/layer_0")
    assert store.read_tokens(bad[0]) is None
    assert_quarantined(store, bad)
    assert store.read_tokens(ok[0]) is not None


def test_a_catalog_row_past_the_end_of_the_shard_is_damage(store: FeatureStore, two_shards) -> None:  # type: ignore[no-untyped-def]
    ok, bad = two_shards
    # the catalog lists row 3 for bad[3]; a shorter file with the same name under it
    store.write("short", contents(bad[:2], 1), model="local:m", config=CFG)
    (store.shard_dir / "short.h5").replace(store.shard_dir / "bad.h5")
    store._forget_reader("bad.h5")
    res = store.read_pooled([bad[3], ok[0]], "mean")
    assert res.found.tolist() == [False, True]
    assert (store.quarantine_dir / "bad.h5").exists()


def test_unknown_pooling_is_refused_before_any_file_is_read(store: FeatureStore, two_shards) -> None:  # type: ignore[no-untyped-def]
    ok, bad = two_shards
    flip_header(store.shard_dir / "bad.h5", "pooled/mean")
    with pytest.raises(ValueError, match="unknown pooling 'median'"):
        store.read_pooled(bad, "median")
    assert (store.shard_dir / "bad.h5").exists()  # a caller's mistake quarantines nothing
    assert store.catalog.counter("quarantined_shards") == 0
    np.testing.assert_array_equal(store.read_pooled(ok, "cls").found, [True] * 3)

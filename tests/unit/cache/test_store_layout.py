"""What FeatureStore leaves on disk and in the log, as an operator sees it: the
directory layout the docs name, where a quarantined shard goes and the line that
says so, that opening a store (a reader) never removes a writer's files, and the
bound on open shard files. Written to kill the mutants bench/mutation.sh found
surviving in cache/store.py (docs/reliability.md, "Mutation testing")."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

from layerbank.cache.keys import ExtractionConfig
from layerbank.cache.shard import ShardContents
from layerbank.cache.store import FeatureStore

CFG = ExtractionConfig(max_length=64, storage_dtype="float32")


def contents(keys: list[str], seed: int) -> ShardContents:
    rng = np.random.default_rng(seed)
    n = len(keys)
    pooled = {p: rng.normal(size=(n, 2, 4)).astype(np.float32) for p in ("mean", "cls", "max")}
    return ShardContents(list(keys), np.full(n, 2, np.int32), np.zeros(n, bool), pooled)


def keys_of(store: FeatureStore, *texts: str) -> list[str]:
    return [store.key("local:m", CFG, t) for t in texts]


def test_a_new_data_directory_has_the_documented_layout(tmp_path: Path) -> None:
    data = tmp_path / "not" / "yet" / "there"  # parents are made too
    store = FeatureStore(data)
    try:
        store.write("job-00000", contents(keys_of(store, "a", "b"), 0), model="local:m", config=CFG)
        assert sorted(p.name for p in data.iterdir() if not p.name.startswith("catalog.")) == \
            ["quarantine", "shards"]
        assert [p.name for p in (data / "shards").iterdir()] == ["job-00000.h5"]
        assert list((data / "quarantine").iterdir()) == []
    finally:
        store.close()


@pytest.mark.sqlite_only  # with PostgreSQL the catalog is not a file here
def test_the_sqlite_catalog_is_catalog_sqlite_in_the_data_directory(tmp_path: Path) -> None:
    store = FeatureStore(tmp_path / "data")
    try:
        store.write("job-00000", contents(keys_of(store, "a"), 0), model="local:m", config=CFG)
    finally:
        store.close()
    assert (tmp_path / "data" / "catalog.sqlite").stat().st_size > 0
    # a second store on the same directory finds what the first committed
    again = FeatureStore(tmp_path / "data")
    try:
        assert again.read_pooled(keys_of(again, "a"), "mean").found.tolist() == [True]
    finally:
        again.close()


def test_a_damaged_shard_moves_to_quarantine_whole_and_the_log_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    store = FeatureStore(data)
    try:
        keys = keys_of(store, "a", "b", "c")
        store.write("job-00000", contents(keys, 0), model="local:m", config=CFG)
        # a shard whose rows hold other keys (a file swapped under the catalog)
        other = FeatureStore(tmp_path / "other", catalog_url="")  # a catalog of its own
        other.write("job-00000", contents(keys_of(other, "x", "y", "z"), 1), model="local:m", config=CFG)
        other.close()
        swapped = (tmp_path / "other" / "shards" / "job-00000.h5").read_bytes()
        (data / "shards" / "job-00000.h5").write_bytes(swapped)
        with caplog.at_level(logging.ERROR, logger="layerbank"):
            res = store.read_pooled(keys, "mean")
        assert res.found.tolist() == [False, False, False]
        assert (data / "quarantine" / "job-00000.h5").read_bytes() == swapped  # kept for inspection
        assert list((data / "shards").iterdir()) == []
        lines = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
        shard = data / "shards" / "job-00000.h5"
        assert lines == [("layerbank.store", "ERROR",
                          (f"quarantined shard job-00000.h5 (shard {shard} is damaged: rows do not hold "
                           "the keys the catalog lists); 3 keys will be recomputed"))]
    finally:
        store.close()


def test_opening_a_store_never_removes_a_writers_files(tmp_path: Path) -> None:
    """The API opens the store while the worker writes: its temp file and a shard renamed
    but not yet committed must survive; only ``clean=True`` (at start, alone) removes them."""
    data = tmp_path / "data"
    FeatureStore(data).close()
    (data / "shards" / "job-00001.h5.tmp").write_bytes(b"being written")
    (data / "shards" / "job-00002.h5").write_bytes(b"renamed, commit next")
    FeatureStore(data).close()
    assert sorted(p.name for p in (data / "shards").iterdir()) == ["job-00001.h5.tmp", "job-00002.h5"]


def test_at_most_the_budget_of_shard_files_is_held_open_oldest_closed_first(tmp_path: Path) -> None:
    """Each open HDF5 file costs about 0.6 MB whatever its size; a server reading more
    shards than its budget (cache/store.py open_reader_budget) keeps the most recently
    read open, not all (tests/unit/cache/test_store_readers.py counts the descriptors)."""
    store = FeatureStore(tmp_path / "data", max_open_readers=32)
    try:
        keys: list[str] = []
        for s in range(34):
            ks = keys_of(store, f"t{s}")
            store.write(f"job{s:02d}-00000", contents(ks, s), model="local:m", config=CFG)
            keys += ks
        for k in keys:  # one read per shard, in order
            assert store.read_pooled([k], "mean").found.all()
        assert len(store._readers) == 32
        assert list(store._readers) == [f"job{s:02d}-00000.h5" for s in range(2, 34)]  # the oldest closed
    finally:
        store.close()


@pytest.mark.sqlite_only  # clean at start is the lone SQLite server's (replicas: test_leftovers.py)
def test_clean_counts_every_leftover_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    store = FeatureStore(data)
    try:
        store.write("job-00000", contents(keys_of(store, "a"), 0), model="local:m", config=CFG)
        for name in ("job-00001.h5.tmp", "job-00002.h5.tmp"):
            (data / "shards" / name).write_bytes(b"half a shard")
        for name in ("job-00003.h5", "job-00004.h5"):  # renamed, never committed
            (data / "shards" / name).write_bytes((data / "shards" / "job-00000.h5").read_bytes())
        with caplog.at_level(logging.WARNING, logger="layerbank"):
            assert store.clean() == {"temp_files": 2, "uncommitted_shards": 2}
        assert [p.name for p in (data / "shards").iterdir()] == ["job-00000.h5"]
        assert [(r.name, r.getMessage()) for r in caplog.records] == [
            ("layerbank.store", "removed 2 temp files and 2 uncommitted shards left by a crash")]
        caplog.clear()
        assert store.clean() == {"temp_files": 0, "uncommitted_shards": 0}
        assert caplog.records == []  # nothing to say when nothing was left
        (data / "shards" / "job-00005.h5.tmp").write_bytes(b"")  # one kind alone is said too
        with caplog.at_level(logging.WARNING, logger="layerbank"):
            assert store.clean() == {"temp_files": 1, "uncommitted_shards": 0}
        assert [r.getMessage() for r in caplog.records] == [
            "removed 1 temp files and 0 uncommitted shards left by a crash"]
    finally:
        store.close()


@pytest.mark.sqlite_only  # an old SQLite catalog; PostgreSQL catalogs record poolings from the start
def test_an_old_catalog_learns_each_shards_poolings_from_its_file(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A catalog written before it recorded poolings: opening the store reads them from
    each file, so a pooling a shard lacks is a miss (recomputed), not a read that fails."""
    data = tmp_path / "data"
    store = FeatureStore(data)
    mean_only = contents(keys_of(store, "a", "b"), 0)
    mean_only.pooled = {"mean": mean_only.pooled["mean"]}
    store.write("job-00000", mean_only, model="local:m", config=CFG)
    store.write("job-00001", contents(keys_of(store, "c"), 1), model="local:m", config=CFG)
    with store.catalog.tx() as db:
        db.execute("UPDATE shards SET poolings = NULL")
    store.close()
    (data / "shards" / "job-00001.h5").write_bytes(b"not an HDF5 file")  # damaged meanwhile
    with caplog.at_level(logging.WARNING, logger="layerbank"):
        store = FeatureStore(data)
    try:
        assert store.catalog.shard_info("job-00000.h5")["poolings"] == ("mean",)  # type: ignore[index]
        assert store.catalog.shards_without_poolings() == ["job-00001.h5"]  # unreadable: left as it was
        assert [r.getMessage().split(":")[0] for r in caplog.records] == [
            "could not read which poolings shard job-00001.h5 holds"]
        a_b = keys_of(store, "a", "b")
        assert store.read_pooled(a_b, "mean").found.tolist() == [True, True]
        assert store.read_pooled(a_b, "cls").found.tolist() == [False, False]
        assert store.catalog.counter("quarantined_shards") == 0
        assert store.read_pooled(keys_of(store, "c"), "mean").found.tolist() == [False]  # its first read
        assert (data / "quarantine" / "job-00001.h5").exists()
    finally:
        store.close()


def test_a_bad_shard_name_is_refused_in_words(store: FeatureStore) -> None:
    with pytest.raises(ValueError) as e:
        store.write("../evil", contents(keys_of(store, "a"), 0), model="local:m", config=CFG)
    assert str(e.value) == "bad shard name '../evil'"


def test_a_shard_whose_commit_fails_is_removed_at_once(store: FeatureStore, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """The catalog refuses the commit (a full disk, say): the written file gives its space
    back now, not at the next start; the caller hears the catalog's own error."""
    import sqlite3

    def full(*args: object, **kw: object) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(store.catalog, "commit_shard", full)
    with pytest.raises(sqlite3.OperationalError, match="^database or disk is full$"):
        store.write("job-00000", contents(keys_of(store, "a"), 0), model="local:m", config=CFG)
    assert list(store.shard_dir.iterdir()) == []
    # the catalog cannot even be read: the file stays for the next start, and the log says so
    monkeypatch.setattr(store.catalog, "shard_names", full)
    with caplog.at_level(logging.ERROR, logger="layerbank"), pytest.raises(sqlite3.OperationalError):
        store.write("job-00001", contents(keys_of(store, "b"), 1), model="local:m", config=CFG)
    assert [p.name for p in store.shard_dir.iterdir()] == ["job-00001.h5"]
    assert [r.getMessage() for r in caplog.records] == ["could not remove uncommitted shard job-00001.h5"]


def test_reading_one_shard_again_reuses_its_open_file(store: FeatureStore) -> None:
    keys = keys_of(store, "a", "b")
    store.write("job-00000", contents(keys, 0), model="local:m", config=CFG)
    path = str(store.shard_dir / "job-00000.h5")

    def open_handles() -> int:
        return sum(1 for fd in os.listdir("/proc/self/fd") if _link(fd) == path)

    for _ in range(5):
        assert store.read_pooled(keys, "mean").found.all()
    assert open_handles() == 1
    store.close()
    assert open_handles() == 0


def _link(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def test_a_read_racing_compaction_finds_every_row_in_the_new_shard(tmp_path: Path) -> None:
    """A reader looks keys up, compaction (another process) merges their shards and deletes
    the files, then the reader reads: it looks the keys up again, never quarantines."""
    from layerbank.cache.compact import compact

    writer = FeatureStore(tmp_path / "data")
    small = keys_of(writer, "s0", "s1", "s2", "s3")
    for i in range(0, 4, 2):
        writer.write(f"a{i}-00000", contents(small[i:i + 2], i), model="local:m", config=CFG)
    big = keys_of(writer, *(f"b{i}" for i in range(12)))
    writer.write("z-00000", contents(big, 9), model="local:m", config=CFG)  # too big to compact
    order = [big[3], small[2], small[0], big[7], small[3], small[1]]
    reader = FeatureStore(tmp_path / "data")
    want = reader.read_pooled(order, "cls").data
    reader.close()  # no open handles: the next read opens the files the stale lookup names
    stale = reader.catalog.lookup(order, poolings=("cls",))
    assert compact(writer, max_rows=10).shards_merged == 2
    real_lookup = reader.catalog.lookup
    calls: list[int] = []

    def lookup_once_stale(keys, need_tokens=False, poolings=()):  # type: ignore[no-untyped-def]
        calls.append(len(keys))
        return {k: stale[k] for k in keys} if len(calls) == 1 else real_lookup(keys, need_tokens, poolings)

    reader.catalog.lookup = lookup_once_stale  # type: ignore[method-assign]
    try:
        got = reader.read_pooled(order, "cls", layers=[1])
        assert calls == [6, 2, 2]  # once for all, once more for each merged shard's keys
        assert got.found.all()
        np.testing.assert_array_equal(got.data, want[:, [1]])
        assert reader.catalog.counter("quarantined_shards") == 0
        assert list((tmp_path / "data" / "quarantine").iterdir()) == []
    finally:
        reader.close()
        writer.close()


def test_nothing_found_is_an_empty_block_for_any_view(store: FeatureStore) -> None:
    from layerbank.cache.views import parse_view

    missing = keys_of(store, "never", "stored")
    res = store.read_pooled(missing, "mean")
    assert res.found.tolist() == [False, False] and res.data.shape == (2, 0, 0)
    view = store.read_view(missing, parse_view("concat_last_4"), "mean", 5)
    assert view.found.tolist() == [False, False] and view.data.shape == (2, 0, 0)


def test_an_unknown_pooling_is_named_with_the_known_ones(store: FeatureStore) -> None:
    from layerbank.cache.poolings import POOLING_NAMES

    with pytest.raises(ValueError) as e:
        store.read_pooled(keys_of(store, "a"), "median")
    assert str(e.value) == f"unknown pooling 'median'; known: {', '.join(POOLING_NAMES)}"


def test_token_reads_of_a_text_stored_without_tokens_are_none_and_quarantine_nothing(store: FeatureStore) -> None:
    from layerbank.cache.shard import TokenRows

    pooled_only, with_tokens = keys_of(store, "p"), keys_of(store, "t")
    store.write("job-00000", contents(pooled_only, 0), model="local:m", config=CFG)
    c = contents(with_tokens, 1)
    states = np.arange(2 * 2 * 4, dtype=np.float32).reshape(2, 2, 4)
    c.tokens = [TokenRows(states, np.array([101, 102], np.int32), np.zeros((2, 2), np.int32),
                          np.array([-1, -1], np.int32))]
    store.write("job-00001", c, model="local:m", config=CFG)
    assert store.read_tokens(pooled_only[0]) is None
    got = store.read_tokens_many(pooled_only + with_tokens, layers=[1])
    assert got[0] is None and got[1] is not None
    np.testing.assert_array_equal(got[1].states, states[:, [1]])
    assert store.catalog.counter("quarantined_shards") == 0
    assert sorted(p.name for p in store.shard_dir.iterdir()) == ["job-00000.h5", "job-00001.h5"]

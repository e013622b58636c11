"""FeatureStore's open shard readers: a budget of handles, least recently used closed first.

A user reading at random over a store of many shards gets the right rows
whatever the budget, and the process holds at most that many shard files
open; under the budget every shard stays open (a reopen costs a read ~0.26 ms,
cache/store.py). The default budget follows the process's descriptor limit.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from layerbank.cache.keys import ExtractionConfig
from layerbank.cache.shard import ShardContents
from layerbank.cache.store import FeatureStore, open_reader_budget

CFG = ExtractionConfig(max_length=64, storage_dtype="float32")
N_SHARDS, ROWS = 40, 6

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc")


def open_shard_files(store: FeatureStore) -> set[str]:
    """The shard files this process holds open (what `ls -l /proc/PID/fd` shows)."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed between listing and reading
            continue
        if target.startswith(str(store.shard_dir) + os.sep):
            out.add(Path(target).name)
    return out


@pytest.fixture
def many_shards(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """40 shards of 6 rows; returns the data directory and each key's mean rows."""
    store = FeatureStore(tmp_path / "data")
    want: dict[str, np.ndarray] = {}
    rng = np.random.default_rng(0)
    try:
        for s in range(N_SHARDS):
            keys = [store.key("local:m", CFG, f"text {s} {i}") for i in range(ROWS)]
            pooled = {p: rng.normal(size=(ROWS, 3, 4)).astype(np.float32) for p in ("mean", "cls", "max")}
            store.write(f"part-{s:03d}", ShardContents(keys, np.full(ROWS, 2), np.zeros(ROWS, bool), pooled),
                        model="local:m", config=CFG)
            want.update({k: pooled["mean"][i] for i, k in enumerate(keys)})
    finally:
        store.close()
    return tmp_path / "data", want


@pytest.mark.parametrize("budget", [5, None])
def test_random_reads_over_many_shards_return_their_rows_within_the_budget(
        many_shards: tuple[Path, dict[str, np.ndarray]], budget: int | None) -> None:
    data_dir, want = many_shards
    store = FeatureStore(data_dir, max_open_readers=budget)
    keys = list(want)
    rnd = random.Random(1)
    try:
        limit = budget or store.max_open_readers
        assert limit >= N_SHARDS or budget is not None  # the default keeps a store this size open
        most = 0
        for _ in range(300):
            asked = rnd.sample(keys, rnd.randint(1, 3)) + ["not stored"]
            got = store.read_pooled(asked, "mean")
            assert got.found.tolist() == [True] * (len(asked) - 1) + [False]
            np.testing.assert_array_equal(got.data[:-1], np.stack([want[k] for k in asked[:-1]]))
            most = max(most, len(open_shard_files(store)))
        assert most == min(limit, N_SHARDS)  # never more than the budget; kept open up to it
    finally:
        store.close()
    assert open_shard_files(store) == set()


def test_deleted_and_quarantined_shards_are_closed(many_shards: tuple[Path, dict[str, np.ndarray]]) -> None:
    data_dir, want = many_shards
    store = FeatureStore(data_dir)
    try:
        keys = list(want)
        store.read_pooled([keys[0], keys[ROWS]], "mean")  # part-000 and part-001 open
        assert open_shard_files(store) == {"part-000.h5", "part-001.h5"}
        store.discard(["part-000.h5"])  # what compaction does with the shards it replaced
        store.quarantine("part-001.h5", "test")
        assert open_shard_files(store) == set()
    finally:
        store.close()


def test_the_default_budget_follows_the_descriptor_limit(tmp_path: Path) -> None:
    assert open_reader_budget(memory_mb=256, nofile=1 << 20) == 426  # memory: ~0.6 MB per open file
    assert open_reader_budget(memory_mb=256, nofile=256) == 128  # half the descriptors
    assert open_reader_budget(memory_mb=1, nofile=256) == 8  # never under 8
    code = ("import resource, sys; from layerbank.cache.store import FeatureStore\n"
            "resource.setrlimit(resource.RLIMIT_NOFILE, (100, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
            "s = FeatureStore(sys.argv[1]); print(s.max_open_readers); s.close()\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "d")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "50"


def test_threads_reading_past_the_budget_never_quarantine_a_sound_shard(
        many_shards: tuple[Path, dict[str, np.ndarray]]) -> None:
    """A handle closed to make room while another thread reads through it must not look like
    damage: the API reads from a thread pool, and a quarantined shard's rows are encoded again."""
    data_dir, want = many_shards
    store = FeatureStore(data_dir, max_open_readers=8)
    keys = list(want)
    failures: list[str] = []

    def reader(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(150):
            asked = rnd.sample(keys, 2)
            got = store.read_pooled(asked, "mean")
            if not got.found.all() or not np.array_equal(got.data, np.stack([want[k] for k in asked])):
                failures.append(f"{asked}: found {got.found.tolist()}")

    try:
        threads = [threading.Thread(target=reader, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        assert store.catalog.counter("quarantined_shards") == 0
        assert len(open_shard_files(store)) <= 8
    finally:
        store.close()


def test_a_store_opened_without_a_budget_takes_the_reader_memory_setting(tmp_path: Path, monkeypatch) -> None:
    # a Bank, the CLI and a probe process open their store without max_open_readers: the
    # operator's LAYERBANK_READER_MEMORY_MB reaches them as it reaches the server and worker
    monkeypatch.setenv("LAYERBANK_READER_MEMORY_MB", "12")
    store = FeatureStore(tmp_path / "a")
    assert store.max_open_readers == 20  # 12 MB at ~0.6 MB a handle
    store.close()
    monkeypatch.delenv("LAYERBANK_READER_MEMORY_MB")
    store = FeatureStore(tmp_path / "b")
    assert store.max_open_readers == 53  # the declared default, 32 MB
    store.close()
    monkeypatch.setenv("LAYERBANK_READER_MEMORY_MB", "lots")
    with pytest.raises(ValueError, match="reader_memory_mb"):
        FeatureStore(tmp_path / "c")

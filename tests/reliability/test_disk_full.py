"""Disk full while writing a shard.

Two ways to run out of room, both real:

- a file-size limit (``RLIMIT_FSIZE``, what ``ulimit -f`` sets) in a child
  process that writes a shard through ``FeatureStore.write``; needs no
  privileges, runs everywhere;
- a small ext4 filesystem mounted (loop device) under a running server's
  ``shards/`` directory and filled up; needs root and ``mount``, skipped
  otherwise (and reported as a skip, not a pass).

Either way the write fails with a message that says what happened and what to
do, the catalog is unchanged, no temporary file is left behind, and once room
is made the same work succeeds. A whole data directory on a small tmpfs, filled
to 0 bytes free, checks the same for every route that writes (507), for
compaction (the shard, or the catalog's commit, does not fit) and for probe and
head jobs (refused before anything is queued).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from layerbank.app.client import JobFailed
from layerbank.cache.catalog import Catalog, catalog_url
from layerbank.cache.compact import CompactSummary, compact
from layerbank.cache.errors import failure_type
from layerbank.cache.keys import ExtractionConfig
from layerbank.cache.shard import ShardContents
from layerbank.cache.space import ShardWriteError
from layerbank.cache.store import FeatureStore
from tests.integration.conftest import ROOT, ServerProcess

from .conftest import phrases

pytestmark = [pytest.mark.reliability]

_CHILD = r"""
import json, resource, signal, sys
import numpy as np
from layerbank.cache.keys import ExtractionConfig
from layerbank.cache.shard import ShardContents
from layerbank.cache.store import FeatureStore

data_dir, limit = sys.argv[1], int(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit: EFBIG, not a killed process
store = FeatureStore(data_dir)
n = 2000
rng = np.random.default_rng(0)
contents = ShardContents([f"{i:064x}" for i in range(n)], np.full(n, 5), np.zeros(n, bool),
                         {p: rng.standard_normal((n, 7, 64)).astype(np.float32) for p in ("mean", "cls", "max")})
if limit:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
try:
    n_bytes = store.write("job-00000", contents, model="m", config=ExtractionConfig(max_length=16))
    print(json.dumps({"ok": n_bytes}))
except OSError as e:
    print(json.dumps({"error": str(e), "type": type(e).__name__, "errno": e.errno}))
"""


def _write_in_child(data_dir: Path, limit: int) -> dict:
    r = subprocess.run([sys.executable, "-c", _CHILD, str(data_dir), str(limit)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr  # no crash: a clean, reported failure
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(120)
def test_file_size_limit_fails_the_write_cleanly_and_a_retry_succeeds(tmp_path: Path) -> None:
    data = tmp_path / "data"
    out = _write_in_child(data, 256 * 1024)
    assert out["type"] == "ShardWriteError" and out["errno"] == 27  # EFBIG
    assert out["error"].startswith("file too large while writing shard job-00000.h5: it needs about ")
    assert "at most 256.0 KiB (ulimit -f)" in out["error"]
    cat = Catalog(data / "catalog.sqlite")
    assert cat.stats() == {"keys": 0, "shards": 0, "bytes": 0}
    assert os.listdir(data / "shards") == []
    # room again (no limit): the same write succeeds and is committed
    out = _write_in_child(data, 0)
    assert out["ok"] > 256 * 1024
    assert cat.stats()["keys"] == 2000 and cat.shard_names() == {"job-00000.h5"}
    cat.close()


def _can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None and shutil.which("mkfs.ext4") is not None


@pytest.fixture
def small_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    """An 8 MiB ext4 filesystem mounted at ``tmp_path/data/shards``."""
    if not _can_mount():
        pytest.skip("needs root, mount and mkfs.ext4 for a loop-mounted filesystem")
    img, mnt = tmp_path / "disk.img", tmp_path / "data" / "shards"
    mnt.mkdir(parents=True)
    with open(img, "wb") as fh:
        fh.truncate(8 * 1024 * 1024)
    subprocess.run(["mkfs.ext4", "-q", "-m", "0", str(img)], check=True, timeout=60)
    r = subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True, text=True,
                       timeout=60, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot loop-mount here: {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], timeout=60, check=False)


def _fill(mnt: Path, leave: int) -> Path:
    """Write a filler file until ``leave`` bytes are free."""
    filler = mnt / "filler"
    free = shutil.disk_usage(mnt).free
    with open(filler, "wb") as fh:
        fh.write(b"\0" * max(0, free - leave))
        fh.flush()
        os.fsync(fh.fileno())
    return filler


@pytest.mark.timeout(240)
def test_full_disk_fails_the_job_clearly_and_a_retry_succeeds(
        small_disk: Path, tiny_model_dir: str) -> None:
    server = ServerProcess(small_disk.parent, {"model": tiny_model_dir, "part_size": 4096,
                                               "heartbeat_seconds": 1})
    try:
        server.start()
        filler = _fill(small_disk, 40 * 1024)
        texts = phrases(2000, 9700)  # one ~1.2 MB shard: does not fit in 40 KiB
        lb = server.client()
        ds = server.post("/v1/datasets", json={"name": "too-big", "texts": texts})
        assert ds.status_code == 202, ds.text
        with pytest.raises(JobFailed) as failed:
            lb.wait(ds.json(), timeout=120)
        job = failed.value.job
        assert job["state"] == "failed"
        assert job["error"].startswith("ShardWriteError: no space left on device while writing "
                                       f"shard {job['id']}-00000.h5: it needs about ")
        assert "free some space and run the job again" in job["error"]
        cat = Catalog(small_disk.parent / "catalog.sqlite")
        assert cat.stats()["keys"] == 0
        assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "lost+found"]
        # the same for a request's misses: a clear error, not wrong or partial data
        r = server.post("/v1/features", json={"texts": texts[:64]})
        assert r.status_code == 507 and r.json()["type"] == "insufficient_storage", r.text
        assert r.json()["error"].startswith("extraction failed: no space left on device while writing shard")
        assert "free some space and run the job again" in r.json()["error"]
        assert server.get("/health").status_code == 200

        filler.unlink()  # room again: the same upload now succeeds
        ds = server.post("/v1/datasets", json={"name": "retry", "texts": texts})
        job = lb.wait(ds.json(), timeout=120)
        assert job["state"] == "succeeded", job
        assert job["result"]["texts_encoded"] == 2000
        assert cat.stats()["keys"] == 2000
        deadline = time.monotonic() + 30
        while server.get(f"/v1/datasets/{ds.json()['id']}/features").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        cat.close()
    finally:
        server.stop()


@pytest.fixture
def small_tmpfs(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A 16 MiB tmpfs holding the whole data directory: catalog, WAL, shards, heads."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount for a tmpfs")
    mnt = tmp_path / "data"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)],
                       capture_output=True, text=True, timeout=60, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], timeout=60, check=False)


def _fill_to_zero(mnt: Path) -> Path:
    """Fill the filesystem until not one more byte fits."""
    filler = mnt / "filler"
    with open(filler, "wb", buffering=0) as fh:  # unbuffered: each write meets the disk
        for size in (1 << 20, 65536, 4096, 1):
            try:
                while fh.write(b"\0" * size):
                    pass
            except OSError:
                pass
    return filler


def _state(server: ServerProcess) -> tuple[Any, ...]:
    """What a refused request must leave unchanged: stored keys, datasets, heads."""
    cat = Catalog(server.data_dir / "catalog.sqlite")
    try:
        keys = cat.stats()["keys"]
    finally:
        cat.close()
    return (keys, [d["id"] for d in server.get("/v1/datasets").json()["data"]],
            [h["id"] for h in server.get("/v1/heads").json()["data"]])


@pytest.mark.timeout(300)
def test_a_full_disk_is_507_everywhere_and_nothing_changes(small_tmpfs: Path, tiny_model_dir: str) -> None:
    server = ServerProcess(small_tmpfs, {"model": tiny_model_dir, "heartbeat_seconds": 1,
                                         "catalog_check_seconds": 3600})
    try:
        server.start()
        texts = phrases(24, 10700)
        labelled = server.post("/v1/datasets", json={"name": "labelled", "texts": texts,
                                                     "labels": [i % 2 for i in range(24)]}).json()
        assert server.wait_job(labelled["job_id"])["state"] == "succeeded"
        filler = _fill_to_zero(small_tmpfs)
        before = _state(server)
        new = phrases(8, 10800)
        asks: dict[str, Callable[[], httpx.Response]] = {
            "features (misses)": lambda: server.post("/v1/features", json={"texts": new}),
            "embeddings (misses)": lambda: server.post("/v1/embeddings", json={"input": new}),
            "dataset upload (JSON)": lambda: server.post("/v1/datasets", json={"name": "n", "texts": new}),
            "dataset upload (file)": lambda: server.post(
                "/v1/datasets", files={"file": ("n.txt", "\n".join(new).encode())}),
        }
        for what, ask in asks.items():
            r = ask()
            assert r.status_code == 507, (what, r.status_code, r.text)
            body = r.json()
            kind = body["error"]["code"] if what.startswith("embeddings") else body["type"]
            assert kind == "insufficient_storage", (what, body)
            assert _state(server) == before, what
        # probe and head jobs are refused before anything is queued (the test below says why)
        for what, path, body in [("probe", "/v1/probes", {"dataset": labelled["id"], "cv": 2}),
                                 ("head", "/v1/heads", {"dataset": labelled["id"], "view": "layer:-1"})]:
            r = server.post(path, json=body)
            assert r.status_code == 507 and r.json()["type"] == "insufficient_storage", (what, r.text)
            assert _state(server) == before, what
        assert server.get("/health").status_code == 200

        filler.unlink()  # room again: the same requests succeed
        for what, ask in asks.items():
            r = ask()
            assert r.status_code in (200, 202), (what, r.status_code, r.text)
    finally:
        server.stop()


# -- compaction: the worker's idle housekeeping, never asked for by a request ----------------
# No route or CLI runs it, so it has no status of its own: on a full disk it raises (the
# worker logs "compaction failed; the store is unchanged" and tries again when next idle),
# and what must hold is that nothing a reader sees changes, and that it works once there is room.

_N_SHARDS, _ROWS = 40, 8
_CFG = ExtractionConfig(max_length=16)  # float16 storage, as served


def _small_shards(store: FeatureStore) -> tuple[list[str], np.ndarray]:
    """40 committed shards of 8 rows, as micro-batched misses leave them; keys and stored rows."""
    rng = np.random.default_rng(5)
    keys: list[str] = []
    for s in range(_N_SHARDS):
        ks = [f"{s:04d}{i:060x}" for i in range(_ROWS)]
        pooled = {p: rng.standard_normal((_ROWS, 3, 32)).astype(np.float32) for p in ("mean", "cls", "max")}
        store.write(f"miss{s:04d}-00000", ShardContents(ks, np.full(_ROWS, 5), np.zeros(_ROWS, bool), pooled),
                    model="m", config=_CFG)
        keys += ks
    res = store.read_pooled(keys, "max")
    assert res.found.all()
    return keys, res.data


def _catalog_view(store: FeatureStore, keys: list[str]) -> tuple[Any, ...]:
    """Everything a reader's lookup depends on: shards, counts, and where each key lives."""
    where = store.catalog.lookup(keys)
    return (sorted(store.catalog.shard_names()), store.catalog.stats(),
            [(where[k].shard, where[k].row) for k in keys])


def _mount_tmpfs(mnt: Path, size: str) -> None:
    mnt.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                       capture_output=True, text=True, timeout=60, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")


@pytest.mark.timeout(120)
def test_compaction_on_a_full_disk_changes_nothing_and_runs_once_there_is_room(small_tmpfs: Path) -> None:
    store = FeatureStore(small_tmpfs)
    try:
        keys, rows = _small_shards(store)
        before = _catalog_view(store, keys)
        files = sorted(p.name for p in store.shard_dir.iterdir())
        filler = _fill_to_zero(small_tmpfs)
        with pytest.raises(ShardWriteError) as full:
            compact(store, max_rows=256)
        assert full.value.errno == errno.ENOSPC and failure_type(full.value) == "storage"
        assert re.fullmatch(r"no space left on device while writing shard compact-[0-9a-f]{12}-00000\.h5: it "
                            r"needs about \S+ KiB, 0 bytes free in .*; free some space and run the job again "
                            r"\(nothing was committed\)", str(full.value)), str(full.value)
        assert _catalog_view(store, keys) == before
        assert sorted(p.name for p in store.shard_dir.iterdir()) == files  # no temp file left
        got = store.read_pooled(keys, "max")  # every row, with the same bits
        assert got.found.all() and np.array_equal(got.data, rows)

        filler.unlink()  # room again: the same compaction succeeds
        s = compact(store, max_rows=256)
        assert s == CompactSummary(shards_merged=_N_SHARDS, shards_written=1, rows=_N_SHARDS * _ROWS, quarantined=0)
        assert [p.name for p in store.shard_dir.iterdir()] == list(store.catalog.shard_names())
        got = store.read_pooled(keys, "max")
        assert got.found.all() and np.array_equal(got.data, rows)
    finally:
        store.close()


@pytest.mark.timeout(120)
@pytest.mark.sqlite_only  # the SQLite file that cannot grow
def test_compaction_whose_catalog_cannot_grow_leaves_no_shard_and_runs_once_there_is_room(tmp_path: Path) -> None:
    """The merged shard fits (shards/ is a filesystem of its own) but the catalog's disk is full:
    the commit fails with SQLite's "database or disk is full" and the written shard is removed."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount for a tmpfs")
    root, shards = tmp_path / "data", tmp_path / "data" / "shards"
    _mount_tmpfs(root, "4m")
    try:
        _mount_tmpfs(shards, "16m")
        store = FeatureStore(root)
        try:
            keys, rows = _small_shards(store)
            before = _catalog_view(store, keys)
            files = sorted(p.name for p in shards.iterdir())
            # an empty WAL: the commit has to grow a file, as it would once the WAL's room is used
            assert store.catalog.conn().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
            filler = _fill_to_zero(root)
            with pytest.raises(sqlite3.OperationalError, match="database or disk is full") as full:
                compact(store, max_rows=256)
            assert failure_type(full.value) == "storage"
            assert _catalog_view(store, keys) == before
            assert sorted(p.name for p in shards.iterdir()) == files  # the merged shard was removed
            got = store.read_pooled(keys, "max")
            assert got.found.all() and np.array_equal(got.data, rows)

            filler.unlink()
            s = compact(store, max_rows=256)
            assert s == CompactSummary(shards_merged=_N_SHARDS, shards_written=1, rows=_N_SHARDS * _ROWS)
            got = store.read_pooled(keys, "max")
            assert got.found.all() and np.array_equal(got.data, rows)
        finally:
            store.close()
    finally:
        subprocess.run(["umount", "-l", str(shards)], timeout=60, check=False)
        subprocess.run(["umount", "-l", str(root)], timeout=60, check=False)


# -- probe and head jobs at 0 bytes free ---------------------------------------------------------
# A head writes files; a probe writes only its job and result rows in the catalog, but at 0 bytes
# free those fit only while SQLite's WAL has room, room that every heartbeat uses up too. So both
# are refused up front (507, nothing queued) below 1 MiB free (app/api/probe_jobs/service.py
# MIN_FREE_BYTES), rather than accepted or refused by a race.

@pytest.mark.sqlite_only  # the race it closes is one for room in SQLite's WAL
@pytest.mark.timeout(300)
def test_probe_and_head_jobs_at_0_bytes_free_are_507_and_run_once_there_is_room(
        small_tmpfs: Path, tiny_model_dir: str) -> None:
    server = ServerProcess(small_tmpfs, {"model": tiny_model_dir, "heartbeat_seconds": 1,
                                         "catalog_check_seconds": 3600})
    try:
        server.start()
        labelled = server.post("/v1/datasets", json={"name": "labelled", "texts": phrases(24, 10900),
                                                     "labels": [i % 2 for i in range(24)]}).json()
        assert server.wait_job(labelled["job_id"])["state"] == "succeeded"
        if catalog_url() is None:  # SQLite: the case that used to race, the WAL checkpointed so its
            db = sqlite3.connect(small_tmpfs / "catalog.sqlite")  # room takes the next rows
            busy, log_frames, done = db.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
            db.close()
            assert busy == 0 and log_frames == done > 0
        filler = _fill_to_zero(small_tmpfs)
        before = (_state(server), [j["id"] for j in server.get("/v1/jobs").json()["data"]])
        asks = [("/v1/probes", {"dataset": labelled["id"], "cv": 2}),
                ("/v1/heads", {"dataset": labelled["id"], "view": "layer:-1"})]
        for path, body in asks:
            r = server.post(path, json=body)
            assert r.status_code == 507, (path, r.text)
            assert set(r.json()) == {"error", "type"} and r.json()["type"] == "insufficient_storage"
            assert re.fullmatch(r"the disk holding the data directory is full \([\d,]+ bytes free; probe and "
                                r"head jobs need at least 1 MiB\); nothing was queued; free some space and "
                                r"send the request again", r.json()["error"]), r.text
            assert (_state(server), [j["id"] for j in server.get("/v1/jobs").json()["data"]]) == before
        assert sorted(p.name for p in (small_tmpfs / "heads").iterdir()) == []

        filler.unlink()  # room again: the same requests run
        probe = server.post(asks[0][0], json=asks[0][1])
        assert probe.status_code == 202, probe.text
        job = server.wait_job(probe.json()["id"])
        assert job["state"] == "succeeded" and job["result"]["task"]["n_examples"] == 24, job
        head = server.post(asks[1][0], json=asks[1][1])
        assert head.status_code == 202, head.text
        assert server.wait_job(head.json()["job_id"])["state"] == "succeeded"
        got = server.get(f"/v1/heads/{head.json()['id']}").json()
        assert got["size_bytes"] == sum(got["files"].values()) > 0
        assert sorted(got["files"]) == ["arrays.npz", "head.json"]
    finally:
        server.stop()

"""cache/leftovers.py: a starting worker removes what a crash left and nothing a live
writer owns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from layerbank.cache.jobs import JobQueue
from layerbank.cache.leftovers import clean_leftovers
from layerbank.cache.request_texts import requests_dir
from layerbank.cache.store import FeatureStore

from .test_store import CFG, contents, key


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_starting_worker_removes_crash_leftovers_only(store: FeatureStore) -> None:
    q = JobQueue(store.catalog)
    store.write("done-00000", contents([key(store, "kept")], 0), model="local:m", config=CFG)
    crashed = q.submit("extract", {})  # queued again after its worker died: nobody writes its files
    live = q.submit("extract", {})
    assert q.claim(f"host:{os.getpid()}:w", ["extract"], 60).id in (crashed, live)  # type: ignore[union-attr]
    running = next(iter(q.running_owners()))
    idle = crashed if running == live else live
    sd = store.shard_dir
    for name in (f"{idle}-00001.h5.tmp", f"{idle}-00000.h5", f"{running}-00002.h5.tmp", "compact-ab12-00000.h5.tmp"):
        (sd / name).write_bytes(b"half a shard")
    heads = store.root / "heads"
    heads.mkdir()
    dead, mine = heads / f".hd_0123456789ab.tmp-{_dead_pid()}-abc123", heads / f".hd_ba9876543210.tmp-{os.getpid()}-x"
    dead.mkdir(), mine.mkdir()
    (store.root / "server.json").write_text(json.dumps({"url": "http://127.0.0.1:1", "pid": _dead_pid()}))
    reqs = requests_dir(store.root)  # big requests' texts (cache/request_texts.py)
    reqs.mkdir()
    for job_id in (running, idle, "0123456789abcdef"):  # the last: its API died, its job is gone
        (reqs / f"{job_id}.json").write_text('["a text"]')
    (reqs / "fedcba9876543210.json.tmp").write_text('["half')
    for p in reqs.iterdir():
        os.utime(p, (time.time() - 600, time.time() - 600))
    (reqs / "00112233445566ff.json").write_text('["its API writes it, then submits its job"]')
    started = time.time() + 1  # this worker started after every file above was written

    removed = clean_leftovers(store, q, started=started)
    assert removed == {"shard_files": 2, "head_temp_dirs": 1, "server_json": 1, "request_texts": 2,
                       "engine_temp_files": 0}
    assert sorted(p.name for p in reqs.iterdir()) == sorted(  # queued, running, just written
        [f"{running}.json", f"{idle}.json", "00112233445566ff.json"])
    assert sorted(p.name for p in sd.iterdir()) == sorted(
        ["done-00000.h5", f"{running}-00002.h5.tmp", "compact-ab12-00000.h5.tmp"])
    assert not dead.exists() and mine.exists()
    assert not (store.root / "server.json").exists()
    assert store.read_pooled([key(store, "kept")], "mean").found.all()


def test_files_newer_than_the_worker_are_left_alone(store: FeatureStore) -> None:
    q = JobQueue(store.catalog)
    job = q.submit("extract", {})
    (store.shard_dir / f"{job}-00000.h5.tmp").write_bytes(b"being written by a worker that just claimed it")
    (store.root / "server.json").write_text(json.dumps({"pid": os.getpid()}))  # a live server
    requests_dir(store.root).mkdir()
    (requests_dir(store.root) / "0123456789abcdef.json").write_text('["its API is writing it"]')
    assert clean_leftovers(store, q, started=time.time() - 60) == {"shard_files": 0, "head_temp_dirs": 0,
                                                                   "server_json": 0, "request_texts": 0,
                                                                   "engine_temp_files": 0}
    assert (requests_dir(store.root) / "0123456789abcdef.json").exists()
    assert (store.shard_dir / f"{job}-00000.h5.tmp").exists() and (store.root / "server.json").exists()


def test_the_worker_cleans_when_it_starts(tiny_api_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    shards = tmp_path / "api0" / "shards"  # the factory's first data directory
    shards.mkdir(parents=True)
    left = shards / "0123456789abcdef-00003.h5.tmp"
    left.write_bytes(b"left by a SIGKILLed worker")
    os.utime(left, (time.time() - 3600, time.time() - 3600))
    api = tiny_api_factory()  # ready once its worker has started (and cleaned)
    assert api.data_dir == tmp_path / "api0"
    assert not left.exists()

"""cache/leftovers.py over a directory where what must stay and what must go are mixed
in every order: each kind is counted, each file is judged on its own (one kept file
never stops the clean-up), and the log line says what went. Written for the mutants
bench/mutation.sh found surviving (the module's own tests: test_leftovers.py)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import pytest

from layerbank.cache.jobs import JobQueue
from layerbank.cache.leftovers import clean_leftovers
from layerbank.cache.request_texts import requests_dir
from layerbank.cache.store import FeatureStore

from .test_store import CFG, contents, key


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _age(path: os.PathLike[str], seconds: float) -> None:
    os.utime(path, (time.time() - seconds, time.time() - seconds))


def test_every_leftover_is_judged_on_its_own_and_counted(store: FeatureStore,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    q = JobQueue(store.catalog)
    store.write("0000-00000", contents([key(store, "kept")], 0), model="local:m", config=CFG)
    sd = store.shard_dir
    # sorted, the files that stay come first: a clean-up that stopped at one would miss the rest
    names = {"0000-00000.h5.tmp": "go",        # a re-run's temp file of a committed part
             "1111-00000.h5.tmp": "go", "2222-00000.h5": "go",
             "3333-00000.h5.tmp": "new",       # written after the worker started: stays
             "aaaa.txt": "stay", "compact-0f-00000.h5.tmp": "stay", "zzzz-00000.h5.tmp": "go"}
    for name, fate in names.items():
        (sd / name).write_bytes(b"x")
        if fate != "new":
            _age(sd / name, 600)
    _age(sd / "0000-00000.h5", 600)  # committed long ago: judged, and kept
    heads = store.root / "heads"
    heads.mkdir()
    for i in range(2):
        (heads / f".hd_{i:012x}.tmp-{_dead_pid()}-abc").mkdir()
    (store.root / "server.json").write_text(json.dumps({"pid": _dead_pid()}))
    started = time.time() - 60  # after the aged files, before the new one
    with caplog.at_level(logging.WARNING, logger="layerbank"):
        removed = clean_leftovers(store, q, started=started)
    assert removed == {"shard_files": 4, "head_temp_dirs": 2, "server_json": 1, "request_texts": 0,
                       "engine_temp_files": 0}
    assert sorted(p.name for p in sd.iterdir()) == ["0000-00000.h5", "3333-00000.h5.tmp", "aaaa.txt",
                                                    "compact-0f-00000.h5.tmp"]
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("layerbank.worker", ("removed crash leftovers: 4 shard files, 2 head temp directories, 1 stale "
                              "server.json, 0 request texts files, 0 engine/measurement temp files"))]
    assert store.read_pooled([key(store, "kept")], "mean").found.all()


def test_request_texts_past_the_grace_go_and_the_rest_stay_in_any_order(store: FeatureStore) -> None:
    q = JobQueue(store.catalog)
    reqs = requests_dir(store.root)
    reqs.mkdir()
    started, grace = time.time(), 60.0  # docs/decisions.md: more than 60 s older than the worker
    old = [f"{i:016x}.json" for i in range(6)]            # their jobs are gone
    fresh = [f"{i + 100:016x}.json" for i in range(6)]    # within the grace: an API may be submitting
    live = [f"{q.submit('extract', {})}.json" for _ in range(6)]  # queued: their texts are still needed
    for i in range(6):  # written interleaved, so a directory listing mixes them in any order
        for name, age in ((old[i], grace + 0.5), (live[i], 600), (fresh[i], grace - 5)):
            (reqs / name).write_text("[]")
            os.utime(reqs / name, (started - age,) * 2)
    removed = clean_leftovers(store, q, started=started)
    assert removed["request_texts"] == 6
    assert sorted(p.name for p in reqs.iterdir()) == sorted(fresh + live)


def test_nothing_to_clean_counts_nothing(store: FeatureStore) -> None:
    assert not requests_dir(store.root).exists()
    assert clean_leftovers(store, JobQueue(store.catalog), started=time.time()) == {
        "shard_files": 0, "head_temp_dirs": 0, "server_json": 0, "request_texts": 0, "engine_temp_files": 0}

"""Jobs survive their worker dying and the whole server restarting mid-queue."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np
import pytest

from cache.catalog import Catalog

from .conftest import ServerProcess, sst_sentences

pytestmark = pytest.mark.integration

# small parts and batches: a 200-text job commits a shard every 32 texts and
# reports progress often, so it is easy to interrupt between shards
SETTINGS = {"part_size": 32, "max_tokens_per_batch": 256, "heartbeat_seconds": 1}


def _job(server: ServerProcess, job_id: str) -> dict[str, Any]:
    return server.get(f"/v1/jobs/{job_id}").json()


def _wait_progress(server: ServerProcess, job_id: str, at_least: int, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = _job(server, job_id)
        assert job["state"] in ("queued", "running"), f"job ended before it could be interrupted: {job}"
        if job["progress"].get("done", 0) >= at_least:
            return job
        assert time.monotonic() < deadline, job
        time.sleep(0.02)


def test_jobs_resume_after_worker_crash_and_server_restart(server_factory) -> None:  # type: ignore[no-untyped-def]
    T0=time.monotonic()
    server: ServerProcess = server_factory(**SETTINGS)
    print('T', round(time.monotonic()-T0,1), 'server: ServerProcess = server_factory(**SETTINGS)', flush=True)
    a_texts, _ = sst_sentences(200, 1100)
    print('T', round(time.monotonic()-T0,1), 'a_texts, _ = sst_sentences(200, 1100)', flush=True)
    b_texts, _ = sst_sentences(200, 1300)
    print('T', round(time.monotonic()-T0,1), 'b_texts, _ = sst_sentences(200, 1300)', flush=True)
    c_texts, _ = sst_sentences(20, 1500)
    print('T', round(time.monotonic()-T0,1), 'c_texts, _ = sst_sentences(20, 1500)', flush=True)

    # 1. the worker process dies mid-job (SIGKILL): serve restarts it, the job resumes
    a = server.post("/v1/datasets", json={"name": "a", "texts": a_texts}).json()
    print('T', round(time.monotonic()-T0,1), 'a = server.post("/v1/datasets", json={"name": "a",', flush=True)
    _wait_progress(server, a["job_id"], 32)
    print('T', round(time.monotonic()-T0,1), '_wait_progress(server, a["job_id"], 32)', flush=True)
    old_worker = server.worker_pid()
    print('T', round(time.monotonic()-T0,1), 'old_worker = server.worker_pid()', flush=True)
    os.kill(old_worker, signal.SIGKILL)
    print('T', round(time.monotonic()-T0,1), 'os.kill(old_worker, signal.SIGKILL)', flush=True)
    job = server.client().wait(a, timeout=180)
    print('T', round(time.monotonic()-T0,1), 'job = server.client().wait(a, timeout=180)', flush=True)
    assert job["attempts"] == 2  # the crash counted as an attempt
    print('T', round(time.monotonic()-T0,1), 'assert job["attempts"] == 2  # the crash counted a', flush=True)
    assert job["result"]["cache_hits"] >= 32  # parts committed before the crash were kept
    print('T', round(time.monotonic()-T0,1), 'assert job["result"]["cache_hits"] >= 32  # parts ', flush=True)
    assert job["result"]["cache_hits"] + job["result"]["texts_encoded"] == 200
    print('T', round(time.monotonic()-T0,1), 'assert job["result"]["cache_hits"] + job["result"]', flush=True)
    assert server.worker_pid() != old_worker
    print('T', round(time.monotonic()-T0,1), 'assert server.worker_pid() != old_worker', flush=True)
    assert server.metric("layerbank_worker_restarts_total") == 1
    print('T', round(time.monotonic()-T0,1), 'assert server.metric("layerbank_worker_restarts_to', flush=True)

    # 2. the whole server is killed mid-queue: one job running, one queued behind it
    b = server.post("/v1/datasets", json={"name": "b", "texts": b_texts}).json()
    print('T', round(time.monotonic()-T0,1), 'b = server.post("/v1/datasets", json={"name": "b",', flush=True)
    c = server.post("/v1/datasets", json={"name": "c", "texts": c_texts}).json()
    print('T', round(time.monotonic()-T0,1), 'c = server.post("/v1/datasets", json={"name": "c",', flush=True)
    _wait_progress(server, b["job_id"], 32)
    print('T', round(time.monotonic()-T0,1), '_wait_progress(server, b["job_id"], 32)', flush=True)
    assert _job(server, c["job_id"])["state"] == "queued"
    print('T', round(time.monotonic()-T0,1), 'assert _job(server, c["job_id"])["state"] == "queu', flush=True)
    server.kill()
    print('T', round(time.monotonic()-T0,1), 'server.kill()', flush=True)
    server.start()  # same data directory, same port
    print('T', round(time.monotonic()-T0,1), 'server.start()  # same data directory, same port', flush=True)
    lb = server.client()
    print('T', round(time.monotonic()-T0,1), 'lb = server.client()', flush=True)
    job_b = lb.wait(b, timeout=180)
    print('T', round(time.monotonic()-T0,1), 'job_b = lb.wait(b, timeout=180)', flush=True)
    job_c = lb.wait(c, timeout=180)
    print('T', round(time.monotonic()-T0,1), 'job_c = lb.wait(c, timeout=180)', flush=True)
    assert job_b["result"]["cache_hits"] >= 32
    print('T', round(time.monotonic()-T0,1), 'assert job_b["result"]["cache_hits"] >= 32', flush=True)
    assert job_b["result"]["cache_hits"] + job_b["result"]["texts_encoded"] == 200
    print('T', round(time.monotonic()-T0,1), 'assert job_b["result"]["cache_hits"] + job_b["resu', flush=True)
    assert job_c["result"]["texts_encoded"] == 20
    print('T', round(time.monotonic()-T0,1), 'assert job_c["result"]["texts_encoded"] == 20', flush=True)
    # the worker was stopped by its parent's death and handed the job back cleanly
    assert job_b["attempts"] == 1
    print('T', round(time.monotonic()-T0,1), 'assert job_b["attempts"] == 1', flush=True)

    # every text stored exactly once, no temporary files left, every row readable
    cat = Catalog(server.data_dir / "catalog.sqlite")
    print('T', round(time.monotonic()-T0,1), 'cat = Catalog(server.data_dir / "catalog.sqlite")', flush=True)
    assert cat.stats()["keys"] == 420
    print('T', round(time.monotonic()-T0,1), 'assert cat.stats()["keys"] == 420', flush=True)
    cat.close()
    print('T', round(time.monotonic()-T0,1), 'cat.close()', flush=True)
    assert not list((server.data_dir / "shards").glob("*.tmp"))
    print('T', round(time.monotonic()-T0,1), 'assert not list((server.data_dir / "shards").glob(', flush=True)
    datasets = {d["name"]: d for d in lb.datasets()}
    print('T', round(time.monotonic()-T0,1), 'datasets = {d["name"]: d for d in lb.datasets()}', flush=True)
    assert set(datasets) == {"a", "b", "c"}
    print('T', round(time.monotonic()-T0,1), 'assert set(datasets) == {"a", "b", "c"}', flush=True)
    x = lb.dataset_features(b["id"])
    print('T', round(time.monotonic()-T0,1), 'x = lb.dataset_features(b["id"])', flush=True)
    assert x.shape == (200, 384) and np.isfinite(x).all() and (np.abs(x).sum(axis=1) > 0).all()
    print('T', round(time.monotonic()-T0,1), 'assert x.shape == (200, 384) and np.isfinite(x).al', flush=True)
    again = server.post("/v1/features", json={"texts": b_texts[:50]}).json()
    print('T', round(time.monotonic()-T0,1), 'again = server.post("/v1/features", json={"texts":', flush=True)
    assert again["usage"]["cache_hits"] == 50
    print('T', round(time.monotonic()-T0,1), 'assert again["usage"]["cache_hits"] == 50', flush=True)
    np.testing.assert_array_equal(np.array([d["embedding"] for d in again["data"]], np.float32), x[:50])
    print('T', round(time.monotonic()-T0,1), 'np.testing.assert_array_equal(np.array([d["embeddi', flush=True)

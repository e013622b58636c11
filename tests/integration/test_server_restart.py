"""Jobs survive their worker dying and the whole server restarting mid-queue."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np
import pytest

from layerbank.cache.catalog import Catalog

from .conftest import ServerProcess, sst_sentences

pytestmark = pytest.mark.integration

# small parts and batches: a 200-text job commits a shard every 32 texts and
# reports progress often, so it is easy to interrupt between shards
SETTINGS = {"part_size": 32, "max_tokens_per_batch": 256, "heartbeat_seconds": 1}


def _job(server: ServerProcess, job_id: str) -> dict[str, Any]:
    return server.get(f"/v1/jobs/{job_id}").json()


def _wait_committed(server: ServerProcess, job_id: str, parts: int = 1, timeout: float = 300) -> None:
    """Wait for a state, not a time: ``parts`` of the job's shards committed in the catalog.

    Progress counts texts encoded, which runs ahead of the shard's commit; under load
    (load average 9-10) a kill at "32 done" could land before the first commit."""
    deadline = time.monotonic() + timeout
    cat = Catalog(server.data_dir / "catalog.sqlite")
    try:
        while sum(n.startswith(job_id + "-") for n in cat.shard_names()) < parts:
            job = _job(server, job_id)
            assert job["state"] in ("queued", "running"), f"job ended before it could be interrupted: {job}"
            assert time.monotonic() < deadline, job
            time.sleep(0.02)
    finally:
        cat.close()


def test_jobs_resume_after_worker_crash_and_server_restart(server_factory) -> None:  # type: ignore[no-untyped-def]
    server: ServerProcess = server_factory(**SETTINGS)
    a_texts, _ = sst_sentences(200, 1100)
    b_texts, _ = sst_sentences(200, 1300)
    c_texts, _ = sst_sentences(20, 1500)

    # 1. the worker process dies mid-job (SIGKILL): serve restarts it, the job resumes
    a = server.post("/v1/datasets", json={"name": "a", "texts": a_texts}).json()
    _wait_committed(server, a["job_id"])  # 32 texts stored
    old_worker = server.worker_pid()
    os.kill(old_worker, signal.SIGKILL)
    job = server.client().wait(a, timeout=180)
    assert job["attempts"] == 2  # the crash counted as an attempt
    assert job["result"]["cache_hits"] >= 32  # parts committed before the crash were kept
    assert job["result"]["cache_hits"] + job["result"]["texts_encoded"] == 200
    assert server.worker_pid() != old_worker
    assert server.metric("layerbank_worker_restarts_total") == 1

    # 2. the whole server is killed mid-queue: one job running, one queued behind it
    b = server.post("/v1/datasets", json={"name": "b", "texts": b_texts}).json()
    c = server.post("/v1/datasets", json={"name": "c", "texts": c_texts}).json()
    _wait_committed(server, b["job_id"])
    assert _job(server, c["job_id"])["state"] == "queued"
    server.kill()
    server.start()  # same data directory, same port
    lb = server.client()
    job_b = lb.wait(b, timeout=180)
    job_c = lb.wait(c, timeout=180)
    assert job_b["result"]["cache_hits"] >= 32
    assert job_b["result"]["cache_hits"] + job_b["result"]["texts_encoded"] == 200
    assert job_c["result"]["texts_encoded"] == 20
    # the worker was stopped by its parent's death and handed the job back cleanly
    assert job_b["attempts"] == 1

    # every text stored exactly once, no temporary files left, every row readable
    cat = Catalog(server.data_dir / "catalog.sqlite")
    assert cat.stats()["keys"] == 420
    cat.close()
    assert not list((server.data_dir / "shards").glob("*.tmp"))
    datasets = {d["name"]: d for d in lb.datasets()}
    assert set(datasets) == {"a", "b", "c"}
    x = lb.dataset_features(b["id"])
    assert x.shape == (200, 384) and np.isfinite(x).all() and (np.abs(x).sum(axis=1) > 0).all()
    again = server.post("/v1/features", json={"texts": b_texts[:50]}).json()
    assert again["usage"]["cache_hits"] == 50
    np.testing.assert_array_equal(np.array([d["embedding"] for d in again["data"]], np.float32), x[:50])

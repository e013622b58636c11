"""layerbank.workers.worker: outcomes, cancellation, clean stop, orphans, urgent work inside long jobs."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from layerbank.cache.datasets import DatasetStore
from layerbank.cache.jobs import Job, JobQueue
from layerbank.workers.jobs_registry import ENCODE_PRIORITY, JOB_KINDS, register_kind
from layerbank.workers.worker import JobContext, Worker, WorkerOptions

FAST = WorkerOptions(heartbeat_seconds=0.05, poll_interval_s=0.002, progress_interval_s=0.01)


@pytest.fixture
def loop_kind() -> Iterator[dict[str, Any]]:
    """A job kind that runs until told to stop, reporting progress."""
    seen: dict[str, Any] = {"started": threading.Event()}

    @register_kind("test-loop")
    def run(ctx: JobContext) -> dict[str, int]:
        seen["started"].set()
        i = 0
        while ctx.should_continue():
            i += 1
            ctx.progress({"done": i, "total": None})
            time.sleep(0.005)
            if i > 4000:
                return {"loops": i}
        raise RuntimeError("stopped")

    yield seen
    JOB_KINDS.pop("test-loop")


def _wait(q: JobQueue, job_id: str, state: str, timeout: float = 10) -> Job:
    deadline = time.monotonic() + timeout
    while (job := q.get(job_id)).state != state:  # type: ignore[union-attr]
        assert time.monotonic() < deadline, job
        time.sleep(0.005)
    return job  # type: ignore[return-value]


def _running(worker: Worker) -> threading.Thread:
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    return t


def test_failures_are_recorded_with_a_clear_message(store, tiny_encoder) -> None:  # type: ignore[no-untyped-def]
    w = Worker(store, tiny_encoder, FAST)
    q = w.queue
    gone = q.submit("extract", {"dataset_id": "ds_gone"})
    odd = q.submit("nope", {})
    w.run_job(q.claim(w.id, ["extract"], 30))  # type: ignore[arg-type]
    w.run_job(q.claim(w.id, ["nope"], 30))  # type: ignore[arg-type]
    assert q.get(gone).error == "dataset ds_gone was deleted before it was extracted"  # type: ignore[union-attr]
    assert q.get(odd).state == "failed"  # type: ignore[union-attr]
    assert q.get(odd).error.startswith("this worker cannot run jobs of kind 'nope'")  # type: ignore[union-attr]
    bad_model = q.submit("encode", {"texts": ["a"], "model": "local:other"})
    w.run_job(q.claim(w.id, ["encode"], 30))  # type: ignore[arg-type]
    assert "not 'local:other'" in q.get(bad_model).error  # type: ignore[union-attr, operator]


def test_urgent_encodes_run_between_the_batches_of_a_dataset(store, tiny_encoder) -> None:  # type: ignore[no-untyped-def]
    w = Worker(store, tiny_encoder, WorkerOptions(max_tokens=16, part_size=4))
    q, ds = w.queue, DatasetStore(store.catalog)
    texts = [f"a dataset sentence number {i}" for i in range(12)]
    d = ds.create("d", texts, model="m", config=tiny_encoder.config.canonical(),
                  meta={"fingerprint": tiny_encoder.fingerprint})
    extract_id = q.submit("extract", {"dataset_id": d.id})
    encode_id = q.submit("encode", {"texts": ["an urgent request"]}, priority=ENCODE_PRIORITY)
    w.run_job(q.claim(w.id, ["extract"], 30))  # type: ignore[arg-type]
    ext, enc = q.get(extract_id), q.get(encode_id)
    assert ext.state == enc.state == "succeeded"  # type: ignore[union-attr]
    # the request was answered inside the dataset's job, after its first batch
    assert ext.started < enc.finished < ext.finished  # type: ignore[union-attr, operator]
    assert ext.result["texts_encoded"] == 12 and ext.progress["done"] == 12  # type: ignore[union-attr, index]


def test_cancel_stops_a_running_job(store, tiny_encoder, loop_kind) -> None:  # type: ignore[no-untyped-def]
    w = Worker(store, tiny_encoder, FAST)
    t = _running(w)
    job_id = w.queue.submit("test-loop", {})
    assert loop_kind["started"].wait(5)
    time.sleep(0.05)
    w.queue.cancel(job_id)
    job = _wait(w.queue, job_id, "cancelled")
    assert job.progress["done"] > 0 and job.error is None
    w.stop()
    t.join(5)


def test_a_clean_stop_hands_the_job_back_uncounted(store, tiny_encoder, loop_kind) -> None:  # type: ignore[no-untyped-def]
    w = Worker(store, tiny_encoder, FAST)
    t = _running(w)
    job_id = w.queue.submit("test-loop", {})
    assert loop_kind["started"].wait(5)
    w.stop()
    t.join(5)
    job = w.queue.get(job_id)
    assert (job.state, job.attempts) == ("queued", 0)  # type: ignore[union-attr]
    seen = w.queue.live_workers(60)
    assert seen[0]["state"] == "stopped"


def test_jobs_of_a_dead_worker_are_requeued_at_start(store, tiny_encoder) -> None:  # type: ignore[no-untyped-def]
    w = Worker(store, tiny_encoder, FAST)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    q = w.queue
    job_id = q.submit("extract", {"dataset_id": "x"})
    owner = f"{w.host}:{dead}:abc"
    q.claim(owner, ["extract"], 3600)
    live = q.submit("extract", {"dataset_id": "y"})
    q.claim(f"{w.host}:{w.id.split(':')[1]}:live", ["extract"], 3600)  # this process: alive
    assert w.release_orphans() == 1
    job = q.get(job_id)
    assert (job.state, job.attempts) == ("queued", 1)  # type: ignore[union-attr]
    assert q.get(live).state == "running"  # type: ignore[union-attr]

"""The micro-batcher against a real job queue, with this test playing the worker."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from layerbank.app.api.batcher import ENCODE_PRIORITY, Batcher, failure
from layerbank.app.api.errors import ExtractionFailed, InsufficientStorage, Overloaded
from layerbank.cache.catalog import Catalog
from layerbank.cache.jobs import JobQueue


class FakeWorker:
    """Claims encode jobs and finishes (or fails) them; records each job's texts."""

    def __init__(self, path: Path, fail: bool = False) -> None:
        self.queue = JobQueue(Catalog(path))
        self.fail = fail
        self.batches: list[list[str]] = []
        self.release = threading.Event()
        self.release.set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            self.release.wait()
            job = self.queue.claim("fake", ["encode"], 30)
            if job is None:
                self.stop.wait(0.002)
                continue
            self.batches.append(job.payload["texts"])
            if self.fail:
                self.queue.fail(job.id, "fake", "ValueError: the tokenizer choked")
            else:
                self.queue.finish(job.id, "fake", {"texts_encoded": len(job.payload["texts"])})


@pytest.fixture
def setup(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "catalog.sqlite"
    queue = JobQueue(Catalog(path))
    workers: list[FakeWorker] = []

    def make_worker(**kw: bool) -> FakeWorker:
        w = FakeWorker(path, **kw)
        workers.append(w)
        return w

    yield queue, make_worker
    for w in workers:
        w.stop.set()
        w.release.set()
        w.thread.join(5)


def test_requests_within_the_window_share_one_job(setup) -> None:  # type: ignore[no-untyped-def]
    queue, make_worker = setup
    worker = make_worker()

    hints: list = []

    async def on_done(batch_hints: list) -> None:
        hints.append(sorted(batch_hints))

    async def main() -> None:
        b = Batcher(queue, window_ms=50, max_pending=100, on_done=on_done)
        await asyncio.gather(*(b.encode([f"t{i}", "shared"], model="fp", hint=i) for i in range(10)))
        assert b.stats.batches == 1 and b.stats.requests == 10
        assert b.waiting == 0
        assert hints == [list(range(10))]  # once per batch, with every request's hint

    asyncio.run(main())
    assert len(worker.batches) == 1
    assert sorted(worker.batches[0]) == sorted([f"t{i}" for i in range(10)] + ["shared"])
    job = queue.list()[0]
    assert job.kind == "encode" and job.payload["model"] == "fp"
    row = queue.catalog.conn().execute("SELECT priority FROM jobs WHERE id=?", (job.id,)).fetchone()
    assert row[0] == ENCODE_PRIORITY


def test_requests_at_different_precisions_never_share_a_job(setup) -> None:  # type: ignore[no-untyped-def]
    queue, make_worker = setup
    make_worker()

    async def main() -> None:
        b = Batcher(queue, window_ms=50, max_pending=100)
        await asyncio.gather(b.encode(["a"], model="fp", precision="bf16"),
                             b.encode(["b"], model="fp", precision=None),
                             b.encode(["c"], model="fp", precision="bf16"))

    asyncio.run(main())
    # each job says which precision its keys were made for; the worker computes at it
    got = sorted((sorted(j.payload["texts"]), j.payload["precision"]) for j in queue.list())
    # in arrival order a batch ends where the precision changes: a | b | c
    assert got == [(["a"], "bf16"), (["b"], None), (["c"], "bf16")]


def test_arrivals_during_a_busy_encoder_form_the_next_batch(setup) -> None:  # type: ignore[no-untyped-def]
    queue, make_worker = setup
    worker = make_worker()
    worker.release.clear()  # the encoder is busy: nothing is claimed yet

    async def main() -> None:
        b = Batcher(queue, window_ms=1, max_pending=100, max_inflight=1)
        first = asyncio.create_task(b.encode(["first"]))
        await asyncio.sleep(0.05)  # the first batch is submitted and waits for the worker
        rest = [asyncio.create_task(b.encode([f"later {i}"])) for i in range(5)]
        await asyncio.sleep(0.05)
        worker.release.set()
        await asyncio.gather(first, *rest)
        assert b.stats.batches == 2

    asyncio.run(main())
    assert worker.batches == [["first"], [f"later {i}" for i in range(5)]]


def test_over_max_pending_is_overloaded_and_failures_reach_every_waiter(setup) -> None:  # type: ignore[no-untyped-def]
    queue, make_worker = setup
    worker = make_worker(fail=True)
    worker.release.clear()

    async def main() -> None:
        b = Batcher(queue, window_ms=1, max_pending=3)
        waiting = [asyncio.create_task(b.encode([f"x{i}"])) for i in range(3)]
        await asyncio.sleep(0.02)
        with pytest.raises(Overloaded) as over:
            await b.encode(["one too many"])
        assert over.value.limit == "max_queue_depth" and "max_queue_depth=3" in over.value.message
        worker.release.set()
        results = await asyncio.gather(*waiting, return_exceptions=True)
        assert all(isinstance(r, ExtractionFailed) for r in results)
        assert "the tokenizer choked" in str(results[0])
        assert b.waiting == 0

    asyncio.run(main())


def test_a_full_disk_is_507_and_any_other_failure_500() -> None:
    # the message workers/worker.py records for layerbank.cache.space.ShardWriteError
    what = ("no space left on device while writing shard j-00000.h5: it needs about 1.2 MiB, "
            "40.0 KiB are free; free some space and run the job again")
    disk = failure("ShardWriteError: " + what, "storage")  # the type the runner stored
    assert isinstance(disk, InsufficientStorage)
    assert (disk.status, disk.type) == (507, "insufficient_storage")
    assert disk.message == "extraction failed: " + what
    other = failure("RuntimeError: CUDA error: an illegal memory access")
    assert type(other) is ExtractionFailed and other.status == 500
    assert other.message == "extraction failed: RuntimeError: CUDA error: an illegal memory access"

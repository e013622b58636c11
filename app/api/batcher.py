"""Micro-batching of cache misses: concurrent requests share one encoder job.

A request with misses calls ``await batcher.encode(texts)``. The first miss
to arrive opens a window of ``batch_window_ms``; every miss that arrives
within it joins the same batch. The batch becomes ONE ``encode`` job (high
priority) on the queue; the worker encodes and commits it; every request of
the batch then reads its rows from the store.

At most ``max_inflight`` batches are submitted and unfinished at once (one
running, one waiting by default). Misses that arrive while both are taken
keep collecting, so under load a batch holds everything that arrived during
the previous encode: continuous batching with one worker.

Waiting: the batcher polls its job's row every ``poll_s`` (2 ms) with
``asyncio.sleep``. One poll per in-flight batch, not per request: a primary
key read of ~20 us, against encodes of 10+ ms, in exchange for no channel
between the processes beyond the catalog they already share.

Big batches (over a million characters of texts) pass their texts in a file
beside the catalog rather than in the job row, so that the 2 ms poll and the
worker's lease renewals stay cheap (``layerbank.cache.request_texts``).

Catalog faults: a catalog that cannot be reached while a batch is submitted or
waited on is a 503 with ``Retry-After`` for every waiter, a full disk a 507
(``errors.catalog_failure``), never a 500 ``extraction_failed``.

Overload: more than ``max_pending`` requests waiting for misses is a 429
(``max_queue_depth``), never an unbounded queue.

Example::

    batcher = Batcher(queue, window_ms=5, max_pending=64)
    await batcher.encode(["a text", "another"], model=fingerprint)  # returns once both are stored
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from layerbank.app.api.errors import ApiError, Overloaded, Timeout, catalog_failure, job_failure
from layerbank.cache import request_texts
from layerbank.cache.errors import failure_type
from layerbank.cache.jobs import JobQueue

__all__ = ["ENCODE_PRIORITY", "BatchStats", "Batcher", "failure"]

ENCODE_PRIORITY = 100  # layerbank.workers.jobs_registry.ENCODE_PRIORITY (app/ does not import workers/)
log = logging.getLogger("layerbank.api")


def failure(error: str, error_type: str | None = None) -> ApiError:
    """The HTTP error for a failed encode job: from its stored ``error_type``
    (``errors.job_failure``: 507 for a full disk, whose message names the shard,
    the bytes needed and what to do), never from the message's words."""
    return job_failure(error, error_type)


@dataclass
class BatchStats:
    batches: int = 0
    texts: int = 0
    requests: int = 0
    sizes: list[int] = field(default_factory=list)  # texts per batch, the most recent 1000


@dataclass
class _Waiter:
    texts: list[str]
    want_tokens: bool
    model: str | None
    precision: str | None
    hint: Any
    future: asyncio.Future[None]


class Batcher:
    def __init__(self, queue: JobQueue, *, window_ms: float, max_pending: int,
                 poll_s: float = 0.002, max_inflight: int = 2,
                 timeout_s: float = 600.0, max_batch_texts: int = 4096,
                 on_done: Callable[[list[Any]], Awaitable[None]] | None = None,
                 data_dir: Path | None = None) -> None:
        self.queue = queue
        # where a big batch's texts go instead of the job row (cache/request_texts.py); None: inline
        self.data_dir = data_dir
        self.window_s = window_ms / 1000.0
        self.max_pending = max_pending
        self.poll_s = poll_s
        self.max_inflight = max_inflight
        self.timeout_s = timeout_s
        self.max_batch_texts = max_batch_texts
        self.on_done = on_done  # called with the waiters' hints once their batch is stored
        self.stats = BatchStats()
        self._pending: list[_Waiter] = []
        self._waiting = 0  # requests between encode() entry and exit
        self._inflight = 0
        self._opened: float | None = None  # when the current window opened
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def waiting(self) -> int:
        """Requests waiting for misses (the queue depth the 429 limit applies to)."""
        return self._waiting

    async def encode(self, texts: list[str], *, model: str | None = None,
                     precision: str | None = None, want_tokens: bool = False,
                     hint: Any = None) -> None:
        """Return once every text is stored; raise ExtractionFailed/Timeout/Overloaded.

        ``model``: the fingerprint the caller computed keys with; a worker
        serving another model fails the job instead of storing other numbers.
        ``precision``: the resolved mode the keys were made for (None: as
        served); waiters at different precisions never share a job.
        """
        if not texts:
            return
        if self._waiting >= self.max_pending:
            raise Overloaded(f"overloaded: {self._waiting} requests are already waiting for the "
                             f"encoder (max_queue_depth={self.max_pending}); retry shortly",
                             limit="max_queue_depth", headers={"Retry-After": "1"})
        self._waiting += 1
        try:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._pending.append(_Waiter(list(texts), want_tokens, model, precision, hint, fut))
            self.stats.requests += 1
            if self._opened is None:
                self._opened = time.monotonic()
                self._timer = asyncio.get_running_loop().call_later(self.window_s, self._maybe_flush)
            try:
                await asyncio.wait_for(asyncio.shield(fut), self.timeout_s)
            except TimeoutError:
                raise Timeout(f"the encoder did not answer within {self.timeout_s:.0f} s") from None
        finally:
            self._waiting -= 1

    def _maybe_flush(self) -> None:
        """Submit the collected misses if the window is over and a slot is free."""
        self._timer = None
        if not self._pending or self._opened is None:
            self._opened = None
            return
        remaining = self.window_s - (time.monotonic() - self._opened)
        if remaining > 1e-4:  # the timer fired early
            self._timer = asyncio.get_running_loop().call_later(remaining, self._maybe_flush)
            return
        if self._inflight >= self.max_inflight:
            return  # _done() flushes when a slot frees
        take: list[_Waiter] = []
        n = 0
        while self._pending:
            w = self._pending[0]
            if take and (n + len(w.texts) > self.max_batch_texts or
                         (w.model, w.precision) != (take[0].model, take[0].precision)):
                break
            take.append(self._pending.pop(0))
            n += len(w.texts)
        self._opened = time.monotonic() if self._pending else None
        if self._pending:
            self._timer = asyncio.get_running_loop().call_later(self.window_s, self._maybe_flush)
        self._inflight += 1
        task = asyncio.get_running_loop().create_task(self._run(take))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._inflight -= 1
        if self._pending and self._timer is None:
            self._maybe_flush()

    async def _run(self, waiters: list[_Waiter]) -> None:
        texts = list(dict.fromkeys(t for w in waiters for t in w.texts))
        want_tokens = any(w.want_tokens for w in waiters)
        self.stats.batches += 1
        self.stats.texts += len(texts)
        self.stats.sizes = (self.stats.sizes + [len(texts)])[-1000:]
        job_id = uuid.uuid4().hex[:16]
        part: dict[str, Any] = {"texts": texts}
        caught: BaseException | None = None
        try:
            if self.data_dir is not None:  # a file for big batches, written off the event loop
                part = await asyncio.to_thread(request_texts.to_payload, self.data_dir, job_id, texts)
            self.queue.submit("encode", {**part, "model": waiters[0].model,
                                         "precision": waiters[0].precision,
                                         "want_tokens": want_tokens},
                              priority=ENCODE_PRIORITY, job_id=job_id)
            error, error_type = await self._wait(job_id)
        except Exception as e:  # the catalog itself failed (full disk: 507): every waiter hears it
            error, error_type, caught = f"{type(e).__name__}: {e}", failure_type(e), e
        finally:  # the job is over (or given up on): its texts file is not needed any more
            if self.data_dir is not None:
                request_texts.discard(self.data_dir, part)
        if error is None and self.on_done is not None:
            try:  # e.g. read the whole batch's rows at once, rather than once per request
                await self.on_done([w.hint for w in waiters])
            except Exception:
                log.exception("after-batch hook failed; requests read their own rows")
        for w in waiters:
            if w.future.done():
                continue
            if error is None:
                w.future.set_result(None)
            else:  # unreachable catalog: 503 + Retry-After; its disk full: 507 (errors.catalog_failure)
                answer = catalog_failure(caught) if caught is not None else None
                w.future.set_exception(answer or failure(error, error_type))

    async def _wait(self, job_id: str) -> tuple[str | None, str | None]:
        """(None, None) once the job succeeded, else its (error, error_type)."""
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            job = self.queue.get(job_id)
            if job is None:
                return f"job {job_id} disappeared", None
            if job.state == "succeeded":
                return None, None
            if job.state in ("failed", "cancelled"):
                return job.error or f"job {job_id} was {job.state}", job.error_type
            await asyncio.sleep(self.poll_s)
        self.queue.cancel(job_id)
        return f"job {job_id} did not finish within {self.timeout_s:.0f} s", None

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        if self._timer is not None:
            self._timer.cancel()

"""The worker: one process per device that loads the encoder once and runs
jobs from the queue in the catalog.

Contract
--------
- Claims jobs with ``JobQueue.claim(owner, kinds, lease_s)``; the most urgent
  first (``encode`` jobs are submitted with ``ENCODE_PRIORITY``, dataset
  ``extract`` jobs with 0).
- While a job runs, a heartbeat thread renews its lease every
  ``heartbeat_seconds``; handlers report progress through ``JobContext.progress``
  (written to the job row at most every ``progress_interval_s``). A heartbeat
  that returns False (the job was cancelled, or its lease went to another
  worker) makes ``JobContext.should_continue()`` False; the handler stops at
  its next batch and the job is marked cancelled (or left to its new owner).
- Outcome: ``finish`` with the handler's JSON result, ``fail`` with
  ``"<ExceptionType>: <message>"`` and its failure type, or, on a clean
  shutdown, ``release`` (the job goes back to the queue without counting an
  attempt). Claiming, the lease's heartbeat and the outcome are the one job
  runner's (``layerbank.cache.runner``), which the probe pool uses too; this
  module adds the encoder, urgent work and compaction.
- At start, running jobs owned by a dead worker process on this host are
  released at once (a crash or a restart of ``layerbank serve`` does not wait
  for the lease to expire). Liveness is recorded with ``worker_seen`` every
  ``heartbeat_seconds`` from its own thread, so a long batch does not look
  like a dead worker.

Urgent work inside long jobs: ``JobContext.should_continue()`` is called by
``layerbank.workers.extract.extract`` before every part and every token-budget batch.
It first runs any waiting ``encode`` jobs (the synchronous misses of HTTP
requests) to completion, one level deep, so a large dataset or a huge request
delays a small request by at most one batch of its own, never by all of it.

Kinds are a registry: ``workers/jobs_registry.py`` says how to add one.

Example (in-process, as the unit tests do)::

    worker = Worker(store, encoder, WorkerOptions(poll_interval_s=0.002))
    threading.Thread(target=worker.run, daemon=True).start()
    ...
    worker.stop()
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from layerbank.cache.compact import compact
from layerbank.cache.datasets import DatasetStore
from layerbank.cache.jobs import Job, JobQueue
from layerbank.cache.leftovers import clean_leftovers
from layerbank.cache.outage import OutageWait, catalog_outage
from layerbank.cache.runner import Claimer, Lease, release_orphans, run_claimed
from layerbank.cache.store import FeatureStore

from .backends import EmbeddedBackend, ExtractionBackend
from .encoder import Encoder, ModelLoadError
from .jobs_registry import (
    ENCODE_PRIORITY,
    JOB_KINDS,
    KIND_MODULES,
    URGENT_KINDS,
    JobContext,
    JobError,
    register_kind,
)
from .model_pool import ModelChanged, ModelPool, UnknownModel

__all__ = [
    "ENCODE_PRIORITY",
    "JOB_KINDS",
    "KIND_MODULES",
    "URGENT_KINDS",
    "JobContext",
    "JobError",
    "Worker",
    "WorkerOptions",
    "register_kind",
]

log = logging.getLogger("layerbank.worker")

_MAX_URGENT_PER_CHECK = 16  # bounded, so a stream of requests cannot starve a dataset forever


@dataclass
class WorkerOptions:
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 5.0
    part_size: int = 2048
    max_tokens: int | None = None  # None: the device's default (layerbank.workers.batching.default_max_tokens)
    poll_interval_s: float = 0.002  # idle poll: a few ms keeps sync requests fast
    progress_interval_s: float = 0.25
    parent_pid: int | None = None  # exit when this process is gone (started by serve)
    compact_after_idle_s: float = 2.0  # merge small shards once the queue has been quiet this long
    compact_min_shards: int = 32  # ... and at least this many small shards exist
    compact_max_rows: int = 256
    # a regimes job runs in a process of its own under this memory limit (MB; settings.probe_memory_mb,
    # workers/regimes/process.py); None: in this process, unlimited (the in-process workers of tests)
    job_memory_mb: int | None = None


class Worker:
    def __init__(self, store: FeatureStore, encoder: Encoder, options: WorkerOptions | None = None,
                 *, kinds: list[str] | None = None, backend: ExtractionBackend | None = None,
                 models: ModelPool | None = None) -> None:
        self.store = store
        self.encoder = encoder
        # every served model; ``encoder`` is its default (workers/model_pool.py)
        self.models = models or ModelPool(encoder)
        self._in_use: list[str] = []  # fingerprints the running jobs (urgent ones nested) hold
        self.options = options or WorkerOptions()
        # where dataset extraction runs (workers/backends/); encode jobs always run here
        self.backend: ExtractionBackend = backend or EmbeddedBackend(
            store, encoder, part_size=self.options.part_size, max_tokens=self.options.max_tokens)
        self.queue = JobQueue(store.catalog)
        self.datasets = DatasetStore(store.catalog)
        for mod in KIND_MODULES:
            importlib.import_module(mod)
        self.kinds = list(kinds or JOB_KINDS)
        self.host = socket.gethostname()
        self.id = f"{self.host}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.stopping = threading.Event()
        self.current: str | None = None
        self._urgent_depth = 0
        self._started = time.time()
        self._at_precision: dict[tuple[str, str], Encoder] = {}
        self._outage = OutageWait(log)

    def encoder_at(self, precision: str | None, model: str | None = None) -> Encoder:
        """A served encoder (``model``: a name or fingerprint; None: the default)
        at a job's precision (None: as served).

        Another model is loaded on first use (``ModelPool``); another mode
        shares the weights and tokenizer (``Encoder.with_precision``), so it
        costs no memory; kept per model and mode. JobError for a model this
        worker does not serve or a mode this device cannot run (fp16 on a CPU).
        """
        loads = self.models.loads
        if self.models.confirm():  # a model's files changed: its new fingerprint is served from now on
            self.encoder = self.models.default
            self.seen()
        try:
            base = self.models.get(model, keep=self._in_use)
        except ModelChanged:  # made for weights no longer served: sent again, it gets the new keys
            raise
        except (UnknownModel, ModelLoadError) as e:  # trying again would not help: fail at once
            raise JobError(str(e)) from None
        self._in_use.append(base.fingerprint)
        if self.models.loads != loads:
            self.seen()  # the API learns at once that this model's config is in the catalog
        if precision is None or precision == base.config.precision:
            return base
        # variants of unloaded models go with them
        self._at_precision = {k: v for k, v in self._at_precision.items()
                              if k[0] == self.encoder.fingerprint or k[0] in self.models.loaded}
        key = (base.fingerprint, precision)
        if key not in self._at_precision:
            try:
                self._at_precision[key] = base.with_precision(precision)
            except ValueError as e:
                raise JobError(f"precision {precision}: {e}") from None
        return self._at_precision[key]

    # -- life cycle -------------------------------------------------------
    def stop(self) -> None:
        """Stop after the current batch; a running job goes back to the queue."""
        self.stopping.set()

    def run(self) -> None:
        """Claim and run jobs until ``stop()`` (or the parent process is gone).

        A catalog that cannot be reached or whose disk is full (``catalog_outage``)
        is waited out here, with backoff and one log line, rather than ending the
        process: a supervisor would only restart it into the same outage."""
        started = False
        while not started and not self.stopping.is_set():
            try:
                self.release_orphans()
                clean_leftovers(self.store, self.queue, started=self._started)  # not only at `serve` start
                self.seen()
                started = True
            except Exception as e:
                if not catalog_outage(e):
                    raise
                self._outage.wait(e, self.stopping)
        self._outage.over()
        alive = threading.Thread(target=self._liveness, name="worker-liveness", daemon=True)
        alive.start()
        claimer = Claimer(self.queue, self.id, self.kinds, self.options.lease_seconds)
        last_work = last_compact = time.monotonic()
        while not self.stopping.is_set():
            try:
                job = claimer.next()
                self._outage.over()  # the catalog answered: logged before the job runs, not after it
                if job is not None:
                    self.run_job(job)
                    last_work = time.monotonic()
                    continue
                now = time.monotonic()
                if now - last_work > self.options.compact_after_idle_s and now - last_compact > 30.0:
                    last_compact = now
                    self.compact_if_needed()
            except Exception as e:
                if not catalog_outage(e):
                    raise
                self._outage.wait(e, self.stopping)
                continue
            self.stopping.wait(self.options.poll_interval_s)
        self.seen(state="stopped")

    def compact_if_needed(self) -> None:
        """Merge the small shards that micro-batched requests leave behind.

        Runs only when idle: the worker is the one writer, so compaction
        never races an extraction; readers see the same rows throughout.
        """
        small = self.store.catalog.small_shards(self.options.compact_max_rows)
        if len(small) < self.options.compact_min_shards:
            return
        try:
            s = compact(self.store, max_rows=self.options.compact_max_rows)
            log.info("compacted %d small shards into %d (%d rows)", s.shards_merged,
                     s.shards_written, s.rows)
        except Exception:  # compaction is housekeeping: never take the worker down
            log.exception("compaction failed; the store is unchanged")

    def seen(self, state: str | None = None) -> None:
        info = {"fingerprint": self.encoder.fingerprint, "model": self.encoder.info.get("name"),
                "host": self.host, "kinds": self.kinds, "started": self._started,
                "state": state or ("running" if self.current else "idle"), "job": self.current,
                "models": self.models.describe()}
        self.queue.worker_seen(self.id, os.getpid(), info)

    def _liveness(self) -> None:
        while not self.stopping.wait(self.options.heartbeat_seconds):
            pp = self.options.parent_pid
            if pp is not None and os.getppid() != pp:
                log.warning("parent process %d is gone; stopping", pp)
                self.stop()
                return
            try:
                self.seen()
            except Exception:  # a busy catalog must not kill the liveness thread
                log.exception("could not record liveness")

    def release_orphans(self) -> int:
        """Requeue running jobs whose worker process on this host is dead."""
        return release_orphans(self.queue)

    # -- running one job ----------------------------------------------------
    def run_job(self, job: Job) -> None:
        """Run one claimed job with its kind's handler; the runner records the outcome."""
        o = self.options
        lease = Lease(self.queue, job, self.id, lease_s=o.lease_seconds, heartbeat_s=o.heartbeat_seconds,
                      progress_interval_s=o.progress_interval_s)
        ctx = JobContext(self, job, lease)
        handler = JOB_KINDS.get(job.kind)

        def run() -> Any:
            if handler is None:
                raise JobError(f"this worker cannot run jobs of kind {job.kind!r}; "
                               f"it runs {sorted(JOB_KINDS)}")
            return handler(ctx)

        outer, self.current = self.current, job.id
        holding = len(self._in_use)
        try:
            run_claimed(self.queue, job, self.id, run, lease, stopping=self.stopping)
        finally:
            self.current = outer
            del self._in_use[holding:]  # this job's models may be unloaded again

    def serve_urgent(self) -> None:
        """Run waiting encode jobs now (called between batches of long jobs)."""
        if self._urgent_depth or self.stopping.is_set():
            return
        self._urgent_depth += 1
        try:
            for _ in range(_MAX_URGENT_PER_CHECK):
                if not self.queue.queued(URGENT_KINDS):
                    return
                job = self.queue.claim(self.id, list(URGENT_KINDS), self.options.lease_seconds)
                if job is None:
                    return
                self.run_job(job)
        finally:
            self._urgent_depth -= 1


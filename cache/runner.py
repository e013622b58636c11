"""The one job runner: claim under a lease, heartbeat, run a handler, record the outcome.

Extraction and regimes jobs (``layerbank.workers.worker``) and probe and head
jobs (``layerbank.app.api.probe_jobs.jobs``, in a process pool) all run through these
pieces; each side only registers its handlers (kind -> function). Torch-free
and app-free: only the job table below it.

- ``Claimer``: the cheap read first (``JobQueue.queued``), a claim (a write
  transaction) only when there is work or once a second, to pick up jobs
  whose lease expired.
- ``Lease``: a heartbeat thread renews the claimed job's lease every
  ``heartbeat_s`` and writes its latest progress; a renewal refused (the job
  was cancelled, or its lease went to another runner) sets ``stopped``, and
  the handler stops at its next check (``Stopped``).
- ``run_claimed``: runs the handler and records the outcome on the job row:
  ``finish`` with its JSON result; ``fail`` with a message and a failure type
  (``cache/errors.py``: "input" for ``InputError``/``JobError``, "storage" for
  a full disk, else "internal" with the exception's class name in front);
  ``cancelled`` when cancellation was asked for; back to the queue, without
  counting an attempt, when the runner itself is stopping.
- ``release_orphans``: at start, running jobs owned by a dead process on this
  host go back to the queue at once instead of at lease expiry.

Example::

    lease = Lease(queue, job, owner, lease_s=30, heartbeat_s=5)
    state = run_claimed(queue, job, owner, lambda: handler(job, lease), lease)
    # "succeeded" | "failed" | "cancelled" | "released" | "lost"
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .errors import InputError, failure_type
from .jobs import Job, JobQueue, pid_alive

__all__ = ["Claimer", "JobError", "Lease", "Stopped", "release_orphans", "run_claimed"]

log = logging.getLogger("layerbank.jobs")
LEASE_SCAN_S = 1.0  # how often a runner with nothing queued looks for expired leases


class Stopped(Exception):
    """The job was cancelled or lost its lease (or its runner is stopping)."""


class JobError(RuntimeError):
    """A job that cannot run as submitted; its message becomes the job's error text as it is."""

    failure_type = "input"


# errors whose message is for a person as it is; any other gets its class name in front
SHOWN_AS_IS: tuple[type[BaseException], ...] = (InputError, JobError)


class Claimer:
    """Claims the most urgent job of ``kinds`` for ``owner``, cheaply when there is none."""

    def __init__(self, queue: JobQueue, owner: str, kinds: Sequence[str], lease_s: float) -> None:
        self.queue, self.owner, self.kinds, self.lease_s = queue, owner, list(kinds), lease_s
        self._last_claim = 0.0

    def next(self) -> Job | None:
        now = time.monotonic()
        if now - self._last_claim < LEASE_SCAN_S and not self.queue.queued(self.kinds):
            return None
        self._last_claim = now
        return self.queue.claim(self.owner, self.kinds, self.lease_s)


class Lease:
    """A claimed job's lease, renewed by a heartbeat thread, and its progress.

    ``report(doc)`` records progress: written at once the first time, then at
    most every ``progress_interval_s`` (and by every heartbeat). ``on_beat``
    runs before each renewal (e.g. exit when the parent process is gone).
    """

    def __init__(self, queue: JobQueue, job: Job, owner: str, *, lease_s: float, heartbeat_s: float,
                 progress_interval_s: float = 0.25, on_beat: Callable[[], None] | None = None) -> None:
        self.queue, self.job, self.owner, self.lease_s = queue, job, owner, lease_s
        self.heartbeat_s, self.progress_interval_s, self.on_beat = heartbeat_s, progress_interval_s, on_beat
        self.stopped = threading.Event()
        self.doc: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._written = time.monotonic()
        self._over = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name=f"lease-{job.id}", daemon=True)
        self._beat.start()

    def report(self, doc: dict[str, Any], *, force: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            first = self.doc is None
            self.doc = doc
            due = force or first or now - self._written >= self.progress_interval_s
        if due:
            self.write()

    def write(self) -> None:
        """Renew the lease with the latest progress; a refusal stops the job."""
        with self._lock:
            doc = None if self.doc is None else dict(self.doc)
            self._written = time.monotonic()
        if not self.queue.heartbeat(self.job.id, self.owner, self.lease_s, doc):
            self.stopped.set()

    def check(self) -> None:
        """Raise ``Stopped`` once the job was cancelled or its lease lost."""
        if self.stopped.is_set():
            raise Stopped()

    def close(self) -> None:
        self._over.set()
        if self._beat is not threading.current_thread():
            self._beat.join()

    def _heartbeat(self) -> None:
        while not self._over.wait(self.heartbeat_s):
            if self.on_beat is not None:
                self.on_beat()
            try:
                self.write()
            except Exception:  # a busy catalog: the next beat tries again
                log.exception("heartbeat of job %s failed", self.job.id)
            if self.stopped.is_set():
                return


def run_claimed(queue: JobQueue, job: Job, owner: str, run: Callable[[], Any], lease: Lease, *,
                stopping: threading.Event | None = None,
                shown: tuple[type[BaseException], ...] = SHOWN_AS_IS) -> str:
    """Run a claimed job's handler (``run()``) and record its outcome; returns the final state.

    ``stopping``: the runner's own stop flag; a job stopped because of it goes
    back to the queue (no attempt counted). A KeyboardInterrupt or SystemExit
    sets it and is re-raised once the job is recorded.
    """
    t0 = time.perf_counter()
    try:
        result = run()
    except BaseException as e:
        lease.close()
        if not isinstance(e, Exception) and stopping is not None:  # shutting down
            stopping.set()
        state = _stopped_or_failed(queue, job, owner, lease, e, stopping, shown)
        if not isinstance(e, Exception):
            raise
        return state
    lease.close()
    if (queue.get(job.id) or job).cancel_requested:  # asked while its last step ran
        queue.mark_cancelled(job.id)
        log.info("job %s cancelled", job.id)
        return "cancelled"
    if lease.doc is not None:
        lease.write()  # the last progress, done == total
    if not queue.finish(job.id, owner, result):
        log.warning("job %s finished but was no longer ours (cancelled or re-leased)", job.id)
        return "lost"
    log.info("job %s (%s) succeeded in %.2fs", job.id, job.kind, time.perf_counter() - t0)
    return "succeeded"


def _stopped_or_failed(queue: JobQueue, job: Job, owner: str, lease: Lease, e: BaseException,
                       stopping: threading.Event | None, shown: tuple[type[BaseException], ...]) -> str:
    runner_stopping = stopping is not None and stopping.is_set()
    if not (isinstance(e, Stopped) or lease.stopped.is_set() or runner_stopping):
        known = isinstance(e, shown)
        msg = str(e) if known else f"{type(e).__name__}: {e}"
        log.error("job %s (%s) failed: %s", job.id, job.kind, msg, exc_info=not known)
        queue.fail(job.id, owner, msg, failure_type(e))
        return "failed"
    now = queue.get(job.id)
    if now is not None and now.cancel_requested:
        queue.mark_cancelled(job.id)
        log.info("job %s cancelled", job.id)
        return "cancelled"
    if runner_stopping and not lease.stopped.is_set():
        queue.release(job.id, owner, died=False)
        log.info("job %s handed back to the queue (its runner is stopping)", job.id)
        return "released"
    log.warning("job %s: lease lost to another runner; stopped", job.id)
    return "lost"


def release_orphans(queue: JobQueue, *, tail: str | None = None) -> int:
    """Requeue running jobs whose owner process on this host is dead (attempt counted).

    Owners are ``<host>:<pid>:<tail>``; with ``tail`` given, only owners with
    that tail (the probe pool's ``probes``). This process's own jobs are left alone.
    """
    host, n = socket.gethostname(), 0
    for job_id, owner in queue.running_owners().items():
        o_host, _, rest = (owner or "").partition(":")
        pid, _, o_tail = rest.partition(":")
        if o_host != host or not pid.isdigit() or (tail is not None and o_tail != tail):
            continue
        if int(pid) == os.getpid() or pid_alive(int(pid)):
            continue
        if queue.release(job_id, owner, died=True):
            log.warning("job %s: its runner %s died; requeued", job_id, owner)
            n += 1
    return n

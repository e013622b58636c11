"""Probe and head jobs off the event loop: a process pool fed from the job table.

``POST /v1/probes`` and ``POST /v1/heads`` only check their input and
``submit`` a job (kind ``probe`` or ``head``) to the catalog's job table. A
dispatcher task on the event loop claims queued jobs of those kinds, under a
lease, as fast as ``settings.probe_processes`` pool processes free up, and
hands each to ``layerbank.app.api.probe_jobs.jobs.run_job`` in the pool. The child records the
outcome on the job row itself (result, error, cancelled); the pool's future
only tells the dispatcher that a slot is free.

- Pool: ``ProcessPoolExecutor(probe_processes, spawn context)``; each child
  sets ``OPENBLAS_NUM_THREADS=1`` (and its OpenMP/MKL twins) before numpy
  loads: probe matrices are small, and on shared cores extra BLAS threads
  only spin (see layerbank.app.probes.sweep). This module imports no numpy, so the child's
  start-up does not load it before the limit is set.
- Owner: ``<host>:<pid>:probes``, the worker's format, so a server that died
  with jobs running has them requeued by the next start
  (``layerbank.cache.runner.release_orphans``, called by the worker and by
  ``start`` here). Claiming is the runner's ``Claimer``; in the child, the
  lease and the outcome are the runner's too (app/api/probe_jobs/jobs.py).
- A pool process that dies (killed, out of memory) breaks the pool: its jobs
  go back to the queue with the attempt counted (``max_attempts`` as for
  extraction) and a fresh pool is made for the next one.
- Memory: each pool process runs under an address-space limit of
  ``probe_memory_mb`` + ``PROBE_PROCESS_OVERHEAD_MB`` (RLIMIT_AS), so a job
  that outgrows its budget fails with the reason (app/api/probe_jobs/jobs.py) instead
  of taking the host's memory; requests are costed before they are queued
  (app/api/probe_jobs/memory_cost.py).
- Cancelling: a job cancelled while it computes (``DELETE``, on this server or
  another replica: it only marks the row) is ended here, by the parent: every
  dispatcher tick (``_IDLE_POLL_S``) reads the rows of the running jobs, and one
  asked to stop is marked cancelled and its pool process killed (SIGKILL), so its
  memory is back within a second whatever the solver is doing. Each pool process
  says which job it runs and its pid (a queue given to ``_init_child``); the pool
  is made afresh for the next job, and a job that shared the killed pool goes
  back to the queue without an attempt counted. (A thread inside the pool
  process watched for the cancel before; in about half of the runs it never
  ended the process.)
- Shutdown: running jobs are handed back to the queue (no attempt counted)
  and the pool's processes are terminated; the next start runs them again.

Example::

    service = ProbeService(state)          # in the app's lifespan
    await service.start()
    job_id = service.submit("probe", payload)
    ...
    await service.close()
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import socket
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import TYPE_CHECKING, Any

from layerbank.app.api.probe_jobs.heads_store import HEAD_FILES, HeadStore
from layerbank.cache.outage import OutageWait, catalog_outage
from layerbank.cache.runner import Claimer, release_orphans

if TYPE_CHECKING:
    from layerbank.app.api.deps import AppState

__all__ = ["JOB_KINDS", "ProbeService"]

log = logging.getLogger("layerbank.probes")
JOB_KINDS = ("probe", "head")
_IDLE_POLL_S = 0.25  # how often a free slot looks for queued jobs
_CHILD_THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_LOADED_HEADS = 16


# a probe process's own imports (numpy, scikit-learn, the catalog) and allocator slack, on top
# of the job's budget: measured ~600 MB of address space before a job's first array
PROBE_PROCESS_OVERHEAD_MB = 1536


# in a pool process: where it says which job it runs (``_init_child``); None in the server
_STARTED: Any = None


def _init_child(memory_limit_mb: int | None = None, started: Any = None) -> None:
    """Runs first in every pool process, before numpy is imported there.

    ``memory_limit_mb``: the process's address space (RLIMIT_AS), so a job that
    outgrows the budget gets a MemoryError (its job fails with the reason,
    app/api/probe_jobs/jobs.py) instead of taking the host's memory. With one BLAS thread
    (below), OpenBLAS reserves no per-thread buffers that the limit would break.

    ``started``: a queue on which ``_run`` puts ``(job id, pid)`` as each job begins,
    so the server can end the process that runs a cancelled job."""
    global _STARTED
    _STARTED = started
    for var in _CHILD_THREAD_ENV:
        os.environ[var] = "1"
    if memory_limit_mb:
        import resource

        limit = int(memory_limit_mb) * 2**20
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        os.environ["LAYERBANK_PROBE_MEMORY_LIMIT_MB"] = str(memory_limit_mb)  # for the job's message


def _run(data_dir: str, job_id: str, owner: str, lease_s: float, heartbeat_s: float,
         parent_pid: int) -> str:
    from layerbank.app.api.probe_jobs.jobs import run_job  # imported in the child, after _init_child

    # only a pool process says where it runs (tests run jobs in threads of the server)
    if _STARTED is not None and multiprocessing.parent_process() is not None:
        _STARTED.put((job_id, os.getpid()))
    return run_job(data_dir, job_id, owner, lease_s, heartbeat_s, parent_pid)


class ProbeService:
    """Submits, dispatches and runs probe and head jobs for one app."""

    def __init__(self, state: AppState, executor_factory: Callable[[], Executor] | None = None) -> None:
        self.state = state
        self.settings = state.settings
        self.queue = state.queue
        self.heads = HeadStore(state.store.catalog, self.settings.data_dir)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:probes"
        # tests swap in a ThreadPoolExecutor before the first job
        self.executor_factory: Callable[[], Executor] = executor_factory or self._process_pool
        self._executor: Executor | None = None
        self._running: dict[str, Future[str]] = {}
        self._ran_in: dict[str, Executor] = {}  # job id -> the pool it was given to
        self._started: Any = None  # the pool processes' (job id, pid) queue (_init_child)
        self._pids: dict[str, int] = {}  # job id -> the pool process running it
        self._killed: set[str] = set()  # jobs whose process this server ended (cancelled)
        self._cancel_broken: list[Executor] = []  # pools broken by ending a cancelled job's process
        self.claimer = Claimer(self.queue, self.owner, JOB_KINDS, self.settings.lease_seconds)
        self._wake: asyncio.Event | None = None
        self._outage = OutageWait(log)
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        # head id -> (file signature, loaded head); and -> (signature, damage or None)
        self._loaded: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        self._damage: dict[str, tuple[Any, str | None]] = {}
        self._logged_damage: dict[str, str] = {}
        self._loaded_lock = threading.Lock()  # loads run in threads

    def _process_pool(self) -> Executor:
        limit = int(self.settings.probe_memory_mb) + PROBE_PROCESS_OVERHEAD_MB
        ctx = multiprocessing.get_context("spawn")
        if self._started is None:
            self._started = ctx.SimpleQueue()
        return ProcessPoolExecutor(max_workers=self.settings.probe_processes, mp_context=ctx,
                                   initializer=_init_child, initargs=(limit, self._started))

    # -- life cycle -------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._closing = False
        self._wake = asyncio.Event()
        self.heads.clean()  # temp directories of a crash; nothing runs yet
        self._release_orphans()
        self._task = asyncio.create_task(self._dispatch_forever())

    async def close(self) -> None:
        # the flag as well as the cancel: Python 3.11's wait_for swallows a cancel that lands
        # as the wake event is set (a job finishing), and the dispatcher would then run on
        # while close waited for it forever (seen once in CI)
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for job_id in list(self._running):
            self.queue.release(job_id, self.owner, died=False)  # the next start runs it again
        executor, self._executor = self._executor, None
        if executor is not None:
            for proc in list(getattr(executor, "_processes", {}).values()):
                proc.terminate()
            executor.shutdown(wait=False, cancel_futures=True)
        self._running.clear()
        self._ran_in.clear()
        self._pids.clear()

    def _release_orphans(self) -> None:
        """Requeue probe/head jobs whose server process on this host is gone."""
        release_orphans(self.queue, tail="probes")

    # -- submitting -----------------------------------------------------------------
    def check_room(self) -> None:
        """429 (Overloaded) when ``max_queue_depth`` probe/head jobs already wait: a
        client submitting faster than the pool fits heads must hear it, not grow a backlog.
        507 (InsufficientStorage) when the data directory's disk is full (app/api/disk_room.py)."""
        from layerbank.app.api.disk_room import require_free_disk
        from layerbank.app.api.errors import Overloaded

        require_free_disk(self.settings.data_dir, "probe and head jobs", "nothing was queued")
        limit = self.settings.max_queue_depth
        if self.queue.queued(JOB_KINDS) >= limit:
            raise Overloaded(f"overloaded: {limit} probe and head jobs are already queued "
                             "(max_queue_depth); retry when one has started",
                             limit="max_queue_depth", headers={"Retry-After": "5"})

    def submit(self, kind: str, payload: dict[str, Any], job_id: str | None = None) -> str:
        """Queue a job; the dispatcher picks it up within milliseconds."""
        if kind not in JOB_KINDS:
            raise ValueError(f"not a probe job kind: {kind!r}")
        self.check_room()
        job_id = self.queue.submit(kind, payload, job_id=job_id or uuid.uuid4().hex[:16],
                                   max_attempts=self.settings.max_attempts)
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)
        return job_id

    # -- dispatching ------------------------------------------------------------------
    async def _dispatch_forever(self) -> None:
        assert self._wake is not None
        while not self._closing:
            pause = _IDLE_POLL_S
            try:
                await self._end_cancelled()
                await self._dispatch()
                self._outage.over()
            except Exception as e:
                if catalog_outage(e):  # logged once per outage; the pool's timeout already waited
                    pause = max(pause, self._outage.begin(e))
                else:  # a busy catalog: try again at the next tick
                    log.exception("could not dispatch probe jobs")
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), pause)
            except TimeoutError:
                pass

    async def _dispatch(self) -> None:
        s = self.settings
        while len(self._running) < s.probe_processes:
            # in a thread: a catalog that does not answer must not stall the event loop (and
            # every request with it) for the pool's timeout
            job = await asyncio.to_thread(self.claimer.next)
            # the catalog answered: say so now, before the job can start (and end), not after
            # this loop, which a close() may cancel first
            self._outage.over()
            if job is None:
                return
            if self._executor is None:
                self._executor = self.executor_factory()
            fut = self._executor.submit(_run, str(s.data_dir), job.id, self.owner, s.lease_seconds,
                                        s.heartbeat_seconds, os.getpid())
            self._running[job.id] = fut
            self._ran_in[job.id] = self._executor
            loop = self._loop
            assert loop is not None
            fut.add_done_callback(partial(self._done_in_thread, loop, job.id))
            log.info("job %s (%s) started", job.id, job.kind)

    def _done_in_thread(self, loop: asyncio.AbstractEventLoop, job_id: str, fut: Future[str]) -> None:
        try:  # a pool thread calls this
            loop.call_soon_threadsafe(self._finished, job_id, fut)
        except RuntimeError:  # the app closed meanwhile: close() handed its jobs back already
            pass

    def _finished(self, job_id: str, fut: Future[str]) -> None:
        if self._running.pop(job_id, None) is None:
            return  # closed meanwhile
        pool = self._ran_in.pop(job_id, None)
        self._pids.pop(job_id, None)
        killed = job_id in self._killed
        self._killed.discard(job_id)
        exc = fut.exception() if not fut.cancelled() else None
        job = self.queue.get(job_id) if exc is not None else None
        if exc is not None and (killed or (job is not None and job.state == "cancelled")):
            log.info("job %s cancelled; its probe process was stopped", job_id)
            self._drop_pool(pool)
        elif exc is not None and isinstance(exc, BrokenProcessPool) and pool in self._cancel_broken:
            # it shared the pool whose process ran a cancelled job: not its fault, run it again
            log.warning("job %s: its pool was stopped to end a cancelled job; requeued", job_id)
            self.queue.release(job_id, self.owner, died=False)
        elif exc is not None:
            # run_job records every outcome itself: this is the process dying under it
            log.error("job %s: its probe process failed: %s: %s", job_id, type(exc).__name__, exc)
            if self.queue.release(job_id, self.owner, died=True):
                log.warning("job %s requeued (attempt counted)", job_id)
            if isinstance(exc, BrokenProcessPool):
                self._drop_pool(pool)
        else:
            log.info("job %s: %s", job_id, fut.result())
        if self._cancel_broken and not any(p in self._cancel_broken for p in self._ran_in.values()):
            self._cancel_broken.clear()  # every job of the pools broken for a cancel is accounted for
        self.forget_head(None)  # a head may have been (re)written
        assert self._wake is not None
        self._wake.set()

    def _drop_pool(self, pool: Executor | None) -> None:
        """A pool that lost a process is broken: the next job gets a fresh one."""
        if pool is None or pool is not self._executor:
            return  # replaced already
        self._executor = None
        pool.shutdown(wait=False, cancel_futures=True)

    # -- cancelling a job that computes -------------------------------------------------
    def _note_pids(self) -> None:
        """Read what the pool processes said: which job each one started."""
        q = self._started
        while q is not None and not q.empty():
            job_id, pid = q.get()
            if job_id in self._running:
                self._pids[job_id] = int(pid)

    async def _end_cancelled(self) -> None:
        """End the process of every running job whose row asks for a cancel (DELETE, on any
        replica). The solver checks no flag and holds gigabytes: only its process's end gives
        them back at once. The job's own checks still stop it where no process is known
        (tests run jobs in threads)."""
        self._note_pids()  # every tick: a pipe nobody reads would block the processes' put
        running = [j for j in self._running if j not in self._killed]
        if not running:
            return

        def asked() -> list[str]:
            out = []
            for job_id in running:
                job = self.queue.get(job_id)
                if job is not None and job.cancel_requested and job.state in ("running", "cancelled"):
                    out.append(job_id)
            return out

        for job_id in await asyncio.to_thread(asked):
            self._note_pids()  # a process may have said so while the rows were read
            fut, pid = self._running.get(job_id), self._pids.get(job_id)
            if fut is None or fut.done() or pid is None:
                continue  # over meanwhile, or not started in its process yet: the next tick
            if any(other != job_id and p == pid for other, p in self._pids.items()):
                continue  # its process has taken another job since: this one is over
            await asyncio.to_thread(self.queue.mark_cancelled, job_id)  # before: the row says why
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._killed.add(job_id)
            log.info("job %s cancelled while computing; its probe process %d was ended", job_id, pid)
            pool = self._ran_in.get(job_id)
            if pool is not None and pool is self._executor:
                self._cancel_broken.append(pool)
                self._executor = None  # the next job gets a fresh pool at once
                pool.shutdown(wait=False, cancel_futures=True)

    # -- loaded heads (predict) -----------------------------------------------------
    def _signature(self, head_id: str) -> tuple[tuple[int, int] | None, ...]:
        """Size and mtime of each head file: a change means the files must be read again."""
        d = self.heads.directory(head_id)
        sig: list[tuple[int, int] | None] = []
        for name in HEAD_FILES:
            try:
                st = (d / name).stat()
                sig.append((st.st_size, st.st_mtime_ns))
            except OSError:
                sig.append(None)
        return tuple(sig)

    def load_head(self, head_id: str) -> Any:
        """The saved head, loaded once and kept (a few, least recently used first out)
        while its files are unchanged; ``HeadDamaged`` when they cannot be used.

        Blocking (reads files): call it from a thread."""
        sig = self._signature(head_id)
        with self._loaded_lock:
            got = self._loaded.get(head_id)
            if got is not None and got[0] == sig:
                self._loaded.move_to_end(head_id)
                return got[1]
        from layerbank.app.probes.head_files import HeadDamaged
        from layerbank.app.probes.heads import load_head

        try:
            head = load_head(self.heads.directory(head_id))
        except HeadDamaged as e:
            with self._loaded_lock:
                self._loaded.pop(head_id, None)
                self._damage[head_id] = (sig, e.reason)
            if self._logged_damage.get(head_id) != e.reason:
                self._logged_damage[head_id] = e.reason  # once per damage, not per request
                log.error("head %s is damaged: %s", head_id, e.reason)
            raise
        with self._loaded_lock:
            self._loaded[head_id] = (sig, head)
            self._damage[head_id] = (sig, None)
            self._logged_damage.pop(head_id, None)
            while len(self._loaded) > _LOADED_HEADS:
                self._loaded.popitem(last=False)
        return head

    def head_damage(self, head_id: str) -> str | None:
        """Why the saved head's files cannot be used (None: they can); checked once per
        version of its files (size and mtime), so listing heads reads no file twice."""
        from layerbank.app.probes.head_files import HeadDamaged

        sig = self._signature(head_id)
        with self._loaded_lock:
            known = self._damage.get(head_id)
        if known is not None and known[0] == sig:
            return known[1]
        try:
            self.load_head(head_id)
        except HeadDamaged as e:
            return e.reason
        return None

    def forget_head(self, head_id: str | None) -> None:
        """Drop a loaded head (None: all of them), e.g. when it is deleted."""
        with self._loaded_lock:
            if head_id is None:
                self._loaded.clear()
                self._damage.clear()
            else:
                self._loaded.pop(head_id, None)
                self._damage.pop(head_id, None)

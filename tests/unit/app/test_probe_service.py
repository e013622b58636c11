"""The probe job service on its own (app/api/probe_jobs/service.py): a bare catalog and job
queue, a thread pool, and a stand-in for the pool's job (``_run``), so each test sees the
job rows, the processes and the log lines the service is responsible for, without an
app or a model (about 2 s in all, so the mutation run, bench/mutation.sh, can use it).

What a user sees through the API is tested with the app in test_probe_routes.py,
test_probe_backpressure.py and test_probe_memory.py; here: the queue's limit and its
429, the job kinds, as many jobs running as ``probe_processes``, what the pool is given,
a job whose process died (requeued with the attempt counted, then failed), a broken
pool replaced, a cancelled job's process ended and the jobs sharing its pool requeued
uncounted, close and start (orphans of dead servers, a crash's temp head directories),
and saved heads loaded once per version of their files.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from layerbank.app.api.errors import InsufficientStorage, Overloaded
from layerbank.app.api.probe_jobs import service as service_mod
from layerbank.app.api.probe_jobs.service import JOB_KINDS, ProbeService
from layerbank.cache.catalog import Catalog
from layerbank.cache.jobs import JobQueue

HOST = socket.gethostname()
# a change that leaves the event loop or a pool thread waiting forever fails the test in 30 s
# (the thread method ends the process: mutmut's runner would otherwise wait on it for 600 s)
pytestmark = pytest.mark.timeout(30, method="thread")


class Pools:
    """The executor factory: thread pools, each one remembered (and whether it was shut down)."""

    def __init__(self, workers: int = 4) -> None:
        self.workers = workers
        self.made: list[ThreadPoolExecutor] = []
        self.shut: list[ThreadPoolExecutor] = []

    def __call__(self) -> Executor:
        pool = ThreadPoolExecutor(self.workers)
        real = pool.shutdown

        def shutdown(wait: bool = True, *, cancel_futures: bool = False) -> None:
            self.shut.append(pool)
            real(wait=wait, cancel_futures=cancel_futures)

        pool.shutdown = shutdown  # type: ignore[method-assign]
        self.made.append(pool)
        return pool


class Jobs:
    """Stands in for ``_run`` in the pool: records its arguments and does what the job's
    payload says (``succeed``, ``raise``, ``broken``, or ``block`` until released)."""

    def __init__(self, queue: JobQueue) -> None:
        self.queue = queue
        self.calls: list[tuple[Any, ...]] = []
        self.release = threading.Event()
        self.gates: dict[str, threading.Event] = {}  # a job's payload "gate": released on its own
        self.lock = threading.Lock()

    def gate(self, name: str) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(name, threading.Event())

    def __call__(self, data_dir: str, job_id: str, owner: str, lease_s: float, heartbeat_s: float,
                 parent_pid: int) -> str:
        with self.lock:
            self.calls.append((data_dir, job_id, owner, lease_s, heartbeat_s, parent_pid))
            first = [c[1] for c in self.calls].count(job_id) == 1
        job = self.queue.get(job_id)
        assert job is not None
        do = job.payload["do"]
        if do == "block":
            assert (self.gate(job.payload["gate"]) if "gate" in job.payload else self.release).wait(30)
            do = job.payload.get("then", "succeed") if first else "succeed"  # "then": the first run only
        if do == "raise":
            raise RuntimeError("boom")
        if do == "broken":
            raise BrokenProcessPool("a process in the pool was terminated abruptly")
        self.queue.finish(job_id, owner, {"done": job_id})
        return "succeeded"


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    catalog = Catalog(tmp_path / "catalog.sqlite")
    queue = JobQueue(catalog)
    settings = SimpleNamespace(data_dir=tmp_path / "data", probe_processes=2, max_queue_depth=3, max_attempts=2,
                               lease_seconds=30.0, heartbeat_seconds=1.5, probe_memory_mb=256)
    state = SimpleNamespace(settings=settings, queue=queue, store=SimpleNamespace(catalog=catalog))
    jobs = Jobs(queue)
    monkeypatch.setattr(service_mod, "_run", jobs)
    pools = Pools()
    w = SimpleNamespace(catalog=catalog, queue=queue, settings=settings, state=state, jobs=jobs, pools=pools,
                        new=lambda: ProbeService(state, pools))  # type: ignore[arg-type]
    yield w
    jobs.release.set()
    for gate in list(jobs.gates.values()):
        gate.set()


def _until(check: Callable[[], Any], timeout: float = 10) -> Any:
    async def wait() -> Any:
        deadline = time.monotonic() + timeout
        while not (got := check()):
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.01)
        return got
    return wait()


def _states(w: SimpleNamespace, ids: list[str]) -> list[str]:
    return [w.queue.get(i).state for i in ids]


def test_only_probe_and_head_jobs_are_submitted(world: SimpleNamespace) -> None:
    svc = world.new()
    assert JOB_KINDS == ("probe", "head")
    with pytest.raises(ValueError) as e:
        svc.submit("extract", {"do": "succeed"})
    assert str(e.value) == "not a probe job kind: 'extract'"
    assert world.queue.queued() == 0
    a = svc.submit("probe", {"do": "succeed"})
    b = svc.submit("head", {"do": "succeed"}, job_id="my-job")
    assert len(a) == 16 and int(a, 16) >= 0 and b == "my-job"
    job = world.queue.get(b)
    assert (job.kind, job.state, job.max_attempts, job.payload) == ("head", "queued", 2, {"do": "succeed"})
    assert world.queue.get(a).kind == "probe"


def test_a_full_queue_is_a_429_with_retry_after_and_queues_nothing(world: SimpleNamespace) -> None:
    svc = world.new()
    world.queue.submit("extract", {})  # another kind's jobs do not count
    for _ in range(2):
        svc.submit("probe", {"do": "succeed"})
    svc.check_room()  # two of three: room for one more
    svc.submit("head", {"do": "succeed"})
    with pytest.raises(Overloaded) as e:
        svc.submit("probe", {"do": "succeed"})
    err = e.value
    assert err.status == 429 and err.limit == "max_queue_depth" and err.headers == {"Retry-After": "5"}
    assert err.message == ("overloaded: 3 probe and head jobs are already queued (max_queue_depth); "
                           "retry when one has started")
    assert world.queue.queued(JOB_KINDS) == 3


def test_a_full_disk_is_a_507_and_queues_nothing(world: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    from layerbank.app.api import disk_room

    svc = world.new()
    seen = []

    def storage(*a: Any, **k: Any) -> SimpleNamespace:
        seen.append(k["root"])
        return SimpleNamespace(free_bytes=lambda: 4096)

    monkeypatch.setattr(disk_room, "open_storage", storage)
    with pytest.raises(InsufficientStorage) as e:
        svc.submit("probe", {"do": "succeed"})
    assert seen == [world.settings.data_dir]
    assert e.value.message == ("the disk holding the data directory is full (4,096 bytes free; probe and head jobs "
                               "need at least 1 MiB); nothing was queued; free some space and send the request again")
    assert world.queue.queued() == 0


def test_jobs_run_as_many_at_once_as_probe_processes_with_what_the_pool_needs(
        world: SimpleNamespace, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "layerbank.probes")
    world.settings.max_queue_depth = 10

    async def go() -> list[str]:
        svc = world.new()
        await svc.start()
        ids = [svc.submit("probe", {"do": "block"}) for _ in range(3)] + [svc.submit("head", {"do": "succeed"})]
        await _until(lambda: len(world.jobs.calls) == 2)
        await asyncio.sleep(0.6)  # two more ticks: still two
        assert len(world.jobs.calls) == 2 and world.queue.queued(JOB_KINDS) == 2
        assert sorted(_states(world, ids)) == ["queued", "queued", "running", "running"]
        world.jobs.release.set()
        await _until(lambda: _states(world, ids) == ["succeeded"] * 4)
        await _until(lambda: not svc._running)
        await svc.close()
        return ids

    ids = asyncio.run(go())
    owner = f"{HOST}:{os.getpid()}:probes"
    assert sorted(world.jobs.calls) == sorted(
        (str(world.settings.data_dir), i, owner, 30.0, 1.5, os.getpid()) for i in ids)
    assert [c[1] for c in world.jobs.calls[:2]] == ids[:2]  # in the order they were queued
    assert world.queue.get(ids[3]).result == {"done": ids[3]}
    assert len(world.pools.made) == 1  # one pool for all four
    msgs = [r.getMessage() for r in caplog.records]
    for i, kind in zip(ids, ["probe"] * 3 + ["head"], strict=True):
        assert f"job {i} ({kind}) started" in msgs and f"job {i}: succeeded" in msgs
    assert not [m for m in msgs if "could not dispatch" in m]  # no tick failed on the way


def test_a_job_whose_process_fails_is_requeued_with_the_attempt_counted_then_failed(
        world: SimpleNamespace, caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> str:
        svc = world.new()
        await svc.start()
        job_id = svc.submit("probe", {"do": "raise"})
        ok = svc.submit("probe", {"do": "succeed"})
        await _until(lambda: world.queue.get(job_id).state == "failed")
        await _until(lambda: world.queue.get(ok).state == "succeeded")
        assert len(world.pools.made) == 1 and world.pools.shut == []  # an exception does not break the pool
        await svc.close()
        return job_id

    job_id = asyncio.run(go())
    job = world.queue.get(job_id)
    assert job.attempts == 2 and job.error == "worker died 2 times while running this job"
    assert [c[1] for c in world.jobs.calls].count(job_id) == 2
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "layerbank.probes"]
    assert lines.count(("ERROR", f"job {job_id}: its probe process failed: RuntimeError: boom")) == 2
    assert lines.count(("WARNING", f"job {job_id} requeued (attempt counted)")) == 1  # the second one failed it


def test_a_broken_pool_is_replaced_for_the_next_job(world: SimpleNamespace) -> None:
    world.settings.max_attempts = 3

    async def go() -> tuple[str, str]:
        svc = world.new()
        await svc.start()
        job_id = svc.submit("probe", {"do": "broken"})
        await _until(lambda: world.queue.get(job_id).state == "failed")
        ok = svc.submit("head", {"do": "succeed"})
        await _until(lambda: world.queue.get(ok).state == "succeeded")
        await svc.close()
        return job_id, ok

    job_id, ok = asyncio.run(go())
    assert world.queue.get(job_id).attempts == 3
    # each of the three attempts broke its pool and got a fresh one; the next job a fourth
    assert len(world.pools.made) == 4 and world.pools.shut[:3] == world.pools.made[:3]


def test_close_hands_the_running_jobs_back_without_counting_them(world: SimpleNamespace) -> None:
    async def go() -> list[str]:
        svc = world.new()
        await svc.start()
        ids = [svc.submit("probe", {"do": "block"}) for _ in range(2)]
        await _until(lambda: len(world.jobs.calls) == 2)
        await svc.close()
        assert svc._running == {} and world.pools.shut == world.pools.made
        world.jobs.release.set()  # the stand-in ends; its late finish is not this server's any more
        await asyncio.sleep(0.1)
        return ids

    ids = asyncio.run(go())
    for i in ids:
        job = world.queue.get(i)
        assert (job.state, job.attempts) == ("queued", 0)


def test_start_requeues_jobs_of_dead_probe_servers_and_removes_temp_head_directories(
        world: SimpleNamespace) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = world.queue.submit("probe", {"do": "succeed"}, max_attempts=3)
    foreign = world.queue.submit("extract", {}, max_attempts=3)
    assert world.queue.claim(f"{HOST}:{dead.pid}:probes", ["probe"], 30).id == orphan
    assert world.queue.claim(f"{HOST}:{dead.pid}:worker", ["extract"], 30).id == foreign

    async def go() -> None:
        svc = world.new()
        leftover = svc.heads.temp_directory(svc.heads.new_id())
        await svc.start()
        assert not leftover.exists()
        await _until(lambda: world.queue.get(orphan).state == "succeeded")
        await svc.close()

    asyncio.run(go())
    assert world.queue.get(orphan).attempts == 2  # the dead server's attempt counted, then this one
    assert world.queue.get(foreign).state == "running"  # the extraction worker's: not the probes'


def test_a_cancelled_computing_job_has_its_process_ended_and_pool_mates_requeued_uncounted(
        world: SimpleNamespace, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "layerbank.probes")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        async def go() -> tuple[str, str, str]:
            svc = world.new()
            await svc.start()
            victim = svc.submit("probe", {"do": "block", "then": "broken"})
            mate = svc.submit("probe", {"do": "block", "then": "broken"})
            await _until(lambda: len(world.jobs.calls) == 2)
            started: Any = __import__("queue").SimpleQueue()  # what pool processes say (_init_child)
            started.put((victim, sleeper.pid))
            started.put((mate, bystander.pid))
            svc._started = started
            world.queue.cancel(victim)  # DELETE, on this replica or another
            await _until(lambda: sleeper.poll() is not None)
            assert sleeper.returncode == -signal.SIGKILL and bystander.poll() is None
            assert world.queue.get(victim).state == "cancelled"
            world.jobs.release.set()  # the pool breaks under both jobs, as a killed process breaks it
            await _until(lambda: not svc._running)
            later = svc.submit("head", {"do": "succeed"})
            await _until(lambda: world.queue.get(later).state == "succeeded"
                         and world.queue.get(mate).state == "succeeded")
            await svc.close()
            return victim, mate, later

        victim, mate, later = asyncio.run(go())
    finally:
        for p in (sleeper, bystander):
            p.kill()
            p.wait()
    assert world.queue.get(victim).state == "cancelled"
    assert world.queue.get(mate).attempts == 1  # its broken run was not counted
    assert len(world.pools.made) == 2 and world.pools.shut[0] is world.pools.made[0]
    msgs = [r.getMessage() for r in caplog.records]
    assert f"job {victim} cancelled while computing; its probe process {sleeper.pid} was ended" in msgs
    assert f"job {victim} cancelled; its probe process was stopped" in msgs
    assert f"job {mate}: its pool was stopped to end a cancelled job; requeued" in msgs
    assert not any(f"job {mate}: its probe process failed" in m for m in msgs)


class HeadDamaged(ValueError):
    """Stands in for layerbank.app.probes.head_files.HeadDamaged (which loads numpy)."""

    def __init__(self, directory: Path, reason: str) -> None:
        super().__init__(f"{directory}: {reason}")
        self.reason = reason


class Loads:
    """Stands in for reading a head's files (layerbank.app.probes.heads, which loads scikit-learn:
    6 s a mutant): counts the reads; a head.json holding "bad" is damaged."""

    def __init__(self) -> None:
        self.reads: list[str] = []

    def __call__(self, directory: Path) -> Any:
        self.reads.append(Path(directory).name)
        if (Path(directory) / "head.json").read_text().startswith("bad"):
            raise HeadDamaged(Path(directory), "arrays.npz does not match its checksum")
        return ("head", Path(directory).name, (Path(directory) / "head.json").read_text())


@pytest.fixture
def saved(world: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    loads = Loads()
    monkeypatch.setitem(sys.modules, "layerbank.app.probes.heads", SimpleNamespace(load_head=loads))
    monkeypatch.setitem(sys.modules, "layerbank.app.probes.head_files", SimpleNamespace(HeadDamaged=HeadDamaged))
    svc = world.new()

    def write(head_id: str, text: str) -> None:
        d = svc.heads.root / head_id
        d.mkdir(exist_ok=True)
        (d / "arrays.npz").write_bytes(b"a")
        (d / "head.json").write_text(text)

    return SimpleNamespace(svc=svc, loads=loads, write=write)


def test_a_saved_head_is_read_once_while_its_files_are_unchanged(saved: SimpleNamespace) -> None:
    svc, hid = saved.svc, "hd_000000000001"
    saved.write(hid, "v1")
    assert svc.load_head(hid) == ("head", hid, "v1") and svc.load_head(hid) == ("head", hid, "v1")
    assert svc.head_damage(hid) is None
    assert saved.loads.reads == [hid]
    saved.write(hid, "v2 longer")  # rewritten (a re-run of its job): read again
    assert svc.load_head(hid) == ("head", hid, "v2 longer") and saved.loads.reads == [hid, hid]
    svc.forget_head(hid)
    svc.load_head(hid)
    svc.forget_head(None)
    svc.load_head(hid)
    assert saved.loads.reads == [hid] * 4


def test_at_most_16_heads_stay_loaded_the_least_recently_used_go_first(saved: SimpleNamespace) -> None:
    svc = saved.svc
    ids = [f"hd_{i:012x}" for i in range(17)]
    for hid in ids:
        saved.write(hid, "v1")
    for hid in ids[:16]:
        svc.load_head(hid)
    svc.load_head(ids[0])  # used again: now the most recent
    svc.load_head(ids[16])  # the 17th pushes out the least recently used: ids[1]
    saved.loads.reads.clear()
    for hid in [ids[0], *ids[2:]]:
        svc.load_head(hid)
    assert saved.loads.reads == []
    svc.load_head(ids[1])
    assert saved.loads.reads == [ids[1]]


def test_a_damaged_head_is_named_logged_once_and_checked_once_per_version(
        saved: SimpleNamespace, caplog: pytest.LogCaptureFixture) -> None:
    svc, hid, other = saved.svc, "hd_00000000000d", "hd_00000000000e"
    saved.write(hid, "bad")
    saved.write(other, "good")
    svc.load_head(other)
    for _ in range(2):
        with pytest.raises(HeadDamaged) as e:
            svc.load_head(hid)
        assert e.value.reason == "arrays.npz does not match its checksum"
    assert svc.head_damage(hid) == "arrays.npz does not match its checksum"
    assert svc.head_damage(other) is None
    assert saved.loads.reads == [other, hid, hid]  # listing read neither again
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [f"head {hid} is damaged: arrays.npz does not match its checksum"]
    saved.write(hid, "bad again!")  # another version, the same damage: not logged twice
    assert svc.head_damage(hid) == "arrays.npz does not match its checksum"
    assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 1
    saved.write(hid, "repaired")
    assert svc.head_damage(hid) is None and svc.load_head(hid) == ("head", hid, "repaired")
    saved.write(hid, "bad: third")  # damaged after a good version: logged again
    assert svc.head_damage(hid) == "arrays.npz does not match its checksum"
    assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 2
    svc.forget_head(hid)
    assert svc.head_damage(hid) == "arrays.npz does not match its checksum"
    assert saved.loads.reads.count(hid) == 6


_CHILD = """
import json, os, resource, sys
from layerbank.app.api.probe_jobs import service
hard = int(sys.argv[2])
if hard:
    resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
service._init_child(int(sys.argv[1]) or None, "the queue")
print(json.dumps({"as": resource.getrlimit(resource.RLIMIT_AS), "started": service._STARTED,
                  "env": {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                          "MKL_NUM_THREADS", "LAYERBANK_PROBE_MEMORY_LIMIT_MB")}}))
"""


def _child(limit_mb: int, hard: int = 0) -> dict[str, Any]:
    import json

    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS") and "PROBE_MEMORY" not in k}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(limit_mb), str(hard)], env=env, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    return json.loads(out)  # type: ignore[no-any-return]


def test_a_pool_process_gets_one_blas_thread_and_its_address_space_limit() -> None:
    import resource

    got = _child(700)
    assert got["as"][0] == 700 * 2**20 and got["started"] == "the queue"
    assert got["env"] == {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                          "LAYERBANK_PROBE_MEMORY_LIMIT_MB": "700"}
    unlimited = _child(0)  # no budget: no limit, still one thread
    assert unlimited["as"][0] == resource.getrlimit(resource.RLIMIT_AS)[0]
    assert unlimited["env"]["OPENBLAS_NUM_THREADS"] == "1" and unlimited["env"]["LAYERBANK_PROBE_MEMORY_LIMIT_MB"] is None
    capped = _child(4096, hard=3 * 2**30)  # a hard limit below the budget is kept
    assert capped["as"] == [3 * 2**30, 3 * 2**30]


def test_the_pool_has_probe_processes_spawned_under_the_budget_plus_overhead(
        world: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []
    monkeypatch.setattr(service_mod, "ProcessPoolExecutor", lambda **kw: made.append(kw) or kw)
    svc = ProbeService(world.state)  # type: ignore[arg-type]
    svc._process_pool()
    svc._process_pool()
    first, second = made
    assert first["max_workers"] == 2 and first["initializer"] is service_mod._init_child
    assert first["mp_context"].get_start_method() == "spawn"
    assert first["initargs"][0] == 256 + 1536 and first["initargs"][1] is svc._started is not None
    assert second["initargs"][1] is svc._started  # one queue for every pool the server makes


@pytest.fixture
def run_job(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Stands in for app/api/probe_jobs/jobs.py's run_job (which loads numpy and scikit-learn)."""
    calls: list[tuple[Any, ...]] = []

    def run(*args: Any) -> str:
        calls.append(args)
        return "succeeded"

    monkeypatch.setitem(sys.modules, "layerbank.app.api.probe_jobs.jobs", SimpleNamespace(run_job=run))
    return calls


def test_a_pool_process_says_which_job_it_runs_before_running_it(
        run_job: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing
    import queue

    said: queue.SimpleQueue[Any] = queue.SimpleQueue()
    real_run = service_mod._run
    monkeypatch.setattr(service_mod, "_STARTED", said)
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())  # as in a pool process
    assert real_run("/data", "job-1", "h:1:probes", 30.0, 1.5, 42) == "succeeded"
    assert said.get_nowait() == ("job-1", os.getpid()) and said.empty()
    assert run_job == [("/data", "job-1", "h:1:probes", 30.0, 1.5, 42)]


def test_the_server_itself_or_a_process_without_the_queue_says_nothing(
        run_job: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing
    import queue

    real_run = service_mod._run
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())
    assert real_run("/data", "job-3", "o", 1.0, 1.0, 7) == "succeeded"  # no _init_child ran here: no queue
    said: queue.SimpleQueue[Any] = queue.SimpleQueue()
    monkeypatch.setattr(service_mod, "_STARTED", said)
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: None)  # a thread of the server
    assert real_run("/data", "job-2", "o", 1.0, 1.0, 7) == "succeeded"
    assert said.empty()
    assert [c[1] for c in run_job] == ["job-3", "job-2"]


def test_closing_a_service_that_never_started_hands_back_nothing(world: SimpleNamespace) -> None:
    svc = world.new()  # the app's start-up failed before the service's start
    asyncio.run(svc.close())
    assert world.pools.made == [] and svc._running == {}


def test_close_returns_at_once_ends_the_pool_processes_and_starts_no_queued_job(world: SimpleNamespace) -> None:
    world.pools.workers = 1  # two jobs given to the pool, one computing, one waiting in it
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        async def go() -> list[str]:
            svc = world.new()
            await svc.start()
            ids = [svc.submit("probe", {"do": "block"}) for _ in range(2)]
            await _until(lambda: len(svc._running) == 2 and world.jobs.calls)
            world.pools.made[0]._processes = {child.pid: child}  # type: ignore[attr-defined]
            t0 = time.monotonic()
            await svc.close()  # while a job computes: it must not wait for it
            assert time.monotonic() - t0 < 5
            assert child.wait(10) == -signal.SIGTERM
            world.jobs.release.set()
            await asyncio.sleep(0.3)
            return ids

        ids = asyncio.run(go())
    finally:
        child.kill()
        child.wait()
    assert [c[1] for c in world.jobs.calls] == ids[:1]  # the waiting one never started
    assert _states(world, ids) == ["queued", "queued"]


def test_close_returns_when_a_job_finishing_wakes_the_dispatcher_as_it_is_cancelled(
        world: SimpleNamespace) -> None:
    # Python 3.11's wait_for drops a cancel that lands just after the event it waits on is set;
    # the dispatcher then ran on and close() waited for it forever (a CI run ended here). Each
    # offset below lands the cancel on another step of that hand-over.
    async def go() -> list[int]:
        closed = []
        for steps in range(8):
            svc = world.new()
            await svc.start()
            await asyncio.sleep(0.05)  # the dispatcher is waiting on its wake event
            assert svc._wake is not None
            svc._wake.set()
            for _ in range(steps):
                await asyncio.sleep(0)
            closing = asyncio.create_task(svc.close())
            done, _ = await asyncio.wait({closing}, timeout=5)  # wait (not wait_for): no second cancel
            if not done:
                assert svc._task is not None
                svc._task.cancel()  # a second cancel ends the stray dispatcher, so the test can report
                await closing
                continue
            closed.append(steps)
        return closed

    assert asyncio.run(go()) == list(range(8))


def test_a_cancelled_job_ending_before_its_pool_mate_leaves_the_mate_uncounted_and_the_new_pool_alone(
        world: SimpleNamespace, caplog: pytest.LogCaptureFixture) -> None:
    """The order the other test leaves to chance: the cancelled job's end is seen first, while its
    pool mate still runs in the stopped pool and a later job already has a fresh pool."""
    caplog.set_level(logging.INFO)
    world.settings.probe_processes = 3
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        async def go() -> tuple[str, str, str, str]:
            svc = world.new()
            await svc.start()
            victim = svc.submit("probe", {"do": "block", "gate": "victim", "then": "broken"})
            mate = svc.submit("probe", {"do": "block", "gate": "mate", "then": "broken"})
            await _until(lambda: len(world.jobs.calls) == 2)
            started: Any = __import__("queue").SimpleQueue()
            started.put((victim, sleeper.pid))
            svc._started = started
            world.queue.cancel(victim)
            await _until(lambda: sleeper.poll() is not None)
            later = svc.submit("head", {"do": "succeed"})  # into a fresh pool: the first one is stopped
            await _until(lambda: world.queue.get(later).state == "succeeded")
            world.jobs.gate("victim").set()
            await _until(lambda: victim not in svc._running)
            world.jobs.gate("mate").set()  # now the mate's run breaks, as the stopped pool broke it
            await _until(lambda: world.queue.get(mate).state == "succeeded")
            final = svc.submit("head", {"do": "succeed"})
            await _until(lambda: world.queue.get(final).state == "succeeded")
            await svc.close()
            return victim, mate, later, final

        victim, mate, later, final = asyncio.run(go())
    finally:
        sleeper.kill()
        sleeper.wait()
    assert world.queue.get(victim).state == "cancelled"
    assert world.queue.get(mate).attempts == 1  # its broken run was not counted
    # one pool stopped for the cancel, one fresh pool for everything after it
    assert len(world.pools.made) == 2 and world.pools.shut[:1] == world.pools.made[:1]
    assert world.pools.made[1] not in world.pools.shut[:-1]  # shut only by close, at the end
    msgs = [r.getMessage() for r in caplog.records]
    assert f"job {mate}: its pool was stopped to end a cancelled job; requeued" in msgs
    assert not any(f"job {mate}: its probe process failed" in m for m in msgs)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_failed_dispatch_is_logged_with_its_traceback_and_retried_at_the_next_tick(
        world: SimpleNamespace, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "layerbank.probes")

    async def go() -> str:
        svc = world.new()
        real, failures = svc.claimer.next, [RuntimeError("database is locked")]
        svc.claimer.next = lambda: real() if not failures else (_ for _ in ()).throw(failures.pop())
        await svc.start()
        job = svc.submit("probe", {"do": "succeed"})
        await _until(lambda: world.queue.get(job).state == "succeeded")
        await svc.close()
        return job

    asyncio.run(go())
    errors = [(r.name, r.getMessage(), r.exc_info is not None) for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [("layerbank.probes", "could not dispatch probe jobs", True)]


def test_a_catalog_outage_pauses_the_dispatcher_with_backoff_then_it_runs_what_waited(
        world: SimpleNamespace, caplog: pytest.LogCaptureFixture) -> None:
    from layerbank.cache.outage import CatalogUnavailable

    caplog.set_level(logging.INFO, "layerbank.probes")

    async def go() -> tuple[str, list[float]]:
        svc = world.new()
        real = svc.claimer.next
        tries: list[float] = []

        def next_job() -> Any:
            tries.append(time.monotonic())
            if len(tries) <= 2:
                raise CatalogUnavailable("connection refused")
            return real()

        svc.claimer.next = next_job
        job = svc.submit("probe", {"do": "succeed"})  # queued before the dispatcher starts: no wake-up after
        await svc.start()
        await _until(lambda: world.queue.get(job).state == "succeeded")
        await svc.close()
        return job, tries

    _, tries = asyncio.run(go())
    gaps = [b - a for a, b in zip(tries, tries[1:3])]
    assert gaps[0] >= 0.45 and gaps[1] >= 0.95, gaps  # 0.5 s, then 1 s (cache/outage.py's backoff)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "layerbank.probes"]
    assert [m for lvl, m in lines if lvl == "WARNING"] == [
        "the catalog is unavailable (it cannot be reached: connection refused); waiting for it, "
        "retrying every 0.5-5 s"]
    infos = [m for lvl, m in lines if lvl == "INFO"]
    back = [i for i, m in enumerate(infos) if m.startswith("the catalog answers again after ")]
    started = [i for i, m in enumerate(infos) if m.endswith("(probe) started")]
    assert len(back) == 1 and len(started) == 1 and back[0] < started[0], infos


def test_a_job_its_own_heartbeat_marked_cancelled_still_has_its_process_ended(world: SimpleNamespace) -> None:
    """The child marks its row cancelled when its heartbeat sees the DELETE, but the solver it
    runs checks no flag: the process must still be ended."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        async def go() -> str:
            svc = world.new()
            await svc.start()
            victim = svc.submit("probe", {"do": "block", "then": "broken"})
            await _until(lambda: len(world.jobs.calls) == 1)
            started: Any = __import__("queue").SimpleQueue()
            started.put((victim, sleeper.pid))
            svc._started = started
            with world.catalog.tx() as db:  # one step, as run_job's heartbeat leaves the row
                db.execute("UPDATE jobs SET cancel_requested=1, state='cancelled' WHERE id=?", (victim,))
            await _until(lambda: sleeper.poll() is not None)
            world.jobs.release.set()
            await _until(lambda: not svc._running)
            await svc.close()
            return victim

        victim = asyncio.run(go())
        assert sleeper.returncode == -signal.SIGKILL and world.queue.get(victim).state == "cancelled"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_second_cancel_in_the_stopped_pool_leaves_the_fresh_pool_in_use(world: SimpleNamespace) -> None:
    world.settings.probe_processes = 3
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        async def go() -> tuple[str, str, str]:
            svc = world.new()
            await svc.start()
            first = svc.submit("probe", {"do": "block", "gate": "first", "then": "broken"})
            second = svc.submit("probe", {"do": "block", "gate": "second", "then": "broken"})
            await _until(lambda: len(world.jobs.calls) == 2)
            started: Any = __import__("queue").SimpleQueue()
            started.put((first, procs[0].pid))
            started.put((second, procs[1].pid))
            svc._started = started
            world.queue.cancel(first)
            await _until(lambda: procs[0].poll() is not None)
            later = svc.submit("head", {"do": "succeed"})  # a fresh pool
            await _until(lambda: world.queue.get(later).state == "succeeded")
            world.queue.cancel(second)  # its process was in the pool stopped already
            await _until(lambda: procs[1].poll() is not None)
            world.jobs.gate("first").set()
            world.jobs.gate("second").set()
            await _until(lambda: not svc._running)
            final = svc.submit("head", {"do": "succeed"})
            await _until(lambda: world.queue.get(final).state == "succeeded")
            await svc.close()
            return first, second, final

        first, second, final = asyncio.run(go())
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [world.queue.get(j).state for j in (first, second, final)] == ["cancelled", "cancelled", "succeeded"]
    assert len(world.pools.made) == 2  # the later jobs shared the one fresh pool

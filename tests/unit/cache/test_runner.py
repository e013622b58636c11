"""layerbank.cache.runner (the one job runner) and the jobs table's failure type and migration."""

from __future__ import annotations

import errno
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from layerbank.cache import migrations
from layerbank.cache.catalog import Catalog
from layerbank.cache.errors import InputError
from layerbank.cache.jobs import JobQueue
from layerbank.cache.migrations import version
from layerbank.cache.runner import Claimer, JobError, Lease, Stopped, run_claimed
from layerbank.cache.space import ShardWriteError


@pytest.fixture
def q(tmp_path: Path) -> JobQueue:
    cat = Catalog(tmp_path / "catalog.sqlite")
    yield JobQueue(cat)
    cat.close()


def _run(q: JobQueue, fn, *, stopping: threading.Event | None = None) -> tuple[str, object]:  # type: ignore[no-untyped-def]
    jid = q.submit("k", {})
    job = Claimer(q, "w1", ["k"], lease_s=30).next()
    assert job is not None and job.id == jid
    lease = Lease(q, job, "w1", lease_s=30, heartbeat_s=0.02)
    state = run_claimed(q, job, "w1", lambda: fn(lease), lease, stopping=stopping)
    return state, q.get(jid)


def test_failures_record_their_type_and_a_message_for_a_person(q: JobQueue) -> None:
    def disk_full(lease: Lease) -> None:
        raise ShardWriteError(errno.ENOSPC, "no space left on device while writing shard j-00000.h5")

    state, job = _run(q, disk_full)
    assert state == "failed" and job.error_type == "storage"  # type: ignore[attr-defined]
    assert job.error == "ShardWriteError: no space left on device while writing shard j-00000.h5"  # type: ignore[attr-defined]

    def bad_input(lease: Lease) -> None:
        raise InputError("views: layer 7 does not exist", field="views")

    state, job = _run(q, bad_input)
    assert (state, job.error_type, job.error) == ("failed", "input", "views: layer 7 does not exist")  # type: ignore[attr-defined]

    def cannot_run(lease: Lease) -> None:
        raise JobError("dataset d1 was deleted before it was extracted")

    state, job = _run(q, cannot_run)
    assert (job.error_type, job.error) == ("input", "dataset d1 was deleted before it was extracted")  # type: ignore[attr-defined]

    def bug(lease: Lease) -> None:
        raise RuntimeError("CUDA error: an illegal memory access")

    state, job = _run(q, bug)
    assert (job.error_type, job.error) == ("internal", "RuntimeError: CUDA error: an illegal memory access")  # type: ignore[attr-defined]
    assert job.public()["error_type"] == "internal"  # type: ignore[attr-defined]


def test_success_writes_the_last_progress_and_the_result(q: JobQueue) -> None:
    def work(lease: Lease) -> dict[str, int]:
        for i in range(1, 4):
            lease.report({"done": i, "total": 3})
        return {"n": 3}

    state, job = _run(q, work)
    assert state == "succeeded" and job.result == {"n": 3} and job.progress == {"done": 3, "total": 3}  # type: ignore[attr-defined]
    assert job.error_type is None  # type: ignore[attr-defined]


def test_cancel_stops_the_handler_at_its_next_check(q: JobQueue) -> None:
    def work(lease: Lease) -> None:
        q.cancel(lease.job.id)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the heartbeat's renewal is refused
            lease.check()
            time.sleep(0.005)
        raise AssertionError("never stopped")

    state, job = _run(q, work)
    assert state == "cancelled" and job.state == "cancelled"  # type: ignore[attr-defined]


def test_a_stopping_runner_hands_the_job_back_without_counting_the_attempt(q: JobQueue) -> None:
    stopping = threading.Event()

    def work(lease: Lease) -> None:
        stopping.set()
        raise Stopped()

    state, job = _run(q, work, stopping=stopping)
    assert state == "released" and job.state == "queued" and job.attempts == 0  # type: ignore[attr-defined]


def test_a_job_whose_worker_died_too_often_fails_as_worker_died(q: JobQueue) -> None:
    jid = q.submit("k", {}, max_attempts=1)
    assert q.claim("w1", ["k"], lease_s=0.01) is not None
    time.sleep(0.05)
    assert q.claim("w2", ["k"], lease_s=30) is None
    job = q.get(jid)
    assert job is not None and job.state == "failed" and job.error_type == "worker_died"
    assert job.error == "worker died 1 times while running this job"


_OLD_JOBS = """
CREATE TABLE jobs (
    id TEXT PRIMARY KEY, kind TEXT NOT NULL, state TEXT NOT NULL, payload TEXT NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL DEFAULT 3, owner TEXT, lease_until REAL,
    progress TEXT NOT NULL DEFAULT '{}', result TEXT, error TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL, started REAL, finished REAL);
INSERT INTO jobs (id, kind, state, payload, error, created) VALUES
    ('disk', 'extract', 'failed', '{}', 'ShardWriteError: no space left on device while writing shard', 1),
    ('died', 'extract', 'failed', '{}', 'worker died 3 times while running this job', 2),
    ('bug', 'probe', 'failed', '{}', 'KeyError: ''mean''', 3),
    ('fine', 'probe', 'succeeded', '{}', NULL, 4);
"""


@pytest.mark.sqlite_only  # an old catalog.sqlite file
def test_a_catalog_from_before_the_failure_type_is_migrated_once(tmp_path: Path) -> None:
    path = tmp_path / "catalog.sqlite"
    db = sqlite3.connect(path)
    db.executescript(_OLD_JOBS)
    db.close()
    cat = Catalog(path)
    q = JobQueue(cat)
    assert version(cat, "jobs") == 1
    types = {j: q.get(j).error_type for j in ("disk", "died", "bug", "fine")}  # type: ignore[union-attr]
    assert types == {"disk": "storage", "died": "worker_died", "bug": "internal", "fine": None}
    assert q.get("disk").error == "ShardWriteError: no space left on device while writing shard"  # type: ignore[union-attr]
    # opened again (a restart, a second process): nothing runs twice
    JobQueue(Catalog(path))
    cols = [r[1] for r in cat.conn().execute("PRAGMA table_info(jobs)")]
    assert cols.count("error_type") == 1 and version(cat, "jobs") == 1
    cat.close()


@pytest.mark.sqlite_only  # an old catalog.sqlite file
def test_a_process_that_read_the_old_version_does_not_upgrade_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # two processes open an old catalog at once: both read version 0 before either
    # takes the write lock; the second must find version 1 inside its transaction
    path = tmp_path / "catalog.sqlite"
    db = sqlite3.connect(path)
    db.executescript(_OLD_JOBS)
    db.close()
    cat = Catalog(path)
    JobQueue(cat)  # the first process upgrades
    monkeypatch.setattr(migrations, "version", lambda catalog, part: 0)  # the second's stale read
    JobQueue(cat)  # no "duplicate column name: error_type"
    cols = [r[1] for r in cat.conn().execute("PRAGMA table_info(jobs)")]
    assert cols.count("error_type") == 1
    cat.close()

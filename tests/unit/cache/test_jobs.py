"""layerbank.cache.jobs.JobQueue: leases, heartbeats, retries, cancellation, priority."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from layerbank.cache.catalog import Catalog
from layerbank.cache.jobs import JobQueue, pid_alive

SHORT = 0.05  # a lease that expires within the test


@pytest.fixture
def q(tmp_path: Path) -> JobQueue:
    cat = Catalog(tmp_path / "catalog.sqlite")
    yield JobQueue(cat)
    cat.close()


def expire() -> None:
    time.sleep(SHORT * 2)


def test_submit_then_claim_runs_the_job(q: JobQueue) -> None:
    jid = q.submit("extract", {"dataset": "d1"})
    job = q.get(jid)
    assert job is not None and job.state == "queued" and job.attempts == 0
    assert job.payload == {"dataset": "d1"}
    got = q.claim("w1", ["extract"], lease_s=30)
    assert got is not None and got.id == jid
    assert got.state == "running" and got.attempts == 1 and got.started is not None
    assert q.claim("w2", ["extract"], lease_s=30) is None  # leased: nobody else gets it
    assert q.finish(jid, "w1", {"n": 3})
    done = q.get(jid)
    assert done is not None and done.state == "succeeded" and done.result == {"n": 3}
    assert done.finished is not None
    assert q.counts() == {"queued": 0, "running": 0, "succeeded": 1, "failed": 0, "cancelled": 0}


def test_claim_takes_only_the_kinds_asked_for(q: JobQueue) -> None:
    q.submit("probe", {})
    assert q.claim("w1", ["extract"], lease_s=30) is None
    got = q.claim("w1", ["extract", "probe"], lease_s=30)
    assert got is not None and got.kind == "probe"


def test_an_expired_lease_is_claimed_again_with_one_more_attempt(q: JobQueue) -> None:
    jid = q.submit("extract", {})
    q.claim("w1", ["extract"], lease_s=SHORT)
    expire()  # w1 died without heartbeating
    again = q.claim("w2", ["extract"], lease_s=30)
    assert again is not None and again.id == jid and again.attempts == 2
    # the dead worker's late calls no longer count
    assert not q.heartbeat(jid, "w1", 30)
    assert not q.finish(jid, "w1")
    assert q.heartbeat(jid, "w2", 30, {"done": 5, "total": 10})
    job = q.get(jid)
    assert job is not None and job.progress == {"done": 5, "total": 10}


def test_heartbeats_keep_the_lease(q: JobQueue) -> None:
    jid = q.submit("extract", {})
    q.claim("w1", ["extract"], lease_s=SHORT)
    for _ in range(3):
        time.sleep(SHORT / 2)
        assert q.heartbeat(jid, "w1", SHORT)
    assert q.claim("w2", ["extract"], lease_s=30) is None


def test_a_job_whose_worker_dies_max_attempts_times_fails(q: JobQueue) -> None:
    jid = q.submit("extract", {}, max_attempts=2)
    for attempt in (1, 2):
        job = q.claim(f"w{attempt}", ["extract"], lease_s=SHORT)
        assert job is not None and job.attempts == attempt
        expire()
    assert q.claim("w3", ["extract"], lease_s=30) is None
    job = q.get(jid)
    assert job is not None and job.state == "failed"
    assert job.error == "worker died 2 times while running this job"
    assert job.finished is not None


def test_fail_records_the_error(q: JobQueue) -> None:
    jid = q.submit("extract", {})
    q.claim("w1", ["extract"], lease_s=30)
    assert q.fail(jid, "w1", "model not found")
    job = q.get(jid)
    assert job is not None and job.state == "failed" and job.error == "model not found"


def test_cancelling_a_queued_job_stops_it_at_once(q: JobQueue) -> None:
    jid = q.submit("extract", {})
    job = q.cancel(jid)
    assert job is not None and job.state == "cancelled" and job.cancel_requested
    assert q.claim("w1", ["extract"], lease_s=30) is None


def test_cancelling_a_running_job_fails_its_next_heartbeat(q: JobQueue) -> None:
    jid = q.submit("extract", {})
    q.claim("w1", ["extract"], lease_s=30)
    assert q.heartbeat(jid, "w1", 30)
    job = q.cancel(jid)
    assert job is not None and job.state == "running" and job.cancel_requested
    assert not q.heartbeat(jid, "w1", 30)
    assert not q.heartbeat(jid, "w1", 30, {"done": 1})
    q.mark_cancelled(jid)
    job = q.get(jid)
    assert job is not None and job.state == "cancelled" and job.finished is not None


def test_a_cancelled_job_whose_worker_died_ends_cancelled_not_running(q: JobQueue) -> None:
    jid = q.submit("extract", {})
    q.claim("w1", ["extract"], lease_s=SHORT)
    q.cancel(jid)
    expire()  # w1 died before it could mark the job cancelled
    assert q.claim("w2", ["extract"], lease_s=30) is None  # not run again
    job = q.get(jid)
    assert job is not None and job.state == "cancelled"
    assert q.counts()["running"] == 0


def test_claim_order_is_priority_then_first_come(q: JobQueue) -> None:
    low = q.submit("extract", {}, priority=0)
    time.sleep(0.002)
    high_late = q.submit("extract", {}, priority=5)
    time.sleep(0.002)
    low2 = q.submit("extract", {}, priority=0)
    time.sleep(0.002)
    high_later = q.submit("extract", {}, priority=5)
    got = [q.claim("w", ["extract"], lease_s=30) for _ in range(4)]
    assert [j.id for j in got if j] == [high_late, high_later, low, low2]


def test_submit_with_an_id_and_list(q: JobQueue) -> None:
    q.submit("extract", {"x": 1}, job_id="job-a")
    time.sleep(0.002)
    q.submit("extract", {}, job_id="job-b")
    assert [j.id for j in q.list()] == ["job-b", "job-a"]
    pub = q.get("job-a").public()  # type: ignore[union-attr]
    assert "payload" not in pub and pub["state"] == "queued"
    assert q.get("nope") is None


def test_worker_liveness(q: JobQueue) -> None:
    q.worker_seen("w1", 123, {"device": "cpu"})
    live = q.live_workers(within_s=10)
    assert [(w["id"], w["pid"], w["device"]) for w in live] == [("w1", 123, "cpu")]
    assert q.live_workers(within_s=-1) == []


def test_pid_alive_tells_a_running_process_from_one_that_exited() -> None:
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its pid no longer names a process
    assert not pid_alive(child.pid)

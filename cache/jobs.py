"""The job queue: a table in the catalog, claimed by workers under a lease.

Why it lives in ``cache/`` and not between ``app/`` and ``workers/``: the queue
is a table in the same catalog as the stored rows, written in the same
transactions (a job's shards and its ``succeeded`` commit together), and both
``app/`` (which submits) and ``workers/`` (which claims) may import ``cache/``
but not each other. ``cache/runner.py`` is the loop a worker runs over it.

States: queued -> running -> succeeded | failed | cancelled. A worker claims
a job by writing its id and a lease deadline; it renews the lease with each
heartbeat. A job whose lease expired (its worker died) is claimed again and
its attempt count rises: at-least-once execution. Extraction shards are named
by (job, part), so a re-run overwrites rather than duplicates.

A failed job records its message (``error``, for a person) and its type
(``error_type``, one of ``layerbank.cache.errors.FAILURE_TYPES``), so the API
picks its answer (507 for a full disk, 422 for input) from the type. The
column came with the jobs table's migration 1 (cache/migrations.py); an older
catalog gets it, filled in for its failed rows, when it is first opened.

Example::

    q = JobQueue(catalog)
    job_id = q.submit("extract", {"dataset": "d1"})
    job = q.claim("worker-1", kinds=["extract"], lease_s=30)
"""

from __future__ import annotations

import builtins
import json
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .catalog import Catalog
from .migrations import migrate

__all__ = ["JOB_STATES", "Job", "JobQueue", "pid_alive"]

JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, kind TEXT NOT NULL, state TEXT NOT NULL, payload TEXT NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL DEFAULT 3, owner TEXT, lease_until REAL,
    progress TEXT NOT NULL DEFAULT '{}', result TEXT, error TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL, started REAL, finished REAL);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, priority, created);
CREATE TABLE IF NOT EXISTS workers (
    id TEXT PRIMARY KEY, pid INTEGER NOT NULL, info TEXT NOT NULL, last_seen REAL NOT NULL);
"""

# the jobs table's migrations (cache/migrations.py): append only, step i takes version i to i+1
_MIGRATIONS = [
    # 1: the failure type; rows failed before it get it from their message, the one time it is read
    "ALTER TABLE jobs ADD COLUMN error_type TEXT;"
    "UPDATE jobs SET error_type = CASE WHEN error LIKE 'ShardWriteError: %' THEN 'storage' "
    "WHEN error LIKE 'worker died % times while running this job' THEN 'worker_died' "
    "ELSE 'internal' END WHERE state = 'failed'",
]
_DIED = "'worker died ' || attempts || ' times while running this job', error_type='worker_died'"


@dataclass
class Job:
    id: str
    kind: str
    state: str
    payload: dict[str, Any]
    attempts: int
    max_attempts: int
    progress: dict[str, Any]
    result: Any
    error: str | None
    cancel_requested: bool
    created: float
    started: float | None
    finished: float | None
    error_type: str | None = None  # one of cache.errors.FAILURE_TYPES once failed

    def public(self) -> dict[str, Any]:
        """What the API shows (payloads can be large: texts stay out)."""
        return {"id": self.id, "kind": self.kind, "state": self.state,
                "attempts": self.attempts, "progress": self.progress, "error": self.error,
                "error_type": self.error_type,
                "created": self.created, "started": self.started, "finished": self.finished}


_COLS = ("id, kind, state, payload, attempts, max_attempts, progress, result, error, "
         "cancel_requested, created, started, finished, error_type")


def _job(row: Sequence[Any]) -> Job:
    return Job(row[0], row[1], row[2], json.loads(row[3]), row[4], row[5], json.loads(row[6]),
               None if row[7] is None else json.loads(row[7]), row[8], bool(row[9]),
               row[10], row[11], row[12], row[13])


class JobQueue:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        catalog.conn().executescript(_SCHEMA)
        migrate(catalog, "jobs", _MIGRATIONS)
        # PostgreSQL: claimers on other replicas pass over a row another one is taking
        # instead of waiting for it; SQLite's BEGIN IMMEDIATE lets one writer in at a time
        self._skip_locked = " FOR UPDATE SKIP LOCKED" if getattr(catalog, "dialect", "") == "postgres" else ""

    def submit(self, kind: str, payload: dict[str, Any], *, priority: int = 0,
               max_attempts: int = 3, job_id: str | None = None) -> str:
        job_id = job_id or uuid.uuid4().hex[:16]
        with self.catalog.tx() as db:
            db.execute("INSERT INTO jobs (id, kind, state, payload, priority, max_attempts, created) "
                       "VALUES (?,?,?,?,?,?,?)",
                       (job_id, kind, "queued", json.dumps(payload), priority, max_attempts, time.time()))
        return job_id

    def get(self, job_id: str) -> Job | None:
        r = self.catalog.conn().execute(f"SELECT {_COLS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if r is None else _job(r)

    def list(self, limit: int = 100, kinds: Sequence[str] | None = None) -> list[Job]:
        """The newest jobs first; only those of ``kinds`` when given."""
        where = ""
        args: tuple[Any, ...] = ()
        if kinds is not None:
            where, args = f"WHERE kind IN ({','.join('?' * len(kinds))}) ", tuple(kinds)
        rows = self.catalog.conn().execute(
            f"SELECT {_COLS} FROM jobs {where}ORDER BY created DESC LIMIT ?", (*args, limit)).fetchall()
        return [_job(r) for r in rows]

    def claim(self, owner: str, kinds: Sequence[str], lease_s: float) -> Job | None:
        """Take the most urgent queued job, or one whose lease expired."""
        now = time.time()
        marks = ",".join("?" * len(kinds))
        with self.catalog.tx() as db:
            # a cancelled job whose worker died before marking it would stay "running" forever
            db.execute("UPDATE jobs SET state='cancelled', finished=?, lease_until=NULL "
                       "WHERE state='running' AND cancel_requested=1 AND lease_until < ?", (now, now))
            # jobs whose worker died too often fail instead of looping forever
            db.execute(f"UPDATE jobs SET state='failed', finished=?, error={_DIED} WHERE state='running' "
                       "AND lease_until < ? AND attempts >= max_attempts", (now, now))
            r = db.execute(
                f"SELECT id FROM jobs WHERE kind IN ({marks}) AND cancel_requested = 0 AND "
                "(state='queued' OR (state='running' AND lease_until < ?)) "
                f"ORDER BY priority DESC, created LIMIT 1{self._skip_locked}", (*kinds, now)).fetchone()
            if r is None:
                return None
            db.execute("UPDATE jobs SET state='running', owner=?, lease_until=?, attempts=attempts+1, "
                       "started=COALESCE(started, ?) WHERE id=?", (owner, now + lease_s, now, r[0]))
        return self.get(r[0])

    def heartbeat(self, job_id: str, owner: str, lease_s: float,
                  progress: dict[str, Any] | None = None) -> bool:
        """Renew the lease (and record progress). False: stop, the job is not ours
        any more (cancelled, or the lease was lost to another worker)."""
        with self.catalog.tx() as db:
            if progress is not None:
                cur = db.execute("UPDATE jobs SET lease_until=?, progress=? WHERE id=? AND owner=? "
                                 "AND state='running' AND cancel_requested=0",
                                 (time.time() + lease_s, json.dumps(progress), job_id, owner))
            else:
                cur = db.execute("UPDATE jobs SET lease_until=? WHERE id=? AND owner=? "
                                 "AND state='running' AND cancel_requested=0",
                                 (time.time() + lease_s, job_id, owner))
            return cur.rowcount == 1

    def finish(self, job_id: str, owner: str, result: Any = None) -> bool:
        with self.catalog.tx() as db:
            cur = db.execute("UPDATE jobs SET state='succeeded', result=?, finished=?, lease_until=NULL "
                             "WHERE id=? AND owner=? AND state='running'",
                             (json.dumps(result), time.time(), job_id, owner))
            return cur.rowcount == 1

    def fail(self, job_id: str, owner: str, error: str, error_type: str = "internal") -> bool:
        """Record a failure: ``error`` for a person, ``error_type`` (cache.errors.FAILURE_TYPES)
        for the API's status code."""
        with self.catalog.tx() as db:
            cur = db.execute("UPDATE jobs SET state='failed', error=?, error_type=?, finished=?, "
                             "lease_until=NULL WHERE id=? AND owner=? AND state='running'",
                             (error[:4000], error_type, time.time(), job_id, owner))
            return cur.rowcount == 1

    def mark_cancelled(self, job_id: str) -> None:
        """Called by the worker once a running job has actually stopped."""
        with self.catalog.tx() as db:
            db.execute("UPDATE jobs SET state='cancelled', finished=?, lease_until=NULL WHERE id=? "
                       "AND state='running'", (time.time(), job_id))

    def cancel(self, job_id: str) -> Job | None:
        """Cancel: a queued job stops at once; a running one at its next heartbeat."""
        with self.catalog.tx() as db:
            db.execute("UPDATE jobs SET state='cancelled', finished=?, cancel_requested=1 "
                       "WHERE id=? AND state='queued'", (time.time(), job_id))
            db.execute("UPDATE jobs SET cancel_requested=1 WHERE id=? AND state='running'", (job_id,))
        return self.get(job_id)

    def queued(self, kinds: Sequence[str] | None = None) -> int:
        """How many jobs (of these kinds) wait to be claimed; a cheap read, no lock."""
        q = "SELECT COUNT(*) FROM jobs WHERE state='queued' AND cancel_requested=0"
        args: tuple[Any, ...] = ()
        if kinds is not None:
            q += f" AND kind IN ({','.join('?' * len(kinds))})"
            args = tuple(kinds)
        return int(self.catalog.conn().execute(q, args).fetchone()[0])

    def running_owners(self) -> dict[str, str]:
        """``{job id: owner}`` of the running jobs (to find those whose worker died)."""
        rows = self.catalog.conn().execute("SELECT id, owner FROM jobs WHERE state='running'")
        return {i: o for i, o in rows}

    def release(self, job_id: str, owner: str, *, died: bool) -> bool:
        """Hand a running job back to the queue now instead of at lease expiry.

        ``died=False``: its worker is shutting down cleanly; the attempt is not
        counted. ``died=True``: its worker is known dead; the attempt counts, and
        a job out of attempts fails as an expired one would.
        """
        with self.catalog.tx() as db:
            db.execute("UPDATE jobs SET state='cancelled', finished=?, lease_until=NULL WHERE id=? "
                       "AND owner=? AND state='running' AND cancel_requested=1",
                       (time.time(), job_id, owner))
            if died:
                db.execute(f"UPDATE jobs SET state='failed', finished=?, lease_until=NULL, error={_DIED} "
                           "WHERE id=? AND owner=? AND state='running' AND attempts >= max_attempts",
                           (time.time(), job_id, owner))
            cur = db.execute("UPDATE jobs SET state='queued', owner=NULL, lease_until=NULL, "
                             "attempts=attempts - ? WHERE id=? AND owner=? AND state='running'",
                             (0 if died else 1, job_id, owner))
            return cur.rowcount == 1

    def counts(self) -> dict[str, int]:
        rows = self.catalog.conn().execute("SELECT state, COUNT(*) FROM jobs GROUP BY state")
        out = {s: 0 for s in JOB_STATES}
        out.update({s: n for s, n in rows})
        return out

    # -- worker liveness (for /ready) --------------------------------------
    def worker_seen(self, worker_id: str, pid: int, info: dict[str, Any]) -> None:
        with self.catalog.tx() as db:
            db.execute("INSERT INTO workers VALUES (?,?,?,?) ON CONFLICT(id) DO UPDATE SET pid=excluded.pid, "
                       "info=excluded.info, last_seen=excluded.last_seen",
                       (worker_id, pid, json.dumps(info), time.time()))

    def live_workers(self, within_s: float) -> builtins.list[dict[str, Any]]:
        rows = self.catalog.conn().execute("SELECT id, pid, info, last_seen FROM workers "
                                           "WHERE last_seen > ?", (time.time() - within_s,))
        return [{"id": i, "pid": p, **json.loads(info), "last_seen": t} for i, p, info, t in rows]


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` on this host still exists (a job owner's liveness).

    A process we may not signal (another user's) counts as alive: only
    "no such process" proves a job's owner died.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

"""The PostgreSQL catalog's faults get the SQLite catalog's answers (issue 25, rows 4 and 5),
at the boundaries where they used to turn into 500s or a dead worker:

- psycopg's ``DiskFull`` is a full disk for every caller (``is_disk_full``, the
  job failure type "storage", the API's 507), no longer an unrecognised
  ``sqlite3.OperationalError``;
- a catalog that cannot be reached while a miss waits for its encode job is a
  503 with ``Retry-After`` for the request, never ``extraction_failed`` 500; so is
  a job that failed because the catalog could not be reached;
- the worker waits out an unreachable catalog (one warning, backoff) instead of
  ending its process, and runs jobs again once it answers.

The same faults on a real PostgreSQL server: tests/unit/cache/test_postgres_faults.py.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from layerbank.app.api.batcher import Batcher
from layerbank.app.api.errors import ApiError, job_failure
from layerbank.cache.errors import failure_type
from layerbank.cache.jobs import JobQueue
from layerbank.cache.postgres import CatalogUnavailable, sqlite_errors
from layerbank.cache.space import is_disk_full


def test_postgresql_disk_full_is_a_full_disk_for_every_caller() -> None:
    psycopg = pytest.importorskip("psycopg")
    with pytest.raises(sqlite3.OperationalError) as got, sqlite_errors():
        raise psycopg.errors.DiskFull('could not extend file "base/16384/16390": No space left on device')
    assert is_disk_full(got.value) and failure_type(got.value) == "storage"
    assert "No space left on device" in str(got.value)
    assert job_failure(str(got.value), failure_type(got.value)).status == 507
    # and the server going away is "unavailable", which a job that met it records
    with pytest.raises(CatalogUnavailable) as down, sqlite_errors():
        raise psycopg.errors.AdminShutdown("terminating connection due to administrator command")
    assert failure_type(down.value) == "unavailable"
    answer = job_failure(f"CatalogUnavailable: {down.value}", "unavailable")
    assert answer.status == 503 and answer.headers == {"Retry-After": "2"}


class _DownQueue:
    """A job queue whose catalog stops answering after ``ok`` calls."""

    def __init__(self, ok: int, exc: BaseException) -> None:
        self.calls, self.ok, self.exc = 0, ok, exc

    def _call(self) -> None:
        self.calls += 1
        if self.calls > self.ok:
            raise self.exc

    def submit(self, *a: Any, **k: Any) -> str:
        self._call()
        return "j"

    def get(self, job_id: str) -> Any:
        self._call()
        return type("J", (), {"state": "running"})()

    def cancel(self, job_id: str) -> None:
        pass


@pytest.mark.parametrize(("ok", "exc", "status"), [
    (0, CatalogUnavailable("the PostgreSQL catalog is unavailable: connection refused"), 503),
    (3, CatalogUnavailable("the PostgreSQL catalog is unavailable: server closed the connection"), 503),
    (0, sqlite3.OperationalError("the PostgreSQL catalog's database or disk is full (No space left)"), 507),
])
def test_a_miss_whose_catalog_fails_meanwhile_is_503_or_507_never_500(ok: int, exc: BaseException,
                                                                        status: int) -> None:
    async def go() -> ApiError:
        b = Batcher(_DownQueue(ok, exc), window_ms=1, max_pending=8, poll_s=0.001,  # type: ignore[arg-type]
                    timeout_s=5)
        try:
            await b.encode(["a text never seen"])
        except ApiError as e:
            return e
        finally:
            await b.close()
        raise AssertionError("no error")

    err = asyncio.run(go())
    assert err.status == status, (err.status, err.message)
    assert "extraction failed" not in err.message
    if status == 503:
        assert err.headers == {"Retry-After": "2"} and "unavailable" in err.message


def test_the_worker_waits_out_an_unreachable_catalog(tiny_encoder, store, caplog) -> None:  # type: ignore[no-untyped-def]
    from layerbank.workers.worker import Worker, WorkerOptions

    worker = Worker(store, tiny_encoder, WorkerOptions(poll_interval_s=0.002, heartbeat_seconds=0.2))
    worker._outage.first_s = worker._outage.max_s = 0.05  # the real backoff is 0.5-5 s
    down = threading.Event()
    down.set()
    real = worker.queue.claim

    def claim(*a: Any, **k: Any) -> Any:
        if down.is_set():
            raise CatalogUnavailable("the PostgreSQL catalog is unavailable: connection refused")
        return real(*a, **k)

    worker.queue.claim = claim  # type: ignore[method-assign]
    caplog.set_level(logging.INFO, logger="layerbank.worker")
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    try:
        job_id = JobQueue(store.catalog).submit("encode", {"texts": ["a text"]}, priority=100)
        deadline = time.monotonic() + 30
        while worker._outage.waits < 3:  # three tries failed and were waited out
            assert t.is_alive(), "the worker ended on an unreachable catalog"
            assert time.monotonic() < deadline, worker._outage.waits
            time.sleep(0.01)
        assert t.is_alive(), "the worker ended on an unreachable catalog"
        warnings = [r for r in caplog.records if "the catalog is unavailable" in r.getMessage()]
        assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING  # once, not per try
        down.clear()
        deadline = time.monotonic() + 30
        while (j := JobQueue(store.catalog).get(job_id)) is not None and j.state != "succeeded":
            assert time.monotonic() < deadline, j
            time.sleep(0.02)
        assert any("the catalog answers again" in r.getMessage() for r in caplog.records)
    finally:
        worker.stop()
        t.join(10)


def test_disk_full_outages_are_recognised_too(tmp_path: Path) -> None:
    from layerbank.cache.outage import catalog_outage

    assert catalog_outage(CatalogUnavailable("down"))
    assert catalog_outage(sqlite3.OperationalError("database or disk is full"))
    assert not catalog_outage(sqlite3.OperationalError("no such table: jobs"))
    assert not catalog_outage(ValueError("a bug"))

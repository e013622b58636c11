"""app/api/catalog_health.py on a bare FastAPI app: which catalog error a client sees as
503 (damaged, busy, PostgreSQL unreachable), 507 (full disk) or 500, with the exact words,
headers and log lines, and what the periodic check keeps in ``state.catalog_problem``
(what ``/ready`` answers with). No model and no data directory, so it runs in about a
second (bench/mutation.sh reruns it for every mutant of catalog_health.py; the real
damaged catalog is tests/reliability/test_catalog_damage.py)."""

from __future__ import annotations

import asyncio
import errno
import logging
import sqlite3
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from layerbank.app.api import catalog_health as H
from layerbank.cache.postgres import CatalogUnavailable

HINT = "stop the server and run `layerbank repair` to rebuild it from the shards"
ERRORS: dict[str, BaseException] = {
    "malformed": sqlite3.DatabaseError("database disk image is malformed"),
    "not-a-database": sqlite3.DatabaseError("file is not a database"),
    "encrypted": sqlite3.DatabaseError("file is encrypted or is not a database"),
    "io": sqlite3.OperationalError("disk I/O error"),
    "locked": sqlite3.OperationalError("database is locked"),
    "busy": sqlite3.OperationalError("database table is BUSY"),
    "full": sqlite3.OperationalError("database or disk is full"),
    "postgres": CatalogUnavailable("the PostgreSQL catalog cannot be reached: connection refused"),
    "other-sqlite": sqlite3.OperationalError("no such table: shards"),
    "enospc": OSError(errno.ENOSPC, "No space left on device"),
    "eacces": OSError(errno.EACCES, "Permission denied"),
}


def _client(state: Any = None) -> TestClient:
    app = FastAPI()
    H.install_catalog_handlers(app)
    if state is not None:
        app.state.layerbank = state

    @app.get("/raise/{kind}")
    @app.post("/v1/embeddings")
    def raise_(kind: str = "malformed") -> None:
        raise ERRORS[kind]

    return TestClient(app, raise_server_exceptions=False)


def _answer(r: Any) -> tuple[int, dict[str, Any], str | None]:
    return r.status_code, r.json(), r.headers.get("retry-after")


@pytest.mark.parametrize("kind", ["malformed", "not-a-database", "encrypted", "io"])
def test_a_damaged_catalog_is_503_naming_repair_and_marks_the_state_once(kind: str, caplog) -> None:  # type: ignore[no-untyped-def]
    state = SimpleNamespace(catalog_problem=None)
    c = _client(state)
    caplog.set_level(logging.INFO, "layerbank.api")
    reason = str(ERRORS[kind])
    for _ in range(2):
        assert _answer(c.get(f"/raise/{kind}")) == (
            503, {"error": f"the catalog is damaged ({reason}); {HINT}", "type": "not_ready"}, None)
    assert state.catalog_problem == reason  # /ready answers 503 with it from now on
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("layerbank.api", "ERROR", f"the catalog is damaged ({reason}); {HINT}")]  # once, not once a request


def test_damage_on_an_app_without_a_state_is_still_503() -> None:
    assert _client().get("/raise/malformed").status_code == 503


def test_the_openai_route_gets_the_damage_in_openais_shape() -> None:
    r = _client(SimpleNamespace(catalog_problem=None)).post("/v1/embeddings")
    assert r.status_code == 503
    assert r.json() == {"error": {"message": f"the catalog is damaged (database disk image is malformed); {HINT}",
                                  "type": "server_error", "param": None, "code": "not_ready"}}


@pytest.mark.parametrize("kind", ["locked", "busy"])
def test_a_busy_catalog_is_503_retry_in_a_second(kind: str) -> None:
    state = SimpleNamespace(catalog_problem=None)
    assert _answer(_client(state).get(f"/raise/{kind}")) == (
        503, {"error": "the catalog is busy; retry shortly", "type": "not_ready"}, "1")
    assert state.catalog_problem is None  # busy is not damage


def test_an_unreachable_postgresql_catalog_is_503_with_its_reason(caplog) -> None:  # type: ignore[no-untyped-def]
    state = SimpleNamespace(catalog_problem=None)
    caplog.set_level(logging.INFO, "layerbank.api")
    reason = "the PostgreSQL catalog cannot be reached: connection refused"
    assert _answer(_client(state).get("/raise/postgres")) == (
        503, {"error": f"{reason}; nothing was changed; retry shortly", "type": "not_ready"}, "2")
    assert state.catalog_problem is None
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("layerbank.api", "ERROR", f"GET /raise/postgres: {reason}")]


@pytest.mark.parametrize(("kind", "reason"), [("full", "database or disk is full"),
                                              ("enospc", "[Errno 28] No space left on device")])
def test_a_full_disk_is_507(kind: str, reason: str, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, "layerbank.api")
    assert _answer(_client(SimpleNamespace(catalog_problem=None)).get(f"/raise/{kind}")) == (
        507, {"error": f"the disk holding the data directory is full ({reason}); nothing was changed; free some "
                       "space and send the request again", "type": "insufficient_storage"}, None)
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("layerbank.api", "ERROR", f"GET /raise/{kind}: the disk is full: {reason}")]


@pytest.mark.parametrize("kind", ["other-sqlite", "eacces"])
def test_any_other_error_is_a_500_that_shows_nothing(kind: str, caplog) -> None:  # type: ignore[no-untyped-def]
    state = SimpleNamespace(catalog_problem=None)
    caplog.set_level(logging.INFO, "layerbank.api")
    assert _answer(_client(state).get(f"/raise/{kind}")) == (
        500, {"error": "internal error; the server log has the details", "type": "internal"}, None)
    assert state.catalog_problem is None
    [record] = caplog.records
    assert (record.name, record.levelname, record.getMessage()) == (
        "layerbank.api", "ERROR", f"unhandled error on GET /raise/{kind}")
    assert record.exc_info is not None and record.exc_info[1] is ERRORS[kind]  # the log has the details


def test_only_sqlite_errors_with_a_damage_word_are_damage() -> None:
    assert H.is_damage(sqlite3.DatabaseError("database disk image is MALFORMED"))
    assert not H.is_damage(ValueError("database disk image is malformed"))
    assert not H.is_damage(sqlite3.OperationalError("database is locked"))


def _watch(results: list[Any], dialect: str = "sqlite") -> tuple[SimpleNamespace, list[tuple[str, Any]], list[float]]:
    """Run watch_catalog over scripted check results; returns the state, what each check
    was called with and saw in the state, and each pause it took."""
    state = SimpleNamespace(store=SimpleNamespace(catalog=SimpleNamespace(dialect=dialect, path="/data/catalog.db")),
                            catalog_problem=None)
    calls: list[tuple[str, Any]] = []
    pauses: list[float] = []
    done = threading.Event()
    script = iter(results)

    def check(path: str) -> str | None:
        calls.append((path, state.catalog_problem))
        try:
            r = next(script)
        except StopIteration:
            done.set()
            return state.catalog_problem
        if isinstance(r, BaseException):
            raise r
        return r

    async def pause(seconds: float) -> None:
        if done.is_set():  # the script is used up: wait here to be cancelled
            await asyncio.get_running_loop().create_future()
        pauses.append(seconds)
        assert len(pauses) <= len(results), "the watcher pauses without checking"
        await asyncio.sleep(0)

    async def main() -> None:
        task = asyncio.create_task(H.watch_catalog(state, 7.5))
        for _ in range(2000):  # until the script is used up (or the task ended early)
            if done.is_set() or task.done():
                break
            await asyncio.sleep(0.005)
        if not task.done():
            task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    mp = pytest.MonkeyPatch()
    mp.setattr(H, "check_catalog", check)
    mp.setattr(H, "asyncio", SimpleNamespace(sleep=pause))
    try:
        asyncio.run(main())
    finally:
        mp.undo()
    return state, calls, pauses


def test_the_periodic_check_keeps_the_problem_until_the_catalog_passes_again(caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, "layerbank.api")
    state, calls, pauses = _watch([None, "page 3 is never used", "page 3 is never used",
                                   RuntimeError("cannot open"), None])
    # what each check saw in the state: the problem stays through a repeat and a check that
    # could not run, and is cleared by the next clean check
    assert calls == [("/data/catalog.db", p) for p in
                     (None, None, "page 3 is never used", "page 3 is never used", "page 3 is never used", None)]
    assert state.catalog_problem is None
    assert pauses == [7.5] * 5
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("layerbank.api", "ERROR", f"the catalog is damaged (page 3 is never used); {HINT}"),
        ("layerbank.api", "ERROR", "could not check the catalog"),
        ("layerbank.api", "WARNING", "the catalog passes its check again"),
    ]
    assert caplog.records[1].exc_info is not None


def test_a_postgresql_catalog_is_not_checked_here() -> None:
    state, calls, pauses = _watch(["never"], dialect="postgresql")
    assert (calls, pauses, state.catalog_problem) == ([], [], None)

"""The catalog's health as the API sees it: checked at start and periodically,
and learned from any request that trips over damage.

- ``watch_catalog(state, every_s)``: runs ``PRAGMA quick_check``
  (cache/repair.py ``check_catalog``) off the event loop at start and every
  ``every_s`` seconds; a problem is kept in ``state.catalog_problem`` and
  ``/ready`` answers 503 with it until the catalog is repaired (``layerbank
  repair`` with the server stopped).
- ``install_catalog_handlers(app)``: SQLite errors that escape a route are
  translated here, once: a damaged catalog (``database disk image is
  malformed``, ``file is not a database``) is 503 naming ``layerbank repair``
  (and marks the state, so ``/ready`` says so at once) instead of a 500 on
  every request; a PostgreSQL catalog that cannot be reached is 503 with
  psycopg's reason (cache/postgres.py ``CatalogUnavailable``); SQLite's own ``database or disk is full``, and any OSError
  with ENOSPC/EDQUOT/EFBIG, is 507, as a full disk is everywhere else
  (cache/space.py ``is_disk_full``).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from layerbank.app.api.errors import body_for
from layerbank.cache.postgres import CatalogUnavailable
from layerbank.cache.repair import check_catalog
from layerbank.cache.space import is_disk_full

__all__ = ["REPAIR_HINT", "install_catalog_handlers", "is_damage", "watch_catalog"]

log = logging.getLogger("layerbank.api")
REPAIR_HINT = "stop the server and run `layerbank repair` to rebuild it from the shards"
_DAMAGE = ("malformed", "not a database", "file is encrypted", "disk i/o error")


def is_damage(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.DatabaseError) and any(s in str(exc).lower() for s in _DAMAGE)




def _mark(state: Any, problem: str) -> None:
    if state is not None and getattr(state, "catalog_problem", None) != problem:
        state.catalog_problem = problem
        log.error("the catalog is damaged (%s); %s", problem, REPAIR_HINT)


async def watch_catalog(state: Any, every_s: float) -> None:
    """Check the catalog now and every ``every_s`` seconds (cancel the task to stop)."""
    if state.store.catalog.dialect != "sqlite":
        return  # PostgreSQL checks its own pages; /ready asks it for a row on every call
    path = state.store.catalog.path
    while True:
        try:
            problem = await run_in_threadpool(check_catalog, path)
        except Exception:  # a check that cannot run says nothing about the catalog
            log.exception("could not check the catalog")
        else:
            if problem is not None:
                _mark(state, problem)
            elif getattr(state, "catalog_problem", None) is not None:
                log.warning("the catalog passes its check again")
                state.catalog_problem = None
        await asyncio.sleep(every_s)


def _internal(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(body_for(request.url.path, 500, "internal error; the server log has the details",
                                 "internal"), status_code=500)


def _disk_full(request: Request, exc: Exception) -> JSONResponse:
    log.error("%s %s: the disk is full: %s", request.method, request.url.path, exc)
    msg = (f"the disk holding the data directory is full ({exc}); nothing was changed; free some "
           "space and send the request again")
    return JSONResponse(body_for(request.url.path, 507, msg, "insufficient_storage"), status_code=507)


async def _os_error(request: Request, exc: Exception) -> JSONResponse:
    return _disk_full(request, exc) if is_disk_full(exc) else _internal(request, exc)


async def _sqlite_error(request: Request, exc: Exception) -> JSONResponse:
    path = request.url.path
    if isinstance(exc, CatalogUnavailable):  # PostgreSQL down or restarting: nothing was changed
        log.error("%s %s: %s", request.method, path, exc)
        return JSONResponse(body_for(path, 503, f"{exc}; nothing was changed; retry shortly", "not_ready"),
                            status_code=503, headers={"Retry-After": "2"})
    if is_disk_full(exc):  # SQLite's own "database or disk is full": the catalog or its WAL
        return _disk_full(request, exc)
    if is_damage(exc):
        _mark(getattr(request.app.state, "layerbank", None), str(exc))
        msg = f"the catalog is damaged ({exc}); {REPAIR_HINT}"
        return JSONResponse(body_for(path, 503, msg, "not_ready"), status_code=503)
    if "locked" in str(exc).lower() or "busy" in str(exc).lower():
        return JSONResponse(body_for(path, 503, "the catalog is busy; retry shortly", "not_ready"),
                            status_code=503, headers={"Retry-After": "1"})
    return _internal(request, exc)


def install_catalog_handlers(app: FastAPI) -> None:
    app.add_exception_handler(sqlite3.DatabaseError, _sqlite_error)
    app.add_exception_handler(OSError, _os_error)  # ENOSPC/EDQUOT/EFBIG -> 507, anything else 500

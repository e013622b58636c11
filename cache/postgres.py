"""The catalog on PostgreSQL: the same SQL as on SQLite, through a connection pool.

Several API replicas, their workers and probe processes share one catalog
here (docs/operations.md). The tables, statements and semantics are the
SQLite catalog's (cache/catalog.py, jobs.py, datasets.py, ...); this module
makes the few dialect differences disappear, so there is one copy of every
statement:

- placeholders: ``?`` becomes ``%s`` (and a literal ``%``, as in a LIKE
  pattern, ``%%``);
- column types in CREATE/ALTER: ``REAL`` is PostgreSQL's 4-byte float (a
  timestamp would lose its seconds), so it becomes ``DOUBLE PRECISION``;
  ``INTEGER`` becomes ``BIGINT`` (byte counts pass 2**31);
- errors: psycopg's DB-API exceptions are raised as the ``sqlite3`` class of
  the same name (``IntegrityError`` for a duplicate id, ...), so callers catch
  one family whatever the backend; a server that cannot be reached is
  ``CatalogUnavailable`` (an ``OperationalError``), which the API answers
  with 503, ``Retry-After`` and its reason; a full disk (SQLSTATE 53100) is an
  ``OperationalError`` worded as SQLite's ("database or disk is full"), so
  ``cache/space.py is_disk_full`` and the API's 507 recognise it the same way;
- bounds: every connection has a connect timeout, TCP keepalives, a TCP user
  timeout and a ``statement_timeout`` (``LAYERBANK_CATALOG_STATEMENT_TIMEOUT_S``,
  120 s; 0: none), so no request waits on a silent server without end;
- schema scripts run in one transaction under an advisory lock, because
  PostgreSQL's ``CREATE TABLE IF NOT EXISTS`` is not safe against a second
  process doing the same at the same moment (two replicas starting together).

Connections: a ``psycopg_pool.ConnectionPool`` per process and URL, shared
by every ``Catalog`` opened on that URL. A statement outside a
transaction borrows a connection for that one statement (autocommit) and
returns its rows already fetched, so the FastAPI thread pool's 40 threads
never pin 40 connections; ``tx()`` holds one connection for the whole
transaction, and a ``tx()`` nested in it is a savepoint, as on SQLite.

Example::

    db = PostgresCatalogDb("postgresql://lb@db/layerbank")
    with db.tx() as c:
        c.execute("UPDATE jobs SET state = ? WHERE id = ?", ("queued", job_id))
    db.session().execute("SELECT COUNT(*) FROM entries").fetchone()
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import threading
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .errors import InputError

if TYPE_CHECKING:  # psycopg is the `postgres` extra: SQLite users never import it
    from psycopg_pool import ConnectionPool

__all__ = ["INDEX_WRITER_LOCK_SQL", "SCHEMA_LOCK_SQL", "CatalogUnavailable", "PostgresCatalogDb", "close_pools", "is_postgres_url",
           "translate"]

# schema changes one process at a time: held until the transaction ends
SCHEMA_LOCK_SQL = f"SELECT pg_advisory_xact_lock({zlib.crc32(b'layerbank schema')})"
# writes to the key index one at a time (cache/catalog.py ``_one_index_writer``)
INDEX_WRITER_LOCK_SQL = f"SELECT pg_advisory_xact_lock({zlib.crc32(b'layerbank key index')})"
_TYPES = [(re.compile(r"\bREAL\b"), "DOUBLE PRECISION"), (re.compile(r"\bINTEGER\b"), "BIGINT")]
_cache: dict[str, str] = {}


class CatalogUnavailable(sqlite3.OperationalError):
    """The PostgreSQL catalog cannot be reached (down, restarting, out of connections)."""

    failure_type = "unavailable"  # a job that met it failed for no fault of its own (cache/errors.py)


# connection exceptions, shutdown/crash recovery, too many connections or out of memory (53300,
# 53200), a statement cut by statement_timeout (57014): the server, not the statement, is the trouble
_UNAVAILABLE = ("08", "57P", "53200", "53300", "57014")
_SAME_NAME = ("IntegrityError", "DataError", "ProgrammingError", "NotSupportedError", "InternalError",
              "OperationalError")


@contextlib.contextmanager
def sqlite_errors() -> Iterator[None]:
    """Raise psycopg's errors as sqlite3's classes of the same name (module docstring)."""
    import psycopg
    from psycopg_pool import PoolTimeout

    try:
        yield
    except (PoolTimeout, psycopg.OperationalError, psycopg.InterfaceError) as e:
        state = str(getattr(e, "sqlstate", None) or "")
        if state == "53100":  # disk_full: worded as SQLite's, so every caller's is_disk_full says 507
            raise sqlite3.OperationalError(f"the PostgreSQL catalog's database or disk is full "
                                           f"({_first_line(e)})") from e
        if isinstance(e, PoolTimeout | psycopg.InterfaceError) or not state \
                or state.startswith(_UNAVAILABLE):
            raise CatalogUnavailable(f"the PostgreSQL catalog is unavailable: {_first_line(e)}") from e
        raise sqlite3.OperationalError(_first_line(e)) from e
    except psycopg.DataError as e:
        if "NUL" in str(e):  # SQLite stores it; PostgreSQL's text cannot: the caller's input, a 422
            raise InputError("a text holds a NUL character (\\x00), which a PostgreSQL catalog cannot "
                             "store; remove it") from e
        raise sqlite3.DataError(_first_line(e)) from e
    except psycopg.Error as e:
        name = next((n for n in _SAME_NAME if isinstance(e, getattr(psycopg, n))), "DatabaseError")
        raise getattr(sqlite3, name)(_first_line(e)) from e


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def is_postgres_url(url: str | None) -> bool:
    return bool(url) and str(url).split("://", 1)[0] in ("postgresql", "postgres")


def translate(sql: str) -> str:
    """A statement written for SQLite, as PostgreSQL takes it (cached: statements repeat)."""
    out = _cache.get(sql)
    if out is None:
        out = sql.replace("%", "%%").replace("?", "%s")
        if out.lstrip()[:6].upper() in ("CREATE", "ALTER "):
            for pattern, pg_type in _TYPES:
                out = pattern.sub(pg_type, out)
        _cache[sql] = out
    return out


class Rows:
    """A finished statement's rows and row count (the connection is already back in the pool)."""

    def __init__(self, rows: list[tuple[Any, ...]], rowcount: int) -> None:
        self._rows, self.rowcount, self._i = rows, rowcount, 0

    def fetchone(self) -> tuple[Any, ...] | None:
        if self._i >= len(self._rows):
            return None
        self._i += 1
        return self._rows[self._i - 1]

    def fetchall(self) -> list[tuple[Any, ...]]:
        rest, self._i = self._rows[self._i:], len(self._rows)
        return rest

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.fetchall())


def _run(conn: Any, sql: str, args: Sequence[Any] = ()) -> Rows:
    cur = conn.execute(translate(sql), tuple(args))
    return Rows(cur.fetchall() if cur.description is not None else [], cur.rowcount)


class Session:
    """What ``Catalog.conn()`` returns on PostgreSQL: sqlite3.Connection's
    ``execute``/``executemany``/``executescript``, on this thread's transaction
    when one is open, else on a connection borrowed for the one statement."""

    def __init__(self, db: PostgresCatalogDb) -> None:
        self.db = db

    @property
    def in_transaction(self) -> bool:
        return self.db._held() is not None

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Rows:
        conn = self.db._held()
        with sqlite_errors():
            if conn is not None:
                return _run(conn, sql, args)
            with self.db.pool.connection() as conn:
                return _run(conn, sql, args)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Rows:
        rows = [tuple(r) for r in rows]
        with self.db.tx():
            conn = self.db._held()
            with sqlite_errors(), conn.cursor() as cur:
                if rows:
                    cur.executemany(translate(sql), rows)
                return Rows([], cur.rowcount)

    def executescript(self, script: str) -> None:
        """DDL, one transaction, one process at a time (see the module's docstring)."""
        with self.db.tx() as c:
            c.execute(SCHEMA_LOCK_SQL)
            for statement in filter(str.strip, script.split(";")):
                c.execute(statement)

    def close(self) -> None:  # the pool owns the connections
        pass


class _Tx:
    """``with db.tx() as c``: BEGIN … COMMIT on one pooled connection, ROLLBACK on
    error; nested on the same thread, a savepoint (as cache/catalog.py's on SQLite)."""

    def __init__(self, db: PostgresCatalogDb) -> None:
        self.db = db
        self._ctx: Any = None

    def __enter__(self) -> Session:
        local = self.db._local
        with sqlite_errors():
            if getattr(local, "conn", None) is None:
                ctx = self.db.pool.connection()
                conn = ctx.__enter__()
                try:
                    conn.execute("BEGIN")
                except BaseException as e:
                    ctx.__exit__(type(e), e, e.__traceback__)
                    raise
                self._ctx, local.conn, local.depth = ctx, conn, 0
            else:
                local.depth += 1
                local.conn.execute(f"SAVEPOINT lb_{local.depth}")
        return self.db.session()

    def __exit__(self, exc_type, exc, tb) -> None:
        local = self.db._local
        with sqlite_errors():
            if self._ctx is None:  # a savepoint
                if exc_type and not local.conn.closed:
                    local.conn.execute(f"ROLLBACK TO SAVEPOINT lb_{local.depth}")
                if not local.conn.closed:
                    local.conn.execute(f"RELEASE SAVEPOINT lb_{local.depth}")
                local.depth -= 1
                return
            conn, local.conn = local.conn, None
            try:
                if not conn.closed:
                    conn.execute("ROLLBACK" if exc_type else "COMMIT")
            finally:
                self._ctx.__exit__(exc_type, exc, tb)  # back to the pool (a broken one is discarded)


# one pool per process and URL, shared by every Catalog opened on it (the API opens
# several); keyed by pid too, so a forked child never talks on its parent's sockets
_pools: dict[tuple[int, str], ConnectionPool] = {}
_pools_lock = threading.Lock()


def _pool_for(url: str, max_size: int, timeout_s: float) -> ConnectionPool:
    from psycopg_pool import ConnectionPool

    key = (os.getpid(), url)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None or pool.closed:
            pool = ConnectionPool(url, min_size=1, max_size=max_size, timeout=timeout_s, num_workers=1,
                                  kwargs={"autocommit": True, **_bounds(url, timeout_s)}, open=False,
                                  check=ConnectionPool.check_connection, name="layerbank-catalog")
            _pools[key] = pool
            with sqlite_errors():
                pool.open(wait=True, timeout=timeout_s)
        return pool


# a server that stops answering (host gone, network cut) must not hold a request forever:
# libpq's connect timeout, TCP keepalives and a user timeout cut a dead connection; the
# statement timeout cuts a statement stuck on the server (a lock, a full disk's retries)
# (the setting catalog_statement_timeout_s, LAYERBANK_CATALOG_STATEMENT_TIMEOUT_S, read when a pool opens)
def _statement_timeout_s() -> float:
    from layerbank.settings import setting  # the one reader of the environment

    return float(setting("catalog_statement_timeout_s"))


def _bounds(url: str, timeout_s: float) -> dict[str, Any]:
    """Connection parameters that bound every wait, unless the URL sets them itself."""
    from psycopg.conninfo import conninfo_to_dict

    given = conninfo_to_dict(url)
    want: dict[str, Any] = {"connect_timeout": max(2, int(timeout_s)), "keepalives": 1,
                            "keepalives_idle": 10, "keepalives_interval": 3, "keepalives_count": 3,
                            "tcp_user_timeout": 20_000}
    out = {k: v for k, v in want.items() if k not in given}
    options = str(given.get("options") or "")
    statement_timeout_s = _statement_timeout_s()
    if statement_timeout_s > 0 and "statement_timeout" not in options:
        out["options"] = f"{options} -c statement_timeout={int(statement_timeout_s * 1000)}".strip()
    return out


def close_pools() -> None:
    """Close this process's catalog pools (at exit, or between tests); a later use reopens."""
    with _pools_lock:
        mine = [k for k in _pools if k[0] == os.getpid()]
        for key in mine:
            _pools.pop(key).close()


class PostgresCatalogDb:
    """Statements and transactions on one PostgreSQL database, through this process's pool."""

    dialect = "postgres"

    # timeout_s: how long a statement waits for a connection; with the server down a request
    # answers 503 after this long rather than hanging
    def __init__(self, url: str, *, max_size: int = 16, timeout_s: float = 5.0) -> None:
        self.url, self._max_size, self._timeout_s = url, max_size, timeout_s
        self._local = threading.local()
        self._session = Session(self)
        self._pool: ConnectionPool | None = None  # this process's shared pool, once looked up
        self.pool  # noqa: B018  (connect now: a wrong URL fails here, not at the first request)

    @property
    def pool(self) -> ConnectionPool:
        # every statement asks: skip the registry's lock while the pool we hold is open
        # (closed by close_pools, or inherited across a fork: look it up again)
        pool = self._pool
        if pool is None or pool.closed or _pools.get((os.getpid(), self.url)) is not pool:
            pool = self._pool = _pool_for(self.url, self._max_size, self._timeout_s)
        return pool

    def _held(self) -> Any:
        return getattr(self._local, "conn", None)

    def session(self) -> Session:
        return self._session

    def tx(self) -> _Tx:
        return _Tx(self)

    def close(self) -> None:
        """Nothing to release: the pool is the process's (``close_pools``)."""

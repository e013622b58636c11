"""Versioned schema changes for the catalog's tables, applied once per catalog file.

Each part of the catalog (``"jobs"``, ...) keeps its own version in the
``schema_versions`` table, so parts evolve independently. ``migrate`` runs the
steps a catalog has not seen yet, in order, each in the same write
transaction as the version bump: a server, its worker and probe processes
may open an old catalog at the same moment, and exactly one of them upgrades
it (the others find the new version once they get the write lock).

Steps only ever get appended: step i takes version i to i+1. An old catalog
opened by new code is upgraded in place; its rows stay.

Example::

    migrate(catalog, "jobs", ["ALTER TABLE jobs ADD COLUMN error_type TEXT"])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from .postgres import SCHEMA_LOCK_SQL

__all__ = ["migrate", "version"]

class Catalog(Protocol):
    """What a migration needs of ``cache.catalog.Catalog`` (which calls ``migrate``, so
    this module does not import it)."""

    def conn(self) -> Any: ...

    def tx(self) -> Any: ...


_TABLE = "CREATE TABLE IF NOT EXISTS schema_versions (part TEXT PRIMARY KEY, version INTEGER NOT NULL)"


def version(catalog: Catalog, part: str) -> int:
    """The version ``part`` of this catalog is at (0: never migrated)."""
    db = catalog.conn()
    db.executescript(_TABLE)  # on PostgreSQL under the schema lock (cache/postgres.py)
    row = db.execute("SELECT version FROM schema_versions WHERE part = ?", (part,)).fetchone()
    return 0 if row is None else int(row[0])


def migrate(catalog: Catalog, part: str, steps: Sequence[str]) -> int:
    """Apply the steps (SQL scripts) of ``part`` this catalog lacks; returns the new version."""
    if version(catalog, part) >= len(steps):  # the usual case: one cheap read, no lock
        return len(steps)
    with catalog.tx() as db:
        if getattr(catalog, "dialect", "sqlite") == "postgres":  # SQLite's BEGIN IMMEDIATE already serialises
            db.execute(SCHEMA_LOCK_SQL)
        row = db.execute("SELECT version FROM schema_versions WHERE part = ?", (part,)).fetchone()
        have = 0 if row is None else int(row[0])
        for sql in steps[have:]:
            for statement in filter(str.strip, sql.split(";")):  # executescript would commit the tx
                db.execute(statement)
        if have < len(steps):
            db.execute("INSERT INTO schema_versions VALUES (?, ?) ON CONFLICT(part) DO UPDATE SET "
                       "version = excluded.version", (part, len(steps)))
    return len(steps)

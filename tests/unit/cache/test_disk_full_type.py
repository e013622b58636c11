"""A full disk is "storage" (507) wherever it was met: a shard write, SQLite's own
"database or disk is full" (the catalog or its WAL), a head's files."""

from __future__ import annotations

import errno
import sqlite3

import pytest

from layerbank.cache.errors import failure_type
from layerbank.cache.space import ShardWriteError, is_disk_full


def _chained() -> BaseException:
    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as e:
            raise RuntimeError("commit failed") from e
    except RuntimeError as e:
        return e


def _context(inner: BaseException) -> BaseException:
    """``inner`` as the __context__ (not the cause) of a RuntimeError, as a bare raise in an except makes."""
    try:
        try:
            raise inner
        except BaseException:
            raise RuntimeError("HDF5: unable to write")  # noqa: B904
    except RuntimeError as e:
        return e


@pytest.mark.parametrize("exc,full", [
    (_context(OSError(errno.ENOSPC, "No space left on device")), True),
    (_context(OSError(errno.EACCES, "Permission denied")), False),
    (sqlite3.OperationalError("database or disk is full"), True),
    (OSError(errno.ENOSPC, "No space left on device"), True),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), True),
    (OSError("Can't write data (file write failed: errno = 28, error message = 'No space')"), True),
    (ShardWriteError(errno.ENOSPC, "no space"), True),
    (_chained(), True),
    (sqlite3.OperationalError("database is locked"), False),
    (sqlite3.DatabaseError("database disk image is malformed"), False),
    (OSError(errno.EACCES, "Permission denied"), False),
    (ValueError("disk is full"), False),
])
def test_a_full_disk_is_storage_wherever_it_was_met(exc: BaseException, full: bool) -> None:
    assert is_disk_full(exc) is full
    assert failure_type(exc) == ("storage" if full else "internal")

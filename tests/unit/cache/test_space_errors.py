"""cache/space.py's translation of a failed write into the one full-disk error, for the
cases the shard writer meets: an errno found in the chain, none but a disk that is
visibly too small, SQLite's words only as a cause, and a file-size error with no
``ulimit -f`` set. Written for the mutants bench/mutation.sh found surviving."""

from __future__ import annotations

import errno
import resource
import sqlite3
from pathlib import Path

import pytest

from layerbank.cache import space
from layerbank.cache.space import ShardWriteError, _message, as_write_error, is_disk_full

HUGE = 10**18  # more than any disk holds


def test_an_errno_in_the_chain_is_kept_whatever_the_free_space(tmp_path: Path) -> None:
    got = as_write_error(OSError(errno.EDQUOT, "Disk quota exceeded"), tmp_path / "j-00000.h5.tmp", 1)
    assert isinstance(got, ShardWriteError) and got.errno == errno.EDQUOT
    assert str(got).startswith("disk quota exceeded while writing shard j-00000.h5: it needs about 1 bytes, ")


def test_hdf5s_own_follow_up_error_on_a_disk_too_small_is_enospc(tmp_path: Path) -> None:
    follow_up = RuntimeError("Can't decrement id ref count (unable to close file)")  # no errno in it
    got = as_write_error(follow_up, tmp_path / "j-00000.h5.tmp", HUGE)
    assert isinstance(got, ShardWriteError) and got.errno == errno.ENOSPC
    assert as_write_error(follow_up, tmp_path / "j-00000.h5.tmp", 1) is None  # room enough: not a full disk


def test_sqlites_full_disk_met_only_as_a_cause_is_a_full_disk() -> None:
    e = RuntimeError("could not commit")
    e.__cause__ = sqlite3.OperationalError("database or disk is full")
    assert e.__context__ is None and is_disk_full(e)


def test_a_file_size_error_without_a_ulimit_says_unlimited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # EFBIG with no ulimit: the file system's own largest file (e.g. 4 GiB on FAT)
    monkeypatch.setattr(space.resource, "getrlimit", lambda _: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    msg = _message(errno.EFBIG, tmp_path / "j-00000.h5.tmp", 5 * 1024 * 1024)
    assert msg == ("file too large while writing shard j-00000.h5: it needs about 5.0 MiB, and this process may "
                   "write files of at most unlimited (ulimit -f); raise the limit or make shards smaller "
                   "(--part-size), then run the job again")

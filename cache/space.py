"""Room on disk for a shard, checked before HDF5 writes a byte.

HDF5 does not recover from a write that fails half-way with ENOSPC or EFBIG:
the file cannot be closed cleanly ("Slist already enabled?") and the process
may crash later, when the half-closed objects are collected. So the shard
writer estimates the file's size first (an upper bound: data, one checksum
and one index entry per chunk, metadata) and refuses to start when the disk,
or the process's file-size limit (``ulimit -f``), cannot hold it. A disk that
fills *during* the write (another process writing at the same moment) is
still reported in the same words by ``as_write_error``.

Example::

    need = estimate_bytes(array_bytes=[a.nbytes for a in arrays], n_chunks=40)
    check_room(Path("data/shards/job-00000.h5.tmp"), need)   # ShardWriteError if it cannot fit
"""

from __future__ import annotations

import errno
import re
import resource
import shutil
from collections.abc import Iterable
from pathlib import Path

__all__ = ["ShardWriteError", "as_write_error", "check_room", "estimate_bytes", "is_disk_full"]

_DISK_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}
_PER_CHUNK = 96  # fletcher32 checksum + B-tree entry, rounded up
_METADATA = 64 * 1024  # superblock, object headers, attributes


class ShardWriteError(OSError):
    """A shard that could not be written: disk full, quota, or file-size limit.

    ``errno`` is ENOSPC, EDQUOT or EFBIG; the message names the shard, what it
    needed and what was available. Nothing was committed: free space and run
    the job again.
    """

    failure_type = "storage"  # cache/errors.py: a job that raised it answers 507, not 500

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def estimate_bytes(array_bytes: Iterable[int], n_chunks: int) -> int:
    """Upper bound of a shard file's size from its arrays' bytes and chunk count."""
    return int(sum(array_bytes)) + _PER_CHUNK * n_chunks + _METADATA


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} TiB"  # pragma: no cover


def _shard_name(path: Path) -> str:
    return path.name.removesuffix(".tmp")


def _message(code: int, path: Path, need: int) -> str:
    name, where = _shard_name(path), path.parent
    if code == errno.EFBIG:
        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        limit = "unlimited" if soft == resource.RLIM_INFINITY else _size(soft)
        return (f"file too large while writing shard {name}: it needs about {_size(need)}, and this "
                f"process may write files of at most {limit} (ulimit -f); raise the limit or "
                "make shards smaller (--part-size), then run the job again")
    try:
        free = _size(shutil.disk_usage(where).free)
    except OSError:
        free = "unknown"
    what = "disk quota exceeded" if code == errno.EDQUOT else "no space left on device"
    return (f"{what} while writing shard {name}: it needs about {_size(need)}, {free} free in "
            f"{where}; free some space and run the job again (nothing was committed)")


def check_room(path: Path, need: int) -> None:
    """Raise ShardWriteError unless a file of ``need`` bytes fits at ``path``."""
    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if soft != resource.RLIM_INFINITY and need > soft:
        raise ShardWriteError(errno.EFBIG, _message(errno.EFBIG, path, need))
    if need > shutil.disk_usage(path.parent).free:
        raise ShardWriteError(errno.ENOSPC, _message(errno.ENOSPC, path, need))


def _disk_errno(exc: BaseException | None) -> int | None:
    """ENOSPC/EFBIG/EDQUOT anywhere in the chain (HDF5 puts it in the message text)."""
    seen = 0
    while exc is not None and seen < 8:
        code = getattr(exc, "errno", None)
        if code in _DISK_ERRNOS:
            return int(code)
        m = re.search(r"errno = (\d+)", str(exc))
        if m and int(m.group(1)) in _DISK_ERRNOS:
            return int(m.group(1))
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def is_disk_full(exc: BaseException) -> bool:
    """A full disk, quota or file-size limit, whoever hit it: an OSError with ENOSPC, EDQUOT
    or EFBIG in its chain, or SQLite's own "database or disk is full" (the catalog or
    its WAL could not grow)."""
    e: BaseException | None = exc
    for _ in range(8):
        if e is None:
            break
        if type(e).__name__ == "OperationalError" and "disk is full" in str(e):  # sqlite3, not imported here
            return True
        e = e.__cause__ or e.__context__
    return _disk_errno(exc) is not None


def as_write_error(exc: BaseException, path: Path, need: int) -> ShardWriteError | None:
    """The ShardWriteError for a write that failed for lack of room, else None."""
    if isinstance(exc, ShardWriteError):
        return exc
    code = _disk_errno(exc)
    if code is None:
        try:  # HDF5 may report only its own follow-up error; the disk tells the truth
            if shutil.disk_usage(path.parent).free < need:
                code = errno.ENOSPC
        except OSError:
            return None
    if code is None:
        return None
    return ShardWriteError(code, _message(code, path, need))

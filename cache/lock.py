"""One server per data directory: an exclusive lock file.

Two processes writing the same catalog and shard directory would each clean
up the other's temporary files; the second one is refused instead.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

__all__ = ["DataDirLock", "DataDirBusy", "hold_data_dir"]


class DataDirBusy(RuntimeError):
    pass


class DataDirLock:
    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.path = Path(data_dir) / "layerbank.lock"
        self._fd: int | None = None

    def acquire(self) -> DataDirLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise DataDirBusy(
                f"data directory {self.path.parent} is in use by {holder}; stop it or "
                "choose another --data-dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DataDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def hold_data_dir(data_dir: str | os.PathLike[str]) -> DataDirLock:
    """The directory's lock for an in-process user (the CLI, layerbank.Bank),
    or RuntimeError naming the holder: the one message both show."""
    lock = DataDirLock(data_dir)
    try:
        return lock.acquire()
    except DataDirBusy as e:
        raise RuntimeError(f"{e} (while a server runs, send work to its API)") from None

"""layerbank.cache.lock.DataDirLock: one writer per data directory, and the refusal
names who holds it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from layerbank.cache.lock import DataDirBusy, DataDirLock

ROOT = Path(__file__).resolve().parents[3]


def test_second_lock_in_the_same_process_is_refused_naming_the_pid(tmp_path: Path) -> None:
    with DataDirLock(tmp_path), pytest.raises(DataDirBusy) as e:
        DataDirLock(tmp_path).acquire()
    assert str(e.value) == (f"data directory {tmp_path} is in use by pid {os.getpid()}; stop it or "
                            "choose another --data-dir")


def test_lock_held_by_another_process_names_that_process(tmp_path: Path) -> None:
    script = ("import sys; from layerbank.cache.lock import DataDirLock; "
              f"l = DataDirLock({str(tmp_path)!r}).acquire(); print('held', flush=True); "
              "sys.stdin.readline()")
    holder = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(DataDirBusy, match=f"is in use by pid {holder.pid};"):
            DataDirLock(tmp_path).acquire()
    finally:
        holder.communicate("\n", timeout=10)
    # the holder exited: the directory is free again
    lock = DataDirLock(tmp_path).acquire()
    assert (tmp_path / "layerbank.lock").read_text() == f"pid {os.getpid()}"
    lock.release()


def test_release_then_acquire_again(tmp_path: Path) -> None:
    lock = DataDirLock(tmp_path / "new-dir").acquire()
    assert (tmp_path / "new-dir" / "layerbank.lock").exists()
    lock.release()
    lock.release()  # twice is harmless
    DataDirLock(tmp_path / "new-dir").acquire().release()

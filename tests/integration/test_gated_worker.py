"""``layerbank serve`` starts its worker gated (app/cli/worker_process.py): the worker
process imports torch and reads the model's files while the server checks and cleans the
data directory, and touches that directory only once the gate opens.

Real processes: the supervisor's own worker command on the tiny model. The state waited
for is the worker's main thread blocked reading its stdin (``/proc/<pid>/syscall``: read,
fd 0), which it reaches only after its imports and the model's read.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from layerbank.app.cli.worker_process import WorkerSupervisor
from layerbank.settings import Settings, settings_env

pytestmark = pytest.mark.skipif(not Path("/proc/self/syscall").exists() or platform.machine() != "x86_64",
                                reason="reads /proc/<pid>/syscall with x86-64 syscall numbers")


def _waiting_for_go(pid: int, timeout: float = 120.0) -> None:
    """Until ``pid`` sits in read(0, ...): its imports done, waiting for serve's word."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fields = Path(f"/proc/{pid}/syscall").read_text().split()
        except OSError:
            fields = []
        if fields[:2] == ["0", "0x0"]:  # syscall 0 is read on x86-64, its first argument the fd
            return
        assert time.monotonic() < deadline, f"worker {pid} never waited on its stdin ({fields})"
        time.sleep(0.05)


def _started(sup: WorkerSupervisor) -> subprocess.Popen[bytes]:
    """The supervisor's worker process, once its thread has started it."""
    deadline = time.monotonic() + 30
    while sup.proc is None:
        assert time.monotonic() < deadline, "the supervisor never started its worker"
        time.sleep(0.01)
    return sup.proc


def _modules_of(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_a_gated_worker_reads_its_model_first_and_opens_the_data_directory_after_the_gate(
        tmp_path: Path, tiny_model_dir: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    model = shutil.copytree(tiny_model_dir, tmp_path / "model")
    settings = Settings(data_dir=data, model=str(model), device="cpu", heartbeat_seconds=0.5,
                        engine="torch", precision="default")
    fatal: list[int] = []
    sup = WorkerSupervisor(settings, on_fatal=fatal.append, gated=True).start()
    try:
        pid = _started(sup).pid
        _waiting_for_go(pid)
        assert "libtorch" in _modules_of(pid)  # torch is loaded before the gate
        assert sorted(p.name for p in data.iterdir()) == []  # and nothing is written before it
        shutil.rmtree(model)  # the model was read before the gate: the worker needs its files no more
        sup.open_gate()
        from layerbank.cache.jobs import JobQueue
        from layerbank.cache.store import FeatureStore

        deadline = time.monotonic() + 120
        store = FeatureStore(data, catalog_url=settings.catalog_url)  # SQLite or the PostgreSQL pass's
        try:
            while not JobQueue(store.catalog).live_workers(10.0):
                assert sup.proc.poll() is None and time.monotonic() < deadline, "the worker never came up"
                time.sleep(0.05)
        finally:
            store.close()
        assert sup.proc.pid == pid and sup.restarts == 0 and fatal == []
    finally:
        sup.stop()
    assert sup.proc.poll() is not None


def test_a_gated_worker_stopped_before_the_gate_leaves_nothing(tmp_path: Path, tiny_model_dir: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    settings = Settings(data_dir=data, model=tiny_model_dir, device="cpu")
    sup = WorkerSupervisor(settings, on_fatal=lambda rc: None, gated=True).start()
    proc = _started(sup)
    _waiting_for_go(proc.pid)
    sup.stop()  # serve failing its checks (a catalog that is no database) does this
    assert proc.poll() is not None and list(data.iterdir()) == []


def test_a_gated_worker_whose_server_is_gone_exits_without_writing(tmp_path: Path, tiny_model_dir: str) -> None:
    """End of file on stdin (the server died before the gate): exit 0, nothing written."""
    data = tmp_path / "data"
    data.mkdir()
    env = settings_env(Settings(data_dir=data, model=tiny_model_dir, device="cpu"))
    proc = subprocess.Popen([sys.executable, "-P", "-m", "layerbank.app.cli.main", "worker", "--wait-for-go",
                             "--parent-pid", str(os.getpid())], env=env, stdin=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        _waiting_for_go(proc.pid)
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(60) == 0
        assert proc.stderr is not None and b"Traceback" not in proc.stderr.read()
        assert list(data.iterdir()) == []
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_gated_worker_whose_model_cannot_load_says_so_after_the_gate(tmp_path: Path) -> None:
    """A model that cannot be read fails before the gate but is reported after it, so serve
    has made the server that its fatal exit stops."""
    data = tmp_path / "data"
    data.mkdir()
    settings = Settings(data_dir=data, model=str(tmp_path / "no-such-model"), device="cpu")
    fatal: list[int] = []
    sup = WorkerSupervisor(settings, on_fatal=fatal.append, gated=True).start()
    try:
        proc = _started(sup)
        _waiting_for_go(proc.pid)  # still waiting, with the error in hand
        assert fatal == [] and list(data.iterdir()) == []
        sup.open_gate()
        assert proc.wait(60) == 3  # FATAL_EXIT: serve stops rather than restarting into it
        deadline = time.monotonic() + 10
        while not fatal:
            assert time.monotonic() < deadline, "the supervisor never reported the fatal exit"
            time.sleep(0.01)
        assert fatal == [3] and sup.restarts == 0
    finally:
        sup.stop()

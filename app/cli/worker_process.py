"""How ``layerbank serve`` runs its extraction worker: a child process, restarted
when it dies.

``serve`` starts ``python -P -m layerbank.app.cli.main worker --parent-pid <its pid>``
with its settings in the ``LAYERBANK_*`` environment, and ``WorkerSupervisor``
restarts it when it dies (1 s, doubling to 30 s between tries). Exit status
``FATAL_EXIT`` (3) means the model cannot be loaded: restarting would not
help, so ``serve`` stops with that message instead. Apart from both commands
(``serve`` and ``worker``) so that neither imports the other.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from layerbank.settings import Settings, settings_env

__all__ = ["FATAL_EXIT", "WorkerSupervisor"]

log = logging.getLogger("layerbank.serve")  # the supervisor runs in serve
FATAL_EXIT = 3  # the worker's status when the model cannot be loaded


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (AttributeError, OSError):
        pass  # not Linux: the worker's parent-pid check still ends it


class WorkerSupervisor:
    """Runs the worker process and restarts it when it dies."""

    def __init__(self, settings: Settings, *, on_fatal: Callable[[int], None],
                 on_restart: Callable[[int], None] = lambda n: None) -> None:
        self.settings = settings
        self.on_fatal = on_fatal
        self.on_restart = on_restart
        self.restarts = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="worker-supervisor", daemon=True)

    def start(self) -> WorkerSupervisor:
        self._thread.start()
        return self

    def _loop(self) -> None:
        # this thread forks the worker and must outlive it: PR_SET_PDEATHSIG
        # fires when the forking *thread* exits
        backoff = 1.0
        # -P: the working directory is not put first on sys.path, so a folder named
        # layerbank there (`--data-dir layerbank`, a clone's parent) cannot shadow the
        # installed package; PYTHONPATH still applies. multiprocessing's spawned
        # children inherit the flag (subprocess._args_from_interpreter_flags).
        cmd = [sys.executable, "-P", "-m", "layerbank.app.cli.main", "worker",
               "--parent-pid", str(os.getpid())]
        while not self._stopping.is_set():
            started = time.monotonic()
            self.proc = subprocess.Popen(cmd, env=settings_env(self.settings),
                                         preexec_fn=_die_with_parent)
            rc = self.proc.wait()
            if self._stopping.is_set():
                return
            if rc == FATAL_EXIT:
                self.on_fatal(rc)
                return
            if time.monotonic() - started > 60:
                backoff = 1.0
            self.restarts += 1
            log.error("the worker exited with status %s; restarting it in %.0f s", rc, backoff)
            self.on_restart(self.restarts)
            self._stopping.wait(backoff)
            backoff = min(backoff * 2, 30.0)

    def stop(self, timeout: float = 25.0) -> None:
        self._stopping.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._thread.join(timeout=5)


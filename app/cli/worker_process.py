"""How ``layerbank serve`` runs its extraction worker: a child process, restarted
when it dies.

``serve`` starts ``python -P -m layerbank.app.cli.main worker --parent-pid <its pid>``
with its settings in the ``LAYERBANK_*`` environment, and ``WorkerSupervisor``
restarts it when it dies (1 s, doubling to 30 s between tries). Exit status
``FATAL_EXIT`` (3) means the model cannot be loaded: restarting would not
help, so ``serve`` stops with that message instead. Apart from both commands
(``serve`` and ``worker``) so that neither imports the other.

Gated start (``gated=True``, what ``serve`` uses): the first worker is started
as soon as ``serve`` holds the data directory's lock, with ``--wait-for-go``.
It imports torch and transformers and reads the model's tokenizer and weights
(~3-4 s, the larger part of its start) while ``serve`` imports its own
modules, checks the catalog and removes a crash's leftovers, and it touches
the data directory (the stored engine and precision decisions, the ONNX
export, the catalog) only once ``open_gate()`` has written ``go`` to its
stdin, so nothing it writes can be taken for a leftover and it never opens a
catalog that is still being checked. A model that cannot be read is reported
after the gate too (exit ``FATAL_EXIT``), so ``serve`` has a server to stop. A
``serve`` that stops before the gate (a catalog that is no database) closes
the pipe: the worker reads end-of-file and exits 0, having written nothing.

A start that will likely run on the ONNX export an earlier start checked
(its check record is there: workers/quick_start.py) reads no weights before
the gate: after it, it verifies that record and the export and serves, the
weights read on first use (``/ready`` 3.3 s against 5.6 s for the embedded
model on the 2-core development machine, bench/serve_start.py). Any doubt
found after the gate is the usual load, there and then.
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
                 on_restart: Callable[[int], None] = lambda n: None, gated: bool = False) -> None:
        self.settings = settings
        self.gated = gated
        self._gate = threading.Event()  # set: the worker may open the data directory
        if not gated:
            self._gate.set()
        self.on_fatal = on_fatal
        self.on_restart = on_restart
        self.restarts = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="worker-supervisor", daemon=True)

    def start(self) -> WorkerSupervisor:
        self._thread.start()
        return self

    def open_gate(self) -> None:
        """The data directory is checked and cleaned: the worker may load its model and use it."""
        self._gate.set()

    def _let_go(self, proc: subprocess.Popen[bytes]) -> bool:
        """Wait for the gate, then tell the gated worker to go on; False when stopping first."""
        while not self._gate.wait(0.05):
            if self._stopping.is_set():
                return False
        if self._stopping.is_set():
            return False
        assert proc.stdin is not None
        try:
            proc.stdin.write(b"go\n")
            proc.stdin.close()
        except OSError:  # it died before reading (a broken pipe): its exit status is read next
            pass
        return True

    def _loop(self) -> None:
        # this thread forks the worker and must outlive it: PR_SET_PDEATHSIG
        # fires when the forking *thread* exits
        backoff = 1.0
        # -P: the working directory is not put first on sys.path, so a folder named
        # layerbank there (`--data-dir layerbank`, a clone's parent) cannot shadow the
        # installed package; PYTHONPATH still applies. multiprocessing's spawned
        # children inherit the flag (subprocess._args_from_interpreter_flags).
        cmd = [sys.executable, "-P", "-m", "layerbank.app.cli.main", "worker",
               "--parent-pid", str(os.getpid())] + (["--wait-for-go"] if self.gated else [])
        while not self._stopping.is_set():
            started = time.monotonic()
            self.proc = subprocess.Popen(cmd, env=settings_env(self.settings), preexec_fn=_die_with_parent,
                                         stdin=subprocess.PIPE if self.gated else None)
            if self.gated and not self._let_go(self.proc):
                return  # stopped before the data directory was ready: stop() ends the process
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
        ended = self._end(self.proc, timeout)
        self._thread.join(timeout=5)
        if self.proc is not ended:  # started while this stop began (the loop had passed its check)
            self._end(self.proc, timeout)

    @staticmethod
    def _end(proc: subprocess.Popen[bytes] | None, timeout: float) -> subprocess.Popen[bytes] | None:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc


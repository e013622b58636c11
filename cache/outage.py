"""Waiting out a catalog outage: recognise it, back off, log it once.

A PostgreSQL catalog that is down or restarting (``CatalogUnavailable``), or
a catalog whose disk is full (PostgreSQL's ``DiskFull``, SQLite's "database or
disk is full"), is not a bug of the process that meets it: the operator
restarts the server or frees space and the same statement then succeeds. A
long-running loop (the worker's) that let the error end the process would be
restarted by its supervisor straight into the same outage, logging a
traceback each time. ``OutageWait`` instead sleeps with backoff (0.5 s doubling
to 5 s), logs one WARNING when the outage starts and one INFO when it is over.

Example::

    wait = OutageWait(log)
    while not stopping.is_set():
        try:
            job = claimer.next()
        except Exception as e:
            if not catalog_outage(e):
                raise
            wait.wait(e, stopping)
            continue
        wait.over()
"""

from __future__ import annotations

import logging
import threading
import time

from .postgres import CatalogUnavailable
from .space import is_disk_full

__all__ = ["OutageWait", "catalog_outage"]


def catalog_outage(exc: BaseException) -> bool:
    """The catalog cannot be reached, or its disk is full: wait, do not crash."""
    return isinstance(exc, CatalogUnavailable) or is_disk_full(exc)


class OutageWait:
    """Backoff and one log line per outage (see the module docstring)."""

    def __init__(self, log: logging.Logger, first_s: float = 0.5, max_s: float = 5.0) -> None:
        self.log, self.first_s, self.max_s = log, first_s, max_s
        self.since: float | None = None  # monotonic time the outage began; None: no outage
        self._delay = first_s
        self.waits = 0

    def begin(self, exc: BaseException) -> float:
        """Note a failed try (logged at the first of an outage); the seconds to wait before the next."""
        if self.since is None:
            self.since = time.monotonic()
            what = "its disk is full" if is_disk_full(exc) else "it cannot be reached"
            self.log.warning("the catalog is unavailable (%s: %s); waiting for it, retrying every "
                             "%.1f-%.0f s", what, exc, self.first_s, self.max_s)
        self.waits += 1
        delay, self._delay = self._delay, min(self._delay * 2, self.max_s)
        return delay

    def wait(self, exc: BaseException, stopping: threading.Event | None = None) -> None:
        """``begin``, then sleep (returns early once ``stopping`` is set)."""
        delay = self.begin(exc)
        if stopping is not None:
            stopping.wait(delay)
        else:
            time.sleep(delay)

    def over(self) -> None:
        """The catalog answered: log the end of an outage, reset the backoff."""
        if self.since is not None:
            self.log.info("the catalog answers again after %.1f s", time.monotonic() - self.since)
            self.since = None
        self._delay = self.first_s

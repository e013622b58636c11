"""A writer thread for extraction: part ``k`` is written and committed while part ``k + 1``
is tokenized and encoded, so a slow disk costs max(forward, write) per part, not their sum.

Why a thread, and why one: the forward pass (torch) and the shard write (HDF5, fsync,
rename, catalog commit) both spend their time outside the interpreter's lock, so two
threads overlap them; one writer keeps the commits in the order of the parts.

The hand-over is a rendezvous (``submit`` returns once the writer has *taken* the part):
at most two parts are in memory, the one being written and the one being encoded, so a
token job's bound (``TOKEN_PART_BYTES`` a part) doubles, never grows with the job.

Failure semantics, which ``extract`` relies on:

- the writer fails on part ``k``: nothing of part ``k`` is committed (the shard write is
  atomic: temp file, fsync, rename, then the catalog commit), nothing after it is
  written, and the error is raised in the encoding thread at its next ``submit`` or at
  ``close``; parts before ``k`` stay committed. Parts are keyed by (job, part), so a
  re-run skips them and writes the rest under the same names.
- the encoding thread fails (an encoder error, ``Stopped``, a KeyboardInterrupt): the
  part already handed over is finished (committed, as it was before there was a thread),
  then the encoding thread's error propagates.

Example::

    with PartWriter(lambda item: store.write(*item)) as writer:
        for part in parts:
            writer.submit((part.name, encode(part)))
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

__all__ = ["PartWriter"]

log = logging.getLogger("layerbank.extract")

_POLL_S = 0.05  # how often a waiting submit looks whether the writer has failed
_DONE = object()


class PartWriter:
    """Runs ``write(item)`` for each submitted item, in order, on one thread."""

    def __init__(self, write: Callable[[Any], None], *, name: str = "layerbank-part-writer") -> None:
        self._write = write
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=1)
        self._taken = threading.Semaphore(0)  # released each time the writer takes an item
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            self._taken.release()
            if item is _DONE:
                return
            if self.error is not None:
                continue  # failed already: nothing after the failed part is written
            try:
                self._write(item)
            except BaseException as e:  # noqa: BLE001  (handed to the encoding thread)
                self.error = e

    def check(self) -> None:
        """Raise the writer's error, if it has failed."""
        if self.error is not None:
            raise self.error

    def submit(self, item: Any) -> None:
        """Hand ``item`` over; returns once the writer has taken it (it is then being
        written), raises the writer's error if it has failed."""
        self.check()
        self._queue.put(item)  # never blocks long: the queue is empty between rendezvous
        while not self._taken.acquire(timeout=_POLL_S):
            self.check()
        self.check()

    def close(self) -> None:
        """Wait for the item being written; raise the writer's error, if any."""
        self._queue.put(_DONE)
        self._thread.join()
        self.check()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None:
            self.close()
            return
        # the encoding thread failed: finish what was handed over, then let its error through
        self._queue.put(_DONE)
        self._thread.join()
        if self.error is not None and self.error is not exc:
            log.error("the shard writer failed too: %s: %s", type(self.error).__name__, self.error)

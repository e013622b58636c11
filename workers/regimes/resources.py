"""Memory a training run uses, and giving it back when a job is cancelled.

``PeakMemory`` measures a block: on CUDA, ``torch.cuda.max_memory_allocated``
after a reset; on CPU, the peak resident set size (psutil, sampled every
10 ms by a thread) minus the RSS at the start, after returning freed heap to
the OS (``malloc_trim``) so memory freed by earlier runs is not silently
reused. The CPU figure is an estimate: sampling can miss short spikes.

``freeing_on_cancel`` runs a function and, when it raises ``Cancelled``,
clears the frames of the traceback (which would otherwise keep the model,
optimizer and activations alive), collects, empties the CUDA cache, and
re-raises a fresh ``Cancelled`` that references none of them.

Example::

    >>> with PeakMemory("cpu") as memory:
    ...     train()
    >>> memory.peak_bytes, memory.kind
"""

from __future__ import annotations

import ctypes
import gc
import threading
import traceback
from collections.abc import Callable
from typing import Any, Self, TypeVar

import psutil
import torch

__all__ = ["Cancelled", "PeakMemory", "check_cancel", "free_memory", "freeing_on_cancel"]

T = TypeVar("T")


class Cancelled(Exception):
    """The job was cancelled; its training model has already been freed."""


def check_cancel(should_cancel: Callable[[], bool] | None) -> None:
    if should_cancel is not None and should_cancel():
        raise Cancelled("regimes job cancelled")


def _trim_heap() -> None:
    """Hand freed heap back to the OS, so an RSS baseline is not inflated by it."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def free_memory(device: str) -> None:
    """Collect cycles and return cached memory (CUDA cache, or freed heap)."""
    gc.collect()
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.empty_cache()
    else:
        _trim_heap()


class PeakMemory:
    """Peak memory of a block: CUDA max allocated, or sampled CPU RSS growth."""

    def __init__(self, device: str) -> None:
        self.cuda = device.startswith("cuda")
        self.kind = "cuda_max_memory_allocated" if self.cuda else "cpu_rss_delta_sampled"
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._proc = psutil.Process()
        self._base = self._peak_rss = 0

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self._peak_rss = max(self._peak_rss, self._proc.memory_info().rss)

    def __enter__(self) -> Self:
        # No gc.collect here: a finished run's model is freed by reference
        # counting, and a full collection costs ~0.5 s with transformers loaded.
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            _trim_heap()
            self._base = self._peak_rss = self._proc.memory_info().rss
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            self.peak_bytes = int(torch.cuda.max_memory_allocated())
        else:
            self._stop.set()
            self._thread.join()
            self._peak_rss = max(self._peak_rss, self._proc.memory_info().rss)
            self.peak_bytes = int(self._peak_rss - self._base)


def freeing_on_cancel(device: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn``; on ``Cancelled`` drop every frame's locals, free memory, re-raise."""
    try:
        return fn(*args, **kwargs)
    except Cancelled as exc:
        traceback.clear_frames(exc.__traceback__)
        message = str(exc)
    free_memory(device)
    raise Cancelled(message)

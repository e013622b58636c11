"""Where shards live: one small interface, backends registered by name (lhotse's pattern).

Everything that touches shard files goes through a ``ShardStorage``: the
store's reads and writes, compaction, repair, the crash clean-ups and the
Ray actors. The catalog stays out of it: a storage publishes and lists
files, ``FeatureStore`` commits them (cache/store.py).

    open(name)                    -> ShardReader (read-only, lazy; range reads by row)
    write(name, contents, dtype)  -> bytes; atomic: the name appears only complete
    list(temp=False)              -> [StoredShard] (with temp=True, unfinished writes too)
    delete(name) / quarantine(name) -> whether there was a file
    free_bytes()                  -> room left (None: cannot be told)

A storage is picklable: a Ray actor gets the driver's and writes where it
reads (its module is imported there, which registers it).

``local`` (cache/storage_local.py, the default, registered here) is a
directory: ``<data dir>/shards`` and ``<data dir>/quarantine``. Another
backend is one module whose class is decorated ``@register_storage(name)``
(and one line below, for a built-in one); docs/decisions.md says what an
object store would have to provide.

Example::

    storage = open_storage("local", root="data")
    n_bytes = storage.write("job-00000.h5", contents, "float16")
    storage.open("job-00000.h5").read_keys()
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

from .shard import ShardContents, ShardReader, StoredShard
from .storage_local import LocalShardStorage

__all__ = ["DEFAULT_STORAGE", "ShardStorage", "StoredShard", "open_storage", "register_storage",
           "storage_names"]

DEFAULT_STORAGE = "local"


@runtime_checkable
class ShardStorage(Protocol):
    """Where shard files are kept. Names are plain file names (no ``/``)."""

    name: str  # the name it is registered under

    def open(self, shard: str) -> ShardReader:
        """A reader of ``shard``; nothing is read until its first read."""

    def write(self, shard: str, contents: ShardContents, dtype: str, *, private_temp: bool = False) -> int:
        """Write ``shard`` atomically (it appears complete or not at all, durably); the bytes stored.

        ``private_temp``: another writer of the same name may still be running (a Ray part's
        first attempt that outlived its retry): each write gets a temp name of its own, so
        the two never interleave bytes; the last to publish wins whole."""

    def list(self, *, temp: bool = False) -> list[StoredShard]:
        """The shards held (in no order); with ``temp``, the unfinished writes' temp files too."""

    def delete(self, shard: str, *, written_before: float | None = None) -> bool:
        """Remove ``shard`` (or a temp file listed with ``temp``); False if it was not there.

        ``written_before`` (seconds since the epoch): only if last written before then, asked
        as it is removed (a crash's leftover, not a file a live writer has just rewritten)."""

    def quarantine(self, shard: str) -> bool:
        """Move a damaged ``shard`` aside, kept for inspection; False if it was not there."""

    def free_bytes(self) -> int | None:
        """Room left on what holds the data directory; None when it cannot be told (the
        writes then say)."""


_S = TypeVar("_S")
_BACKENDS: dict[str, Callable[..., ShardStorage]] = {"local": LocalShardStorage}


def register_storage(name: str) -> Callable[[_S], _S]:
    """Class decorator: make a storage backend available as ``open_storage(name, ...)``."""

    def add(cls: _S) -> _S:
        if name in _BACKENDS:
            raise ValueError(f"a shard storage named {name!r} is registered already")
        _BACKENDS[name] = cls  # type: ignore[assignment]  # a class whose instances are ShardStorage
        return cls

    return add


def storage_names() -> tuple[str, ...]:
    """The backends registered so far (another module's registers it when imported)."""
    return tuple(sorted(_BACKENDS))


def open_storage(name: str = DEFAULT_STORAGE, *, root: str | os.PathLike[str], **options: Any) -> ShardStorage:
    """The storage registered as ``name``, for the data directory ``root``."""
    try:
        backend = _BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown shard storage {name!r}; known: {', '.join(sorted(_BACKENDS))}") from None
    return backend(root, **options)

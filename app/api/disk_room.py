"""Work refused up front when the data directory's disk is full (507), before
anything is registered or queued: a job that can only fail should not be
accepted.

Probe and head jobs and dataset uploads ask for at least ``MIN_FREE_BYTES``.
A head writes files; a dataset's extraction writes shards; a probe's rows go
to the catalog, whose room at 0 bytes free (SQLite's WAL) is shared with
every heartbeat: a race, not something to promise. On a PostgreSQL catalog a
dataset's rows would be accepted while its shards could not be written.

Example::

    require_free_disk(settings.data_dir, "probe and head jobs", "nothing was queued")
"""

from __future__ import annotations

import os

from layerbank.app.api.errors import InsufficientStorage
from layerbank.cache.storage import DEFAULT_STORAGE, open_storage

__all__ = ["MIN_FREE_BYTES", "require_free_disk"]

MIN_FREE_BYTES = 1 << 20


def require_free_disk(data_dir: str | os.PathLike[str], what: str, nothing_done: str) -> None:
    """InsufficientStorage (507) when ``data_dir``'s disk has under 1 MiB free.

    ``what`` names the work ("probe and head jobs"), ``nothing_done`` what did not
    happen ("nothing was queued"); a disk whose room cannot be read passes (the
    writes themselves then report a full disk as 507). The room is the shard
    storage's answer (cache/storage.py; the local one: the data directory's disk).
    """
    free = open_storage(DEFAULT_STORAGE, root=data_dir, create=False).free_bytes()
    if free is None:
        return
    if free < MIN_FREE_BYTES:
        raise InsufficientStorage(f"the disk holding the data directory is full ({free:,} bytes free; {what} "
                                  f"need at least 1 MiB); {nothing_done}; free some space and send the "
                                  "request again")

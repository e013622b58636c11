"""How many shard files one store keeps open for reading, and why that many.

Its own module so ``layerbank.settings`` can take the default without importing the
store (numpy, h5py): the setting ``reader_memory_mb`` feeds ``open_reader_budget``.
"""

from __future__ import annotations

import resource

__all__ = ["READER_MEMORY_MB", "open_reader_budget"]

# Read handles kept open per process. Reopening a shard costs a read ~0.26 ms more (its
# superblock, object headers and first chunk again: 0.64 against 0.38 ms p50 per one-row
# read over 490 shards, 32 handles against all), so a store of many shards read at random
# wants them all open; but an open HDF5 file costs ~0.6 MB of memory whatever its size
# (measured: 490 open shards, +288 MB RSS) and one file descriptor. The budget is the
# smaller of READER_MEMORY_MB's worth and half the descriptors the process may hold
# (RLIMIT_NOFILE; the other half for sockets, the catalog, logs), least recently used closed first.
# 32 MB (53 handles, was 32): tests/reliability/test_load.py's 20 s of misses (each a new
# shard, each kept open) grew the API 29% with 256 MB and 12-13% with 64 MB, past its 10%;
# 5.8% with 32 MB. A server reading at random over more shards wants more: the setting
# reader_memory_mb (LAYERBANK_READER_MEMORY_MB), or FeatureStore(max_open_readers=).
READER_MEMORY_MB = 32
_MB_PER_READER = 0.6
_MIN_OPEN = 8


def open_reader_budget(memory_mb: float = READER_MEMORY_MB, nofile: int | None = None) -> int:
    """How many shard readers one store keeps open: ``memory_mb`` at ~0.6 MB each, at most
    half of ``nofile`` (default: this process's soft RLIMIT_NOFILE), never under 8."""
    if nofile is None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        nofile = soft if soft != resource.RLIM_INFINITY else 1 << 20
    return max(_MIN_OPEN, min(int(memory_mb / _MB_PER_READER), nofile // 2))

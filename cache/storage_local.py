"""The default shard storage: a local (or shared POSIX) directory.

    <data dir>/shards/*.h5         published, write-once shards
    <data dir>/shards/*.h5.tmp     a write under way (or a crash's leftover)
    <data dir>/quarantine/*.h5     shards whose checksum failed, kept for inspection

Publishing is the file system's: the shard is written under a temp name,
fsynced, ``os.replace``d onto its name (atomic on POSIX) and the directory
fsynced (cache/shard.py ``write_shard``). Ray actors on other nodes write
here too, so on a cluster the directory is a shared file system.

Example::

    storage = LocalShardStorage("data")
    storage.write("job-00000.h5", contents, "float16")
    [s.name for s in storage.list()]        # ['job-00000.h5']
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from .shard import ShardContents, ShardReader, StoredShard, fsync_dir, write_shard

__all__ = ["LocalShardStorage"]


class LocalShardStorage:
    """Shards as files in ``root/shards``; damaged ones moved to ``root/quarantine``.
    Registered as ``local`` (cache/storage.py).

    ``create``: make both directories now (a store does); False only looks
    (the free-space check of a directory that may not exist yet).
    """

    name = "local"

    def __init__(self, root: str | os.PathLike[str], *, create: bool = True) -> None:
        self.root = Path(root)
        self.shard_dir = self.root / "shards"
        self.quarantine_dir = self.root / "quarantine"
        if create:
            for d in (self.shard_dir, self.quarantine_dir):
                d.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"LocalShardStorage({str(self.root)!r})"

    def exists(self) -> bool:
        """Whether a store was opened here (its shard directory is there)."""
        return self.shard_dir.is_dir()

    def path(self, shard: str) -> Path:
        """Where ``shard`` lives (this backend only: others have no path)."""
        if not shard or "/" in shard or shard.startswith("."):
            raise ValueError(f"bad shard name {shard!r}")
        return self.shard_dir / shard

    def open(self, shard: str) -> ShardReader:
        return ShardReader(self.path(shard))

    def write(self, shard: str, contents: ShardContents, dtype: str, *, private_temp: bool = False) -> int:
        final = self.path(shard)
        if not private_temp:
            return write_shard(final, contents, dtype)
        # a name no other attempt uses, renamed onto the shard's once complete
        attempt = final.with_name(f"{final.name.removesuffix('.h5')}.{uuid.uuid4().hex[:12]}.h5")
        n_bytes = write_shard(attempt, contents, dtype)
        os.replace(attempt, final)
        fsync_dir(self.shard_dir)  # the name is durable before anyone commits it
        return n_bytes

    def list(self, *, temp: bool = False) -> list[StoredShard]:
        out: list[StoredShard] = []
        if not self.shard_dir.is_dir():  # no store opened here yet
            return out
        for p in self.shard_dir.iterdir():
            is_temp = p.name.endswith(".tmp")
            if not (p.suffix == ".h5" or (temp and is_temp)):
                continue
            try:
                st = p.stat()
            except FileNotFoundError:  # removed since the listing (published, or cleaned)
                continue
            out.append(StoredShard(p.name, st.st_size, st.st_mtime, is_temp))
        return out

    def delete(self, shard: str, *, written_before: float | None = None) -> bool:
        """Remove ``shard``; with ``written_before``, only if last written before that time
        (a crash's leftover, not a file a live writer has just rewritten)."""
        p = self.path(shard)
        try:
            if written_before is not None and p.stat().st_mtime >= written_before:
                return False
            p.unlink()
        except FileNotFoundError:
            return False
        return True

    def quarantine(self, shard: str) -> bool:
        src = self.path(shard)
        if not src.exists():
            return False
        self.quarantine_dir.mkdir(parents=True, exist_ok=True)
        shutil.move(str(src), str(self.quarantine_dir / shard))
        return True

    def free_bytes(self) -> int | None:
        # the disk holding the data directory, as the API's 507 check always asked: its
        # shards, catalog and heads share it unless shards/ is mounted apart
        try:
            return shutil.disk_usage(self.root).free
        except OSError:
            return None

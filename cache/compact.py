"""Compaction: merge many small shards into one, without changing what
readers see.

Micro-batched feature requests each write a small shard; thousands of them
cost file handles and catalog rows. Compaction reads the live rows of small
pooled-only shards (checksums verified on the way), writes them as one new
write-once shard, repoints their keys and forgets the old shards in a single
catalog transaction, and only then deletes the old files. A reader that
looked a key up just before the commit and opens a deleted file gets its
rows from the new shard (FeatureStore.read_pooled looks the keys up again).

Shards with token-level states are left alone: they are large already.
Only shards holding the same poolings are merged together (a data directory
whose poolings setting changed holds both kinds; docs/decisions.md).

Example::

    summary = compact(store, max_rows=256)
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import int8
from .keys import ExtractionConfig
from .shard import CorruptShardError, ShardContents
from .store import FeatureStore

__all__ = ["compact", "CompactSummary"]


@dataclass
class CompactSummary:
    shards_merged: int = 0
    shards_written: int = 0
    rows: int = 0
    quarantined: int = 0


def compact(store: FeatureStore, *, max_rows: int = 256, target_rows: int = 4096) -> CompactSummary:
    """Merge committed shards under ``max_rows`` rows into shards of up to ``target_rows``.

    Call from the one writer process (the worker, or a CLI holding the data
    directory lock): compaction is a write.
    """
    summary = CompactSummary()
    groups: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
    for s in store.catalog.small_shards(max_rows):
        groups.setdefault((s["model"], s["config"], s["poolings"]), []).append(s["name"])
    for (model, config, poolings), names in groups.items():
        batch: list[str] = []
        rows = 0
        for name in names + [""]:  # "" flushes the last batch
            if name:
                batch.append(name)
                rows += store.catalog.shard_info(name)["n_rows"]  # type: ignore[index]  # a name the catalog listed
            if batch and (not name or rows >= target_rows):
                if len(batch) > 1:
                    _merge(store, batch, model, config, poolings, summary)
                batch, rows = [], 0
    return summary


def _merge(store: FeatureStore, names: list[str], model: str, config: str, poolings: tuple[str, ...],
           summary: CompactSummary) -> None:
    keys: list[str] = []
    n_tokens: list[int] = []
    truncated: list[bool] = []
    pooled: dict[str, list[Any]] = {p: [] for p in poolings}
    merged: list[str] = []
    for name in names:
        live = store.catalog.live_rows(name)
        if not live:
            merged.append(name)
            continue
        reader = store.storage.open(name)  # a handle of its own: closed once its rows are copied
        try:
            rows = np.array([r for _, r, _, _ in live], dtype=np.int64)
            if reader.read_keys(rows) != [k for k, _, _, _ in live]:
                raise CorruptShardError(reader.path, "rows do not hold the keys the catalog lists")
            # keep the stored dtype: compaction must not change a single bit (int8: with its scales)
            blocks = {p: reader.read_pooled_stored(rows, p) for p in poolings}
        except CorruptShardError as e:
            store.quarantine(name, str(e))
            summary.quarantined += 1
            continue
        finally:
            reader.close()
        for p in poolings:
            pooled[p].append(blocks[p])
        keys += [k for k, _, _, _ in live]
        n_tokens += [n for _, _, n, _ in live]
        truncated += [t for _, _, _, t in live]
        merged.append(name)
    if not keys:
        return
    cfg = ExtractionConfig.from_json(config)
    contents = ShardContents(keys, np.asarray(n_tokens), np.asarray(truncated),
                             {p: int8.concat(v) if isinstance(v[0], int8.Int8Rows) else np.concatenate(v)
                              for p, v in pooled.items()})
    new_name = f"compact-{uuid.uuid4().hex[:12]}-00000"
    store.write(new_name, contents, model=model, config=cfg, replaces=merged)
    store.discard(merged)
    summary.shards_merged += len(merged)
    summary.shards_written += 1
    summary.rows += len(keys)

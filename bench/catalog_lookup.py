"""What recording poolings costs a catalog lookup (issue 13, part 3a).

Since shards record their poolings, ``Catalog.lookup(keys, poolings=...)``
joins ``entries`` with ``shards`` to leave out rows whose shard lacks a
pooling. This times it against the entries-only query the lookup used
before (same rows, same ``Entry`` objects built), on a catalog of 200,000
keys in 100 shards, looking up 20,000 random keys; best of ``--rounds``.

Run from the repository root::

    .venv/bin/python bench/catalog_lookup.py            # ~20 s
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable

import numpy as np

from layerbank.cache.catalog import Catalog, Entry


def _entries_only(cat: Catalog, keys: list[str]) -> dict[str, Entry]:
    """The lookup as it was before shards recorded their poolings."""
    out: dict[str, Entry] = {}
    db = cat.conn()
    for i in range(0, len(keys), 900):
        chunk = keys[i : i + 900]
        q = ("SELECT key, shard, row, n_tokens, truncated, has_tokens FROM entries "
             f"WHERE key IN ({','.join('?' * len(chunk))})")
        for k, s, r, n, t, h in db.execute(q, chunk):
            out[k] = Entry(k, s, r, n, bool(t), bool(h))
    return out


def _best(fn: Callable[[], dict[str, Entry]], rounds: int) -> tuple[float, int]:
    best, n = float("inf"), 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        n = len(fn())
        best = min(best, time.perf_counter() - t0)
    return best, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cat = Catalog(os.path.join(d, "catalog.sqlite"))
        keys = [f"{i:064x}" for i in range(200_000)]
        for s in range(100):
            part = keys[s * 2000 : (s + 1) * 2000]
            cat.commit_shard(f"s{s:03d}.h5", "local:m", "{}", part, [5] * len(part), [False] * len(part),
                             has_tokens=False, n_bytes=1, poolings=["mean", "cls", "max"])
        want = [keys[i] for i in np.random.default_rng(0).choice(len(keys), 20_000, replace=False)]
        before, n0 = _best(lambda: _entries_only(cat, want), args.rounds)
        after, n1 = _best(lambda: cat.lookup(want, poolings=("mean",)), args.rounds)
        assert n0 == n1 == len(want)
        print(f"lookup of {len(want):,} keys: entries only {before * 1000:.0f} ms, "
              f"with the shards' poolings {after * 1000:.0f} ms: {after / before:.2f}x")
        cat.close()


if __name__ == "__main__":
    main()

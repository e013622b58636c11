"""Throughput of the Ray backend against the embedded one, same texts, same machine.

Both backends extract the same N texts (AG News dev, seeded sample) with the
bundled all-MiniLM-L6-v2 into fresh stores, so nothing is a cache hit. The
embedded backend runs one encoder with all the machine's threads; Ray runs a
local cluster with ``--actors`` CPU encoder actors of ``cores / actors``
threads each (the same cores, split). What is reported:

- ``ray_start_s``: ``ray.init`` of a local cluster (paid once per server);
- per run: wall seconds, texts/s, tokens/s, and for Ray the overhead over
  embedded (``ray_s / embedded_s - 1``), which includes starting the actor
  processes and loading the model in each (paid once per job);
- whether the two stores hold the same rows (max |difference| of the stored
  ``mean`` vectors, float16 storage).

Run::

    .venv/bin/python bench/ray_vs_embedded.py --texts 2000 --actors 2

Prints a table and writes bench/out/ray_vs_embedded.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cache.store import FeatureStore  # noqa: E402
from workers.backends import make_backend  # noqa: E402
from workers.encoder import Encoder, set_threads  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "agnews" / "dev.tsv"


def agnews(n: int, seed: int) -> list[str]:
    with open(DATA, encoding="utf-8") as f:
        texts = sorted({line.split("\t")[0] for line in f if line.strip()})
    random.Random(seed).shuffle(texts)
    return texts[:n]


def run(kind: str, texts: list[str], store: FeatureStore, encoder: Encoder, **kw: Any) -> dict:
    backend = make_backend(kind, store, encoder, **kw)
    t0 = time.perf_counter()
    s = backend.run(texts, f"bench-{kind}")
    wall = time.perf_counter() - t0
    backend.close()
    assert s.texts_encoded == len(set(texts)), s
    return {"backend": kind, "seconds": round(wall, 2), "texts": s.texts_encoded,
            "tokens": s.tokens_encoded, "shards": s.shards_written,
            "texts_per_s": round(s.texts_encoded / wall, 1),
            "tokens_per_s": round(s.tokens_encoded / wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts", type=int, default=2000)
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--part-size", type=int, default=250, help="texts per shard (Ray: per task)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="cores to use: all for embedded, split across Ray actors")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import numpy as np
    import ray

    texts = agnews(args.texts, args.seed)
    set_threads(args.threads)
    encoder = Encoder.load(None, device="cpu")
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    common = {"part_size": args.part_size, "max_tokens": 16384}
    results: dict[str, Any] = {"texts": len(texts), "cores": os.cpu_count(),
                               "load_avg_at_start": os.getloadavg()[0], "model": encoder.info["name"],
                               "part_size": args.part_size, "actors": args.actors}

    emb_store = FeatureStore(tmp / "embedded")
    results["embedded"] = run("embedded", texts, emb_store, encoder, **common)

    t0 = time.perf_counter()
    ray.init(num_cpus=args.threads, num_gpus=0, include_dashboard=False, log_to_driver=False,
             object_store_memory=200 * 1024**2)
    results["ray_start_s"] = round(time.perf_counter() - t0, 2)
    per_actor = max(1, args.threads // args.actors)
    ray_store = FeatureStore(tmp / "ray")
    results["ray"] = run("ray", texts, ray_store, encoder, ray_actors=args.actors,
                         threads=per_actor, **common)
    results["ray"]["threads_per_actor"] = per_actor
    ray.shutdown()
    results["ray_overhead"] = round(results["ray"]["seconds"] / results["embedded"]["seconds"] - 1, 3)
    results["ray_overhead_incl_start"] = round(
        (results["ray"]["seconds"] + results["ray_start_s"]) / results["embedded"]["seconds"] - 1, 3)

    keys = sorted({emb_store.key(encoder.fingerprint, encoder.config, t) for t in texts})
    a, b = emb_store.read_pooled(keys, "mean"), ray_store.read_pooled(keys, "mean")
    results["same_rows"] = bool(a.found.all() and b.found.all())
    results["max_abs_diff_mean"] = float(np.abs(a.data - b.data).max())

    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "ray_vs_embedded.json").write_text(json.dumps(results, indent=2))
    print(f"{len(texts)} AG News texts, bundled MiniLM-L6 on CPU, {args.threads} cores "
          f"(load avg {results['load_avg_at_start']:.1f} at start)")
    print(f"{'backend':<10}{'seconds':>9}{'texts/s':>10}{'tokens/s':>11}{'shards':>8}")
    for k in ("embedded", "ray"):
        r = results[k]
        print(f"{k:<10}{r['seconds']:>9.2f}{r['texts_per_s']:>10.1f}{r['tokens_per_s']:>11.1f}"
              f"{r['shards']:>8}")
    print(f"ray.init (local, once per server): {results['ray_start_s']:.2f} s")
    print(f"Ray overhead per job: {results['ray_overhead']:+.1%} "
          f"({results['ray_overhead_incl_start']:+.1%} counting ray.init)")
    print(f"same rows stored: {results['same_rows']}, max |mean diff| {results['max_abs_diff_mean']:.2e}")


if __name__ == "__main__":
    main()

"""Throughput of the Ray backend against the embedded one, and how a warm pool starts jobs.

Both backends extract the same N texts (AG News dev, seeded sample) with the
bundled all-MiniLM-L6-v2 into fresh stores, so nothing is a cache hit. The
embedded backend runs one encoder with ``--threads`` threads. Ray runs on a
local cluster once per entry of ``--actors`` (e.g. ``1,2,4,8``): a warm pool
of that many actors, ``--threads-per-actor`` torch threads each, started
first and then given the big job and a small one. What is reported:

- ``ray_start_s``: ``ray.init`` of a local cluster (paid once per server);
- ``cold_job``: a 20-text job on a backend whose actors start with the job
  (what every job paid before the pool stayed warm): wall seconds and the
  seconds from the job's start to its first encoded batch;
- per pool: ``pool_start_s`` (actor processes started and the model loaded
  in each: paid once per server), the big job's wall seconds, texts/s,
  tokens/s, the change against embedded (``ray_s / embedded_s - 1``,
  embedded_s being the mean of one run before and one after the Ray runs,
  as load drifts on a shared machine), the scaling efficiency against one
  actor (``rate_N / (N * rate_1)``), and ``warm_job``: a second, 20-text job
  on the same warm pool, its wall seconds and its first-batch seconds;
- whether the stores hold the same rows as embedded (max |difference| of the
  stored ``mean`` vectors, float16 storage).

Run::

    .venv/bin/python bench/ray_vs_embedded.py --texts 500 --actors 1,2 --threads 1
    # a 16-core machine:  --texts 4000 --actors 1,2,4,8 --threads 16

``--threads 1`` on a machine shared with other work: two torch threads in
one process slow down badly when the cores are oversubscribed, which would
flatter Ray's split actors. For the same reason the benchmark re-runs itself
in a new session: Linux autogroup scheduling shares the CPU per session,
and Ray's daemons (which start the actors) have a session of their own, so
an embedded run left in a busy shell's session would get a smaller share.

Prints a table and writes bench/out/ray_vs_embedded.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import SHARED, require_data  # the full data sets: ../shared/data, checked when opened

from layerbank.cache.store import FeatureStore
from layerbank.workers.backends import make_backend
from layerbank.workers.encoder import Encoder, set_threads

DATA = SHARED / "agnews" / "dev.tsv"


def agnews(n: int, seed: int) -> list[str]:
    with open(require_data(DATA), encoding="utf-8") as f:
        texts = sorted({line.split("\t")[0] for line in f if line.strip()})
    random.Random(seed).shuffle(texts)
    return texts[:n]


def run(kind: str, texts: list[str], store: FeatureStore, encoder: Encoder, *,
        backend: Any = None, **kw: Any) -> dict:
    backend = backend or make_backend(kind, store, encoder, **kw)
    t0 = time.perf_counter()
    s = backend.run(texts, f"bench-{kind}-{len(texts)}")
    wall = time.perf_counter() - t0
    assert s.texts_encoded == len(set(texts)), s
    out = {"backend": kind, "seconds": round(wall, 2), "texts": s.texts_encoded,
           "tokens": s.tokens_encoded, "shards": s.shards_written,
           "texts_per_s": round(s.texts_encoded / wall, 1),
           "tokens_per_s": round(s.tokens_encoded / wall, 1)}
    if kind == "ray":
        out["first_batch_s"] = round(backend.last_first_batch_s, 2)
    if kw:  # a backend made here is closed here; a pool handed in stays warm for the caller
        backend.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts", type=int, default=2000)
    ap.add_argument("--actors", default="1,2", help="pool sizes to run, comma-separated")
    ap.add_argument("--part-size", type=int, default=250, help="texts per shard (Ray: per task)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="torch threads of the embedded backend")
    ap.add_argument("--threads-per-actor", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--same-session", action="store_true",
                    help="do not re-run in a new session (see the module docstring)")
    args = ap.parse_args()
    if not args.same_session and os.getsid(0) != os.getpid():
        sys.exit(subprocess.call([sys.executable, *sys.argv, "--same-session"],
                                 start_new_session=True))
    sizes = [int(a) for a in args.actors.split(",")]

    import numpy as np
    import ray

    pool_texts = agnews(args.texts + 20 * (len(sizes) + 1), args.seed)
    texts = pool_texts[:args.texts]
    smalls = [pool_texts[args.texts + 20 * i: args.texts + 20 * (i + 1)] for i in range(len(sizes) + 1)]
    set_threads(args.threads)
    encoder = Encoder.load(None, device="cpu")
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    common = {"part_size": args.part_size, "max_tokens": 16384}
    results: dict[str, Any] = {"texts": len(texts), "cores": os.cpu_count(),
                               "load_avg_at_start": os.getloadavg()[0], "model": encoder.info["name"],
                               "part_size": args.part_size, "actors": sizes,
                               "threads_per_actor": args.threads_per_actor}

    emb_store = FeatureStore(tmp / "embedded")
    results["embedded"] = run("embedded", texts, emb_store, encoder, **common)

    t0 = time.perf_counter()
    # one logical CPU per actor at least: a CPU actor reserves num_cpus=1
    ray.init(num_cpus=max(os.cpu_count() or 1, max(sizes)), num_gpus=0, include_dashboard=False,
             log_to_driver=False, object_store_memory=200 * 1024**2)
    results["ray_start_s"] = round(time.perf_counter() - t0, 2)
    # the fixed cost of a job whose actors start with it: 20 texts are ~0.1 s of encoding
    results["cold_job"] = run("ray", smalls[0], FeatureStore(tmp / "cold"), encoder, ray_actors=1,
                              threads=args.threads_per_actor)
    keys = sorted({emb_store.key(encoder.fingerprint, encoder.config, t) for t in texts})
    ref = emb_store.read_pooled(keys, "mean")
    runs = ["embedded"]
    for i, actors in enumerate(sizes, start=1):
        name = f"ray-{actors}"
        store = FeatureStore(tmp / name)
        backend = make_backend("ray", store, encoder, ray_actors=actors,
                               threads=args.threads_per_actor, **common)
        t0 = time.perf_counter()
        backend.actor_pids()  # the pool is warm: every actor has loaded the model
        pool_start = time.perf_counter() - t0
        r = results[name] = run("ray", texts, store, encoder, backend=backend)
        r["pool_start_s"] = round(pool_start, 2)
        r["warm_job"] = run("ray", smalls[i], store, encoder, backend=backend)
        backend.close()
        got = store.read_pooled(keys, "mean")
        r["same_rows"] = bool(ref.found.all() and got.found.all())
        r["max_abs_diff_mean"] = float(np.abs(ref.data - got.data).max())
        runs.append(name)
    ray.shutdown()
    # embedded once more, after Ray: on a shared machine the load drifts during a run, so the
    # baseline is the mean of a run before and a run after the Ray runs
    results["embedded_after"] = run("embedded", texts, FeatureStore(tmp / "embedded-after"), encoder,
                                    **common)
    base = (results["embedded"]["seconds"] + results["embedded_after"]["seconds"]) / 2
    results["embedded_mean_s"] = round(base, 2)
    one = results.get("ray-1")
    for name in runs[1:]:
        r = results[name]
        r["vs_embedded"] = round(r["seconds"] / base - 1, 3)
        n = int(name[4:])
        r["efficiency_vs_1"] = (round(r["texts_per_s"] / (n * one["texts_per_s"]), 2)
                                if one else None)
    runs.append("embedded_after")

    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "ray_vs_embedded.json").write_text(json.dumps(results, indent=2))
    print(f"{len(texts)} AG News texts, bundled MiniLM-L6 on CPU, {os.cpu_count()} cores "
          f"(load avg {results['load_avg_at_start']:.1f} at start)")
    print("| run | actors x threads | pool start s | seconds | texts/s | tokens/s | vs embedded "
          "| efficiency vs 1 actor | same rows |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for k in runs:
        r = results[k]
        if k.startswith("embedded"):
            print(f"| {k} | 1 x {args.threads} | | {r['seconds']:.1f} | {r['texts_per_s']:.1f} | "
                  f"{r['tokens_per_s']:.0f} | | | |")
            continue
        eff = "" if r["efficiency_vs_1"] is None else f"{r['efficiency_vs_1']:.2f}"
        print(f"| {k} | {k[4:]} x {args.threads_per_actor} | {r['pool_start_s']:.1f} | "
              f"{r['seconds']:.1f} | {r['texts_per_s']:.1f} | {r['tokens_per_s']:.0f} | "
              f"{r['vs_embedded']:+.1%} | {eff} | {r['same_rows']} "
              f"(max diff {r['max_abs_diff_mean']:.1e}) |")
    print(f"'vs embedded' compares with the mean of the two embedded runs "
          f"({results['embedded_mean_s']:.1f} s)")
    cold = results["cold_job"]
    print(f"a 20-text job whose actor starts with it: {cold['seconds']:.2f} s, first batch after "
          f"{cold['first_batch_s']:.2f} s")
    for k in runs[1:-1]:
        w = results[k]["warm_job"]
        print(f"a 20-text job on the warm {k} pool (after the big job): {w['seconds']:.2f} s, "
              f"first batch after {w['first_batch_s']:.2f} s")
    print(f"ray.init of a local Ray (once per server, not per job): {results['ray_start_s']:.1f} s")


if __name__ == "__main__":
    main()

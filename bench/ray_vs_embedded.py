"""Throughput of the Ray backend against the embedded one, same texts, same machine.

Both backends extract the same N texts (AG News dev, seeded sample) with the
bundled all-MiniLM-L6-v2 into fresh stores, so nothing is a cache hit. The
embedded backend runs one encoder with all the machine's threads. Ray runs
on a local cluster twice: ``ray-1`` with one actor using all the threads
(the same compute as embedded, so the difference is Ray's overhead), and
``ray-N`` with ``--actors`` actors of ``cores / actors`` threads each (the
same cores, split). What is reported:

- ``ray_start_s``: ``ray.init`` of a local cluster (paid once per server);
- ``small_job``: a 20-text job on each backend: the fixed cost of a job
  (for Ray: starting the actor process and loading the model in it);
- per run: wall seconds, texts/s, tokens/s, and for Ray the change against
  embedded (``ray_s / embedded_s - 1``, embedded_s being the mean of one run
  before and one after the Ray runs, as load drifts on a shared machine),
  which includes starting the actor processes and loading the model in each
  (paid once per job);
- whether the two stores hold the same rows (max |difference| of the stored
  ``mean`` vectors, float16 storage).

Run::

    .venv/bin/python bench/ray_vs_embedded.py --texts 2000 --actors 2 --threads 1

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

from layerbank.cache.store import FeatureStore
from layerbank.workers.backends import make_backend
from layerbank.workers.encoder import Encoder, set_threads

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
    ap.add_argument("--same-session", action="store_true",
                    help="do not re-run in a new session (see the module docstring)")
    args = ap.parse_args()
    if not args.same_session and os.getsid(0) != os.getpid():
        sys.exit(subprocess.call([sys.executable, *sys.argv, "--same-session"],
                                 start_new_session=True))

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
    # one logical CPU per actor at least: a CPU actor reserves num_cpus=1
    ray.init(num_cpus=max(args.threads, args.actors), num_gpus=0, include_dashboard=False, log_to_driver=False,
             object_store_memory=200 * 1024**2)
    results["ray_start_s"] = round(time.perf_counter() - t0, 2)
    # the fixed cost of a job: 20 texts are ~0.1 s of encoding, the rest is starting actors
    small = agnews(args.texts + 20, args.seed)[args.texts:]
    results["small_job"] = {
        "texts": len(small),
        "embedded_s": run("embedded", small, FeatureStore(tmp / "small-e"), encoder)["seconds"],
        "ray_s": run("ray", small, FeatureStore(tmp / "small-r"), encoder, ray_actors=1,
                     threads=args.threads)["seconds"]}
    keys = sorted({emb_store.key(encoder.fingerprint, encoder.config, t) for t in texts})
    ref = emb_store.read_pooled(keys, "mean")
    runs = ["embedded"]
    for actors in dict.fromkeys([1, args.actors]):
        name, per_actor = f"ray-{actors}", max(1, args.threads // actors)
        store = FeatureStore(tmp / name)
        results[name] = run("ray", texts, store, encoder, ray_actors=actors, threads=per_actor,
                            **common)
        r = results[name]
        r["threads_per_actor"] = per_actor
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
    for name in runs[1:]:
        r = results[name]
        r["vs_embedded"] = round(r["seconds"] / base - 1, 3)
        r["vs_embedded_incl_start"] = round((r["seconds"] + results["ray_start_s"]) / base - 1, 3)
    runs.append("embedded_after")

    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "ray_vs_embedded.json").write_text(json.dumps(results, indent=2))
    print(f"{len(texts)} AG News texts, bundled MiniLM-L6 on CPU, {os.cpu_count()} cores "
          f"(load avg {results['load_avg_at_start']:.1f} at start)")
    print("| run | actors x threads | seconds | texts/s | tokens/s | vs embedded | same rows |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for k in runs:
        r = results[k]
        emb = k.startswith("embedded")
        shape = f"1 x {args.threads}" if emb else f"{k[4:]} x {r['threads_per_actor']}"
        vs = "" if emb else f"{r['vs_embedded']:+.1%}"
        same = "" if emb else f"{r['same_rows']} (max diff {r['max_abs_diff_mean']:.1e})"
        print(f"| {k} | {shape} | {r['seconds']:.1f} | {r['texts_per_s']:.1f} | "
              f"{r['tokens_per_s']:.0f} | {vs} | {same} |")
    print(f"'vs embedded' compares with the mean of the two embedded runs "
          f"({results['embedded_mean_s']:.1f} s)")
    sj = results["small_job"]
    print(f"a {sj['texts']}-text job (fixed cost per job): embedded {sj['embedded_s']:.2f} s, "
          f"Ray {sj['ray_s']:.2f} s (actor start and model load)")
    print(f"ray.init of a local Ray (once per server, not per job): {results['ray_start_s']:.1f} s")


if __name__ == "__main__":
    main()

"""What bf16 costs and buys against fp32 (issue 9), in one run.

1. Speed: layerbank extraction (``layerbank.workers.extract.extract`` into a fresh
   store) of the first 1,000 AG News texts at fp32 and at bf16, alternating,
   best of ``--rounds``; real tokens per second and the ratio (target: bf16
   >= 2x fp32 on a CPU with AMX). The bf16 / fp32 ratio of a
   bare matrix product of the model's shapes, timed in the same run, is
   printed beside it: it bounds what autocast can gain.
2. Agreement: per stored vector (every text, hidden state and pooling, as
   stored, float16 by default), ``|bf16 - fp32| / |fp32|``: max and median,
   on those 1,000 texts, and per hidden state.
3. Accuracy: a probe per hidden state (mean pooling, 5-fold stratified CV,
   StandardScaler + LogisticRegression) on SST-2 test (872 sentences) and
   the first 2,000 AG News texts, in both modes (target: within 0.5
   accuracy points per layer). ``--sst2 '' --agnews-probe 0`` skips them.

Run from the repository root::

    .venv/bin/python bench/precision.py            # ~10-15 min on 2 busy cores
    .venv/bin/python bench/precision.py --rounds 1 --agnews-probe 500

Writes bench/out/precision.json (``--json``).
"""

# isort: skip_file  (the order matters: workers must load before torch, see below)
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch
from common import (
    AGNEWS,
    ROOT,
    SST2_TEST,
    alternate,
    environment,
    load_model_path,
    matmul_flops_per_second,
    quiet_transformers,
    read_tsv,
    time_extraction,
    write_json,
)

# repo modules before numpy/torch: importing workers sets the OpenMP and oneDNN
# defaults (workers/__init__.py), which only work before torch loads
from layerbank.cache.shard import POOLINGS
from layerbank.cache.store import FeatureStore
from layerbank.workers.encoder import Encoder, set_threads
from layerbank.workers.extract import extract
from layerbank.workers.precision import autocast_dtype, cpu_flags, cpu_has_fast_bf16


def stored_rows(texts: list[str], encoders: dict[str, Encoder]) -> dict[str, dict[str, np.ndarray]]:
    """mode -> pooling -> [n, H, d] rows as stored and read back, for each encoder."""
    out: dict[str, dict[str, np.ndarray]] = {}
    with tempfile.TemporaryDirectory() as d:
        store = FeatureStore(d)
        for mode, enc in encoders.items():
            s = extract(texts, store, enc, job_id=mode)
            out[mode] = {p: store.read_pooled(s.keys, p).data for p in POOLINGS}
        store.close()
    return out


def relative_differences(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> np.ndarray:
    """[poolings, n, H]: |b - a| / |a| per stored vector."""
    return np.stack([np.linalg.norm(b[p] - a[p], axis=-1) / np.linalg.norm(a[p], axis=-1)
                     for p in POOLINGS])


def probe_accuracy(x: np.ndarray, y: list[str], folds: int, seed: int) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    cv = StratifiedKFold(folds, shuffle=True, random_state=seed)
    return float(cross_val_score(clf, x, y, cv=cv).mean())


def agreement(fp32_rows: dict[str, np.ndarray], low_rows: dict[str, np.ndarray], low: str,
              n_texts: int) -> dict[str, Any]:
    """Print and return the relative differences of one low mode's stored vectors."""
    rel = relative_differences(fp32_rows, low_rows)  # [P, n, H]
    print(f"\nstored vectors, |{low} - fp32| / |fp32| over {rel.size:,} vectors "
          f"({n_texts} texts x {rel.shape[2]} hidden states x {len(POOLINGS)} poolings):")
    print(f"  max {rel.max():.4f}   median {np.median(rel):.4f}   99th percentile "
          f"{np.percentile(rel, 99):.4f}")
    per_pooling = {pl: {"max": float(rel[i].max()), "median": float(np.median(rel[i]))}
                   for i, pl in enumerate(POOLINGS)}
    per_layer = [{"max": float(rel[:, :, h].max()), "median": float(np.median(rel[:, :, h]))}
                 for h in range(rel.shape[2])]
    print("  per pooling: " + ", ".join(f"{k} max {v['max']:.4f} median {v['median']:.4f}"
                                        for k, v in per_pooling.items()))
    print("  per hidden state, median (max): " + " ".join(
        f"h{h} {v['median']:.4f} ({v['max']:.4f})" for h, v in enumerate(per_layer)))
    return {"max": float(rel.max()), "median": float(np.median(rel)),
            "p99": float(np.percentile(rel, 99)), "per_pooling": per_pooling, "per_hidden_state": per_layer}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model directory (default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--agnews", default=str(AGNEWS), help="AG News TSV (text<TAB>label, no header)")
    p.add_argument("--sst2", default=str(SST2_TEST), help="SST-2 test TSV (with header); '' to skip")
    p.add_argument("--device", default="cpu")
    p.add_argument("--low", default="bf16", help="modes compared with fp32, comma-separated "
                   "(bf16; fp16 on CUDA)")
    p.add_argument("--speed-texts", type=int, default=1000)
    p.add_argument("--agnews-probe", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, help="torch threads (default: all usable cores)")
    p.add_argument("--json", default=str(ROOT / "bench" / "out" / "precision.json"))
    args = p.parse_args()

    set_threads(args.threads)
    quiet_transformers()
    fp32 = Encoder.load(load_model_path(args.model), device=args.device, precision="fp32")
    lows = args.low.split(",")
    modes = {"fp32": fp32, **{m: fp32.with_precision(m) for m in lows}}
    print("environment:", environment())
    if args.device == "cpu":
        flags = sorted(f for f in cpu_flags() if "bf16" in f or f.startswith("amx"))
        from layerbank.workers.engines.choice import choose_precision

        found = choose_precision(fp32, None)  # what --precision auto would measure and choose here
        print(f"CPU bfloat16 flags: {', '.join(flags) or 'none'}; AMX: {cpu_has_fast_bf16()}; "
              f"auto measures bf16 at {found.ratio:.2f}x fp32 on its calibration batches and picks "
              f"{found.choice}")

    # 1. speed, keeping the stored rows of the speed texts for 2.
    texts, _ = read_tsv(args.agnews, args.speed_texts)
    real = int(sum(fp32.tokenize(texts).lengths))
    kept: dict[str, dict[str, Any]] = {m: {} for m in modes}
    cfg = fp32.model.config
    d, dff = int(cfg.hidden_size), int(cfg.intermediate_size)
    mm: dict[str, float] = {}

    def bare_matmul() -> None:  # before and after the runs, best kept
        for m in modes:
            f = matmul_flops_per_second(d, dff, device=args.device, dtype=autocast_dtype(m) or torch.float32)
            mm[m] = max(mm.get(m, 0.0), f)

    bare_matmul()
    print(f"\nspeed: {len(texts)} AG News texts, {real:,} real tokens, best of {args.rounds}:")
    best = alternate({m: time_extraction(texts, enc, real, keep=kept[m]) for m, enc in modes.items()},
                     args.rounds)
    bare_matmul()
    speedup = {m: best[m]["tokens_per_second"] / best["fp32"]["tokens_per_second"] for m in lows}
    for m in modes:
        print(f"  {m:<5} {best[m]['tokens_per_second']:>10,.0f} tok/s   bare matmul of the model's "
              f"shapes {mm[m] / 1e9:,.1f} GFLOP/s")
    for m in lows:
        print(f"  {m}/fp32: extraction {speedup[m]:.2f}x (target >= 2 with AMX), "
              f"bare matmul {mm[m] / mm['fp32']:.2f}x")

    # 2. agreement of the stored vectors
    agree = {m: agreement(kept["fp32"]["rows"], kept[m]["rows"], m, len(texts)) for m in lows}

    # 3. probes per hidden state, every mode
    sets = {}
    if args.agnews_probe > 0:
        sets[f"AG News {args.agnews_probe}"] = read_tsv(args.agnews, args.agnews_probe)
    if args.sst2:
        sets = {"SST-2 test": read_tsv(args.sst2, None, header=True), **sets}
    probes: dict[str, Any] = {}
    worst = {m: 0.0 for m in lows}
    for name, (ptexts, labels) in sets.items():
        t0 = time.perf_counter()
        rows = stored_rows(ptexts, modes)
        acc = {m: [probe_accuracy(rows[m]["mean"][:, h], labels, args.folds, args.seed)
                   for h in range(rows[m]["mean"].shape[1])] for m in modes}
        diff = {m: [100 * (b - a) for a, b in zip(acc["fp32"], acc[m])] for m in lows}
        for m in lows:
            worst[m] = max(worst[m], max(abs(x) for x in diff[m]))
        probes[name] = {"accuracy": acc, "difference_points": diff, "texts": len(ptexts)}
        print(f"\nprobe accuracy, {name} ({len(ptexts)} texts, mean pooling, {args.folds}-fold CV; "
              f"{time.perf_counter() - t0:.0f} s):")
        print(f"  {'layer':<6} {'fp32':>7} " + " ".join(f"{m:>7} {'diff':>6}" for m in lows))
        for h in range(len(acc["fp32"])):
            print(f"  h{h:<5} {100 * acc['fp32'][h]:>6.2f}% " + " ".join(
                f"{100 * acc[m][h]:>6.2f}% {diff[m][h]:>+6.2f}" for m in lows))
    for m in lows if sets else ():  # no probe sets asked for: nothing to report
        print(f"\n{m}: largest |accuracy difference| over all layers and sets: {worst[m]:.2f} points "
              "(target <= 0.5)")
    write_json(args.json, {"environment": environment(), "speed": best, "speedup": speedup,
                           "matmul_flops_per_second": mm, "relative_difference": agree,
                           "probes": probes, "worst_accuracy_difference_points": worst})


if __name__ == "__main__":
    main()

"""A full probe sweep on cached features, against the loop people write today.

Data: N AG News texts (4 topics; a seeded sample of ../shared/data/agnews/dev.tsv),
the bundled all-MiniLM-L6-v2 (7 hidden states h_0..h_6, d = 384).

- layerbank: the texts are extracted once into a fresh store (timed, reported
  as the one-time cost); then the sweep -- every hidden state x {mean, cls} x
  5 stratified folds, logistic head (layerbank.app.probes.sweep.run_probe, no control task, no
  learning curve), reading the features from the store -- is timed: wall
  seconds and CPU seconds of this process.
- today's loop: for each (hidden state, pooling), run the encoder with
  ``transformers`` over all N texts (``output_hidden_states=True``, batches
  of 32, the model loaded once), pool, and ``cross_val_score`` a
  ``StandardScaler + LogisticRegression`` over the same 5 folds. Running all
  14 probes takes many minutes on a shared machine, so ``--baseline-probes K``
  of them (default 2: h_6 mean and h_0 cls) are run and timed, and the loop's
  total is their mean x 14. Both figures are printed.

Reported: the speed-up (baseline total / sweep), in wall and in CPU seconds
(CPU is the fairer figure when other work loads the machine), and, as a
sanity check, the accuracy both ways for the probes the baseline ran (the
heads differ: layerbank's logistic head picks C by inner CV).

Run::

    .venv/bin/python bench/probe.py --texts 2000 --threads 2

Prints a table and writes bench/out/probe.json.
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

from common import SHARED, require_data  # the full data sets: ../shared/data, checked when opened

DATA = SHARED / "agnews" / "dev.tsv"
N_STATES = 7
POOLINGS = ("mean", "cls")


def agnews(n: int, seed: int) -> tuple[list[str], list[str]]:
    rows: dict[str, str] = {}
    with open(require_data(DATA), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                text, label = line.rstrip("\n").split("\t")
                rows.setdefault(text, label)
    texts = sorted(rows)
    random.Random(seed).shuffle(texts)
    return texts[:n], [rows[t] for t in texts[:n]]


class Clock:
    """Wall and CPU seconds (this process, all threads) of a block."""

    def __enter__(self) -> Clock:  # noqa: PYI034 - plain class, no subclasses
        self.w, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.w
        self.cpu = time.process_time() - self.c


def sweep(data_dir: Path, texts: list[str], labels: list[str], threads: int) -> dict[str, Any]:
    from layerbank.app.probes.sweep import run_probe
    from layerbank.workers.local import LocalExtractor

    with LocalExtractor.open(data_dir, threads=threads) as ex:
        with Clock() as extraction:
            summary = ex.extract(texts, job_id="bench-probe")
        keys = summary.keys
        with Clock() as clock:
            # the accuracy sweep alone, as the baseline does no more; MDL is timed on its own below
            result = run_probe(lambda p: ex.store.read_pooled(keys, p).data, labels, views=["each_layer"],
                               poolings=POOLINGS, head="logistic", cv=5, seed=0, control_task=False,
                               learning_curve=False, mdl=False)
        mdl = mdl_columns(ex.store, keys, labels)
    return {"mdl": mdl, "extraction_wall_s": round(extraction.wall, 2), "extraction_cpu_s": round(extraction.cpu, 2),
            "tokens": summary.tokens_encoded, "sweep_wall_s": round(clock.wall, 2),
            "sweep_cpu_s": round(clock.cpu, 2), "fits": len(result["results"]) * 5,
            "accuracy": {f"{r['layer']}/{r['pooling']}": round(r["accuracy"]["mean"], 4)
                         for r in result["results"]},
            "best": result["best"]}


def mdl_columns(store: Any, keys: Any, labels: list[str]) -> dict[str, Any]:
    """Online codelength (Voita & Titov 2020) per hidden state and pooling, and what it cost."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    from layerbank.app.probes.mdl import online_codelength

    classes, y = np.unique(np.asarray(labels), return_inverse=True)
    out: dict[str, Any] = {"views": {}}
    with Clock() as clock, threadpool_limits(limits=1):  # as run_probe fits: one BLAS thread
        for pooling in POOLINGS:
            states = store.read_pooled(keys, pooling).data
            for layer in range(states.shape[1]):
                code = online_codelength(states[:, layer], y, len(classes), seed=0)
                out["views"][f"{layer}/{pooling}"] = {"online_kbits": round(code["online_bits"] / 1000, 2),
                                                     "compression": code["compression"]}
    out["wall_s"], out["cpu_s"] = round(clock.wall, 2), round(clock.cpu, 2)
    return out


def baseline(texts: list[str], labels: list[str], probes: list[tuple[int, str]], threads: int) -> dict:
    """The loop: re-extract with transformers for every probe, then cross_val_score."""
    import numpy as np
    import torch
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from transformers import AutoModel, AutoTokenizer

    from layerbank.cache.fingerprint import default_model_path

    torch.set_num_threads(threads)
    path = default_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    y = np.asarray(labels)
    folds = StratifiedKFold(5, shuffle=True, random_state=0)
    runs = []
    for layer, pooling in probes:
        with Clock() as clock:
            chunks = []
            with torch.no_grad():
                for i in range(0, len(texts), 32):
                    enc = tok(texts[i:i + 32], padding=True, truncation=True, return_tensors="pt")
                    h = model(**enc, output_hidden_states=True).hidden_states[layer]
                    if pooling == "mean":
                        mask = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
                        chunks.append(((h * mask).sum(1) / mask.sum(1)).numpy())
                    else:
                        chunks.append(h[:, 0].numpy())
            X = np.concatenate(chunks)
            head = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
            scores = cross_val_score(head, X, y, cv=folds)
        runs.append({"probe": f"{layer}/{pooling}", "wall_s": round(clock.wall, 2),
                     "cpu_s": round(clock.cpu, 2), "accuracy": round(float(scores.mean()), 4)})
    return {"runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (encoder)")
    ap.add_argument("--baseline-probes", type=int, default=2, help="how many of the 14 to run")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    texts, labels = agnews(args.texts, args.seed)
    out: dict[str, Any] = {"texts": len(texts), "classes": sorted(set(labels)), "cores": os.cpu_count(),
                           "load_avg_at_start": round(os.getloadavg()[0], 2), "threads": args.threads,
                           "probes": N_STATES * len(POOLINGS)}
    with tempfile.TemporaryDirectory(prefix="bench-probe-") as tmp:
        out["layerbank"] = sweep(Path(tmp) / "data", texts, labels, args.threads)
    order = [(N_STATES - 1, "mean"), (0, "cls")] + [(k, p) for p in POOLINGS for k in range(N_STATES)]
    chosen = list(dict.fromkeys(order))[: max(1, args.baseline_probes)]
    base = baseline(texts, labels, chosen, args.threads)
    n = out["probes"]
    per_wall = sum(r["wall_s"] for r in base["runs"]) / len(base["runs"])
    per_cpu = sum(r["cpu_s"] for r in base["runs"]) / len(base["runs"])
    base.update(measured_probes=len(base["runs"]), per_probe_wall_s=round(per_wall, 2),
                per_probe_cpu_s=round(per_cpu, 2), total_wall_s_estimated=round(per_wall * n, 1),
                total_cpu_s_estimated=round(per_cpu * n, 1))
    out["baseline"] = base
    lb = out["layerbank"]
    out["speedup_wall"] = round(base["total_wall_s_estimated"] / lb["sweep_wall_s"], 1)
    out["speedup_cpu"] = round(base["total_cpu_s_estimated"] / lb["sweep_cpu_s"], 1)
    out["load_avg_at_end"] = round(os.getloadavg()[0], 2)

    print(f"{len(texts)} AG News texts, {n} probes (h_0..h_6 x mean, cls), 5 folds, logistic; "
          f"{os.cpu_count()} cores, load average {out['load_avg_at_start']} -> {out['load_avg_at_end']}")
    print(f"layerbank  one-time extraction  {lb['extraction_wall_s']:8.1f} s wall {lb['extraction_cpu_s']:8.1f} s CPU")
    print(f"layerbank  sweep ({lb['fits']} fits)     {lb['sweep_wall_s']:8.1f} s wall {lb['sweep_cpu_s']:8.1f} s CPU")
    print(f"baseline   per probe ({len(base['runs'])} run)   {per_wall:8.1f} s wall {per_cpu:8.1f} s CPU")
    print(f"baseline   {n} probes (x{n}, est.) {base['total_wall_s_estimated']:8.1f} s wall "
          f"{base['total_cpu_s_estimated']:8.1f} s CPU")
    print(f"speed-up   {out['speedup_wall']}x wall, {out['speedup_cpu']}x CPU")
    mdl = lb["mdl"]
    print(f"MDL (online codelength) of all {len(mdl['views'])} views: {mdl['wall_s']:.1f} s wall, "
          f"{mdl['cpu_s']:.1f} s CPU")
    for view, m in mdl["views"].items():
        print(f"  h_{view:<8} accuracy {lb['accuracy'][view]:.3f}  codelength {m['online_kbits']:7.2f} kbits  "
              f"compression {m['compression']:.2f}")
    for r in base["runs"]:
        print(f"  probe {r['probe']:<7} accuracy: baseline {r['accuracy']:.3f}, "
              f"layerbank {lb['accuracy'][r['probe']]:.3f}")
    dest = ROOT / "bench" / "out" / "probe.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=1))
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()

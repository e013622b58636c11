"""What the int8 storage dtype costs: bytes per text, and probe accuracy (issue 28 item 5).

Two measurements, each printed as a table (and written to bench/out/int8_cost.json):

1. ``bytes``: the bundled model's shards for ``examples/sst2_sample.tsv`` (300 sentences,
   in the repository) in float32, float16 and int8, pooled only and with ``--tokens``:
   file bytes per text (``ls -l`` of the shards over the texts).
2. ``accuracy``: a logistic probe (layerbank's ``logistic`` head, seed 0) on every hidden
   state, mean and cls pooling, on SST-2 (a seeded ``--train`` of train.tsv's phrases,
   scored on dev.tsv's 6,735) and AG News (dev.tsv's 10,001 split seeded, ``--train``
   fitted, the rest scored). Features are extracted once in float32 and stored the way
   each dtype's shard stores them (float16 rounding; int8 quantised per row per hidden
   state by ``layerbank.cache.int8.quantize``, exactly what an int8 shard holds), so the
   three columns differ by the storage alone. Reads ``../shared/data`` (not in a user's
   clone: the script says so and skips this part).

    .venv/bin/python bench/int8_cost.py                  # both
    .venv/bin/python bench/int8_cost.py --only bytes
    .venv/bin/python bench/int8_cost.py --only accuracy --train 2000
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
DTYPES = ("float32", "float16", "int8")


def _tsv(path: Path, header: bool) -> list[tuple[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [(r[0], r[1]) for r in (rows[1:] if header else rows) if len(r) >= 2]


def measure_bytes() -> dict[str, dict[str, float]]:
    from layerbank.workers.local import LocalExtractor

    texts = [t for t, _ in _tsv(ROOT / "examples" / "sst2_sample.tsv", header=True)]
    out: dict[str, dict[str, float]] = {}
    for dtype in DTYPES:
        for tokens in (False, True):
            with tempfile.TemporaryDirectory() as d:
                with LocalExtractor.open(d, device="cpu", storage_dtype=dtype) as ex:
                    s = ex.extract(texts, job_id="b", want_tokens=tokens)
                size = sum(p.stat().st_size for p in (Path(d) / "shards").glob("*.h5"))
            out.setdefault(dtype, {})["tokens" if tokens else "pooled"] = size / len(texts)
            out[dtype]["tokens_per_text"] = s.tokens_encoded / len(texts)
    return out


def _features(texts: list[str], dtype_dir: str) -> dict[str, np.ndarray]:
    """float32 [n, H, d] mean and cls rows of the bundled model, in input order."""
    from layerbank.workers.local import LocalExtractor

    with LocalExtractor.open(dtype_dir, device="cpu", storage_dtype="float32",
                             poolings="mean,cls") as ex:
        s = ex.extract(texts, job_id="acc")
        return {p: ex.store.read_pooled(s.keys, p).data for p in ("mean", "cls")}


def _stored(x: np.ndarray, dtype: str) -> np.ndarray:
    from layerbank.cache.int8 import dequantize, quantize

    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "int8":
        q = quantize(x)
        return dequantize(q.q, q.scale)
    return x


def _score(x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray, y_te: np.ndarray, dtype: str) -> tuple[float, np.ndarray]:
    from layerbank.app.probes.heads import make_head

    head = make_head("logistic", 0, dtype).fit(x_tr, y_tr)
    pred = head.predict(x_te)
    return float((pred == y_te).mean()), pred


def measure_accuracy(n_train: int, n_score: int | None = None) -> dict[str, object] | None:
    if not DATA.is_dir():
        print(f"accuracy: {DATA} is absent (it is on the development machines only, not in a "
              "clone); skipped", file=sys.stderr)
        return None
    rng = random.Random(0)
    sst_train = _tsv(DATA / "sst2" / "train.tsv", header=True)
    sets = {"sst2": (rng.sample(sst_train, min(n_train, len(sst_train))), _tsv(DATA / "sst2" / "dev.tsv", header=True))}
    ag = _tsv(DATA / "agnews" / "dev.tsv", header=False)
    rng.shuffle(ag)
    sets["agnews"] = (ag[:n_train], ag[n_train:])
    if n_score is not None:  # a quick run: a seeded subset of the scored texts
        sets = {k: (tr, random.Random(1).sample(te, min(n_score, len(te)))) for k, (tr, te) in sets.items()}
    result: dict[str, object] = {}
    for name, (train, test) in sets.items():
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as d:
            feats = _features([t for t, _ in train] + [t for t, _ in test], d)
        extract_s = time.perf_counter() - t0
        y = np.array([lab for _, lab in train] + [lab for _, lab in test])
        n = len(train)
        rows = []
        for pooling, x in feats.items():
            stored = {dt: _stored(x, dt) for dt in DTYPES}
            for layer in range(x.shape[1]):
                acc, preds = {}, {}
                for dt in DTYPES:
                    acc[dt], preds[dt] = _score(stored[dt][:n, layer], y[:n], stored[dt][n:, layer], y[n:], dt)
                rows.append({"pooling": pooling, "layer": layer, **{dt: acc[dt] for dt in DTYPES},
                             "int8_minus_float32_points": 100 * (acc["int8"] - acc["float32"]),
                             "int8_minus_float16_points": 100 * (acc["int8"] - acc["float16"]),
                             "predictions_changed_vs_float32": int((preds["int8"] != preds["float32"]).sum())})
        diffs = [r["int8_minus_float32_points"] for r in rows]
        result[name] = {"train": n, "test": len(test), "extract_seconds": round(extract_s, 1), "rows": rows,
                        "worst_drop_points": round(-min(diffs), 3), "mean_change_points": round(float(np.mean(diffs)), 3)}
        _print_accuracy(name, result[name])  # as it comes: a loaded machine takes minutes per data set
    return result


def _print_accuracy(name: str, r: dict[str, object]) -> None:
    print(f"\n{name}: logistic probe, {r['train']} train / {r['test']} scored, accuracy")
    print(f"{'pooling':7} {'layer':>5} {'float32':>8} {'float16':>8} {'int8':>8} {'int8-f32 pts':>12} {'changed':>8}")
    for row in r["rows"]:  # type: ignore[attr-defined]
        print(f"{row['pooling']:7} {row['layer']:>5} {row['float32']:>8.4f} {row['float16']:>8.4f} "
              f"{row['int8']:>8.4f} {row['int8_minus_float32_points']:>12.2f} "
              f"{row['predictions_changed_vs_float32']:>8}")
    print(f"worst drop {r['worst_drop_points']} points, mean change {r['mean_change_points']} points "
          f"(extraction {r['extract_seconds']} s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["bytes", "accuracy"])
    ap.add_argument("--train", type=int, default=4000, help="training texts per data set (seeded)")
    ap.add_argument("--score", type=int, help="score a seeded subset of this many texts (default: all)")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out: dict[str, object] = {"load_before": os.getloadavg()}
    if args.only in (None, "bytes"):
        b = measure_bytes()
        out["bytes"] = b
        print("bytes per text, bundled model, examples/sst2_sample.tsv (300 sentences, "
              f"{b['float16']['tokens_per_text']:.1f} tokens each)")
        print(f"{'dtype':8} {'pooled':>10} {'with --tokens':>14}")
        for dt in DTYPES:
            print(f"{dt:8} {b[dt]['pooled']:>10,.0f} {b[dt]['tokens']:>14,.0f}")
    if args.only in (None, "accuracy"):
        acc = measure_accuracy(args.train, args.score)
        if acc is not None:
            out["accuracy"] = acc
    out["load_after"] = os.getloadavg()
    dest = ROOT / "bench" / "out"
    dest.mkdir(exist_ok=True)
    (dest / "int8_cost.json").write_text(json.dumps(out, indent=1))
    print(f"\nload average before {out['load_before']}, after {out['load_after']}")


if __name__ == "__main__":
    main()

"""What the int8 storage dtype costs: bytes per text, and probe accuracy (issue 28 item 5).

Two measurements, each printed as a table (and written to bench/out/int8_cost.json):

1. ``bytes``: the bundled model's shards for ``examples/sst2_sample.tsv`` (300 sentences,
   in the repository) in float32, float16 and int8, pooled only and with ``--tokens``:
   file bytes per text (``ls -l`` of the shards over the texts).
2. ``accuracy``: a logistic probe (layerbank's ``logistic`` head, seed 0) on every hidden
   state, mean and cls pooling, on SST-2 (a seeded ``--train`` of train.tsv's phrases,
   scored on dev.tsv's 6,735) and AG News (dev.tsv's 10,001 split seeded, ``--train``
   fitted, the rest scored). Features are extracted once in float32 and stored the way
   each encoding stores them (float16 rounding; ``int8``: quantised per row per hidden
   state by ``layerbank.cache.int8.quantize``, what an int8 shard holds today;
   ``int8-centred``: ``quantize(x, centred=True)`` per block of 2,048 rows, what one shard
   of the default size would hold), so the columns differ by the storage alone.
   ``--encodings`` adds the alternatives measured before choosing the centred one:
   ``int8-outliers4`` (per row, the 4 largest entries kept in float16 beside the codes,
   the rest scaled by the fifth largest) and ``int8-per-dim`` (one scale per dimension
   per block, no centre). Reads ``../shared/data`` (not in a user's clone: the script
   says so and exits with status 2). ``--features FILE.npz`` keeps the float32 features
   (extracted if FILE is absent), so a second run compares encodings in minutes.

    .venv/bin/python bench/int8_cost.py                  # both
    .venv/bin/python bench/int8_cost.py --only bytes
    .venv/bin/python bench/int8_cost.py --only accuracy --train 1000 --score 1500 \
        --features bench/out/int8_features.npz --encodings float32,float16,int8,int8-centred
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import tempfile
import time
from pathlib import Path

import numpy as np
from common import SHARED, require_data  # the full data sets: ../shared/data, checked when opened

ROOT = Path(__file__).resolve().parents[1]
DATA = SHARED
DTYPES = ("float32", "float16", "int8")
ENCODINGS = ("float32", "float16", "int8", "int8-centred")
ALTERNATIVES = ("int8-outliers4", "int8-per-dim")
SHARD_ROWS = 2048  # the default rows per shard: the block one centre is taken over


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
                if dtype == "int8":
                    centred = _with_centres(Path(d) / "shards")
            out.setdefault(dtype, {})["tokens" if tokens else "pooled"] = size / len(texts)
            out[dtype]["tokens_per_text"] = s.tokens_encoded / len(texts)
            if dtype == "int8":
                out.setdefault("int8-centred", {})["tokens" if tokens else "pooled"] = centred / len(texts)
    return out


def _with_centres(shard_dir: Path) -> int:
    """Bytes of the int8 shards in ``shard_dir`` laid out centred (pooled rows re-coded by
    ``quantize(x, centred=True)``, its centres table and ``centre_of`` beside the codes,
    written as cache/shard.py writes any dataset), the shards left as they were."""
    import shutil

    import h5py

    from layerbank.cache.int8 import centre_names, quantize, scale_name
    from layerbank.cache.shard import ShardReader, _dataset

    total = 0
    for path in sorted(shard_dir.glob("*.h5")):
        copy = path.with_suffix(".centred")
        shutil.copyfile(path, copy)
        reader = ShardReader(path)
        with h5py.File(copy, "r+") as f:
            for p in reader.poolings():
                name = f"pooled/{p}"
                rows = quantize(reader.read_pooled(np.arange(f[name].shape[0]), p), centred=True)
                for ds, data in ((name, rows.q), (scale_name(name), rows.scale),
                                 *zip(centre_names(name), (rows.centres, rows.centre_of))):
                    if ds in f:
                        del f[ds]
                    grp, _, leaf = ds.rpartition("/")
                    _dataset(f[grp], leaf, data)
        reader.close()
        # h5py leaves the space of deleted datasets in the file: repack to what a fresh write holds
        packed = path.with_suffix(".packed")
        with h5py.File(copy, "r") as src, h5py.File(packed, "w") as dst:
            for k in src:
                src.copy(src[k], dst, k)
            dst.attrs.update(src.attrs)
        total += packed.stat().st_size
        copy.unlink()
        packed.unlink()
    return total


def _features(texts: list[str], dtype_dir: str) -> dict[str, np.ndarray]:
    """float32 [n, H, d] mean and cls rows of the bundled model, in input order."""
    from layerbank.workers.local import LocalExtractor

    with LocalExtractor.open(dtype_dir, device="cpu", storage_dtype="float32",
                             poolings="mean,cls") as ex:
        s = ex.extract(texts, job_id="acc")
        return {p: ex.store.read_pooled(s.keys, p).data for p in ("mean", "cls")}


def _stored(x: np.ndarray, encoding: str) -> np.ndarray:
    """[n, H, d] float32 rows as ``encoding`` stores them, read back as float32."""
    from layerbank.cache.int8 import quantize

    if encoding == "float16":
        return x.astype(np.float16).astype(np.float32)
    if encoding == "int8":
        return quantize(x).values()
    if encoding == "int8-centred":  # one centre per shard: per block of SHARD_ROWS rows
        return np.concatenate([quantize(x[i:i + SHARD_ROWS], centred=True).values()
                               for i in range(0, len(x), SHARD_ROWS)])
    if encoding == "int8-outliers4":
        return _outliers(x, 4)
    if encoding == "int8-per-dim":
        return np.concatenate([_per_dim(x[i:i + SHARD_ROWS]) for i in range(0, len(x), SHARD_ROWS)])
    assert encoding == "float32", encoding
    return x


def _outliers(x: np.ndarray, k: int) -> np.ndarray:
    """Simulated: each vector's ``k`` largest entries in float16, the rest per-row int8."""
    from layerbank.cache.int8 import quantize

    idx = np.argsort(-np.abs(x), axis=-1)[..., :k]
    kept = np.take_along_axis(x, idx, -1).astype(np.float16).astype(np.float32)
    rest = x.copy()
    np.put_along_axis(rest, idx, 0, -1)
    out = quantize(rest).values()
    np.put_along_axis(out, idx, kept, -1)
    return out


def _per_dim(x: np.ndarray) -> np.ndarray:
    """Simulated: one scale per dimension per hidden state over the block, no centre."""
    scale = np.abs(x).max(axis=0, keepdims=True) / 127
    scale = np.where(scale > 0, scale, 1).astype(np.float32)
    return (np.clip(np.rint(x / scale), -127, 127) * scale).astype(np.float32)


def _score(x_tr: np.ndarray, y_tr: np.ndarray, x_te: np.ndarray, y_te: np.ndarray, encoding: str) -> tuple[float, np.ndarray]:
    from layerbank.app.probes.heads import make_head

    dtype = "int8" if encoding.startswith("int8") else encoding  # the probe's noise floor by dtype
    head = make_head("logistic", 0, dtype).fit(x_tr, y_tr)
    pred = head.predict(x_te)
    return float((pred == y_te).mean()), pred


def _cached_features(cache: Path | None, name: str, texts: list[str]) -> dict[str, np.ndarray]:
    """float32 mean and cls rows of ``texts``, from ``cache`` when it holds this data set
    with these texts (their sha256 recorded), else extracted (and saved there)."""
    import hashlib

    digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()
    saved = dict(np.load(cache)) if cache is not None and cache.is_file() else {}
    if saved.get(f"{name}_texts_sha256", np.array("")).item() == digest:
        return {p: saved[f"{name}_{p}"] for p in ("mean", "cls")}
    with tempfile.TemporaryDirectory() as d:
        feats = _features(texts, d)
    if cache is not None:
        saved.update({f"{name}_{p}": v for p, v in feats.items()})
        saved[f"{name}_texts_sha256"] = np.array(digest)
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.savez(cache, **saved)
    return feats


def measure_accuracy(n_train: int, n_score: int | None = None, encodings: tuple[str, ...] = ENCODINGS,
                     cache: Path | None = None) -> dict[str, object] | None:
    rng = random.Random(0)
    sst_train = _tsv(require_data(DATA / "sst2" / "train.tsv"), header=True)
    sets = {"sst2": (rng.sample(sst_train, min(n_train, len(sst_train))),
                     _tsv(require_data(DATA / "sst2" / "dev.tsv"), header=True))}
    ag = _tsv(require_data(DATA / "agnews" / "dev.tsv"), header=False)
    rng.shuffle(ag)
    sets["agnews"] = (ag[:n_train], ag[n_train:])
    if n_score is not None:  # a quick run: a seeded subset of the scored texts
        sets = {k: (tr, random.Random(1).sample(te, min(n_score, len(te)))) for k, (tr, te) in sets.items()}
    result: dict[str, object] = {}
    for name, (train, test) in sets.items():
        t0 = time.perf_counter()
        feats = _cached_features(cache, name, [t for t, _ in train] + [t for t, _ in test])
        extract_s = time.perf_counter() - t0
        y = np.array([lab for _, lab in train] + [lab for _, lab in test])
        n = len(train)
        rows = []
        for pooling, x in feats.items():
            stored = {e: _stored(x, e) for e in encodings}
            for layer in range(x.shape[1]):
                acc, preds = {}, {}
                for e in encodings:
                    acc[e], preds[e] = _score(stored[e][:n, layer], y[:n], stored[e][n:, layer], y[n:], e)
                rows.append({"pooling": pooling, "layer": layer, **{e: acc[e] for e in encodings},
                             **{f"{e}_minus_float32_points": 100 * (acc[e] - acc["float32"]) for e in encodings},
                             **{f"{e}_predictions_changed": int((preds[e] != preds["float32"]).sum())
                                for e in encodings}})
        worst = {e: round(-min(r[f"{e}_minus_float32_points"] for r in rows), 3) for e in encodings}
        result[name] = {"train": n, "test": len(test), "extract_seconds": round(extract_s, 1), "rows": rows,
                        "encodings": list(encodings), "worst_drop_points": worst}
        _print_accuracy(name, result[name])  # as it comes: a loaded machine takes minutes per data set
    return result


def _print_accuracy(name: str, r: dict[str, object]) -> None:
    encodings: list[str] = r["encodings"]  # type: ignore[assignment]
    others = [e for e in encodings if e != "float32"]
    print(f"\n{name}: logistic probe, {r['train']} train / {r['test']} scored; float32 accuracy, then "
          "each encoding's change in points (predictions changed)")
    print(f"{'pooling':7} {'layer':>5} {'float32':>8} " + " ".join(f"{e:>20}" for e in others))
    for row in r["rows"]:  # type: ignore[attr-defined]
        cells = " ".join(f"{row[f'{e}_minus_float32_points']:>+13.2f} ({row[f'{e}_predictions_changed']:>4})"
                         for e in others)
        print(f"{row['pooling']:7} {row['layer']:>5} {row['float32']:>8.4f} {cells}")
    print("worst drop, points: " + ", ".join(f"{e} {v}" for e, v in r["worst_drop_points"].items() if e != "float32")  # type: ignore[attr-defined]
          + f" (features {r['extract_seconds']} s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["bytes", "accuracy"])
    ap.add_argument("--train", type=int, default=4000, help="training texts per data set (seeded)")
    ap.add_argument("--score", type=int, help="score a seeded subset of this many texts (default: all)")
    ap.add_argument("--encodings", default=",".join(ENCODINGS),
                    help=f"comma-separated, from {', '.join(ENCODINGS + ALTERNATIVES)} (float32 always)")
    ap.add_argument("--features", type=Path, help="an .npz keeping the float32 features between runs")
    args = ap.parse_args()
    encodings = tuple(dict.fromkeys(["float32", *args.encodings.split(",")]))
    unknown = set(encodings) - set(ENCODINGS + ALTERNATIVES)
    if unknown:
        ap.error(f"unknown encodings: {', '.join(sorted(unknown))}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out: dict[str, object] = {"load_before": os.getloadavg()}
    if args.only in (None, "bytes"):
        b = measure_bytes()
        out["bytes"] = b
        print("bytes per text, bundled model, examples/sst2_sample.tsv (300 sentences, "
              f"{b['float16']['tokens_per_text']:.1f} tokens each)")
        print(f"{'dtype':12} {'pooled':>10} {'with --tokens':>14}")
        for dt in (*DTYPES, "int8-centred"):
            print(f"{dt:12} {b[dt]['pooled']:>10,.0f} {b[dt]['tokens']:>14,.0f}")
    if args.only in (None, "accuracy"):
        acc = measure_accuracy(args.train, args.score, encodings, args.features)
        if acc is not None:
            out["accuracy"] = acc
    out["load_after"] = os.getloadavg()
    dest = ROOT / "bench" / "out"
    dest.mkdir(exist_ok=True)
    (dest / "int8_cost.json").write_text(json.dumps(out, indent=1))
    print(f"\nload average before {out['load_before']}, after {out['load_after']}")


if __name__ == "__main__":
    main()

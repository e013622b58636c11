"""A GridSearchCV that chooses the layer and the pooling: layerbank.LayerFeatures
against a transformer that encodes in every ``transform`` (what wrapping an
embedding model as a scikit-learn transformer does today, e.g.
sentence-transformers' ``encode`` inside a ``FunctionTransformer``).

Data: N SST-2 sentences (a seeded sample of ../shared/data/sst2/test.tsv),
the bundled all-MiniLM-L6-v2. The grid is README's: views layer:2, layer:-2,
concat_last_4 x poolings mean, cls, ``cv`` folds, LogisticRegression; so
6 x cv x 2 transforms plus the refit.

- layerbank: ``Pipeline([LayerFeatures(data_dir=<fresh>), LogisticRegression])``;
  the first fold's transforms encode, every other one reads the store.
- re-encoding: the same pipeline with a transformer that runs the same
  encoder (layerbank.workers.encoder.Encoder, batches of 32, the model loaded
  once, outside the timing) on every transform and pools with the same code,
  so both searches see the same numbers up to float16 storage.

Both run on one torch thread (``--threads``). Reported: texts run through
the encoder, wall and CPU seconds of each search, and the ratio.

Run::

    .venv/bin/python bench/grid_search.py --texts 300 --cv 5

Prints a table and writes bench/out/grid_search.json.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin

ROOT = Path(__file__).resolve().parents[1]
from common import SHARED, require_data  # the full data sets: ../shared/data, checked when opened

DATA = SHARED / "sst2" / "test.tsv"
GRID = {"feats__view": ["layer:2", "layer:-2", "concat_last_4"], "feats__pooling": ["mean", "cls"]}


def sst2(n: int, seed: int) -> tuple[list[str], list[int]]:
    with open(require_data(DATA), encoding="utf-8") as f:
        next(f)
        rows = [line.rstrip("\n").split("\t") for line in f]
    random.Random(seed).shuffle(rows)
    return [t for t, _ in rows[:n]], [int(lab) for _, lab in rows[:n]]


class ReEncode(TransformerMixin, BaseEstimator):
    """A scikit-learn transformer that runs the encoder on every transform."""

    encoder: Any = None  # loaded once by main(), shared by clones
    texts_encoded = 0

    def __init__(self, view: str = "layer:-2", pooling: str = "mean") -> None:
        self.view = view
        self.pooling = pooling

    def fit(self, X: Any, y: Any = None) -> ReEncode:
        return self

    def transform(self, X: Any) -> np.ndarray:
        from layerbank.cache.views import parse_view

        enc = type(self).encoder
        texts = list(X)
        type(self).texts_encoded += len(texts)
        parts = []
        for i in range(0, len(texts), 32):
            out = enc.encode(enc.tokenize(texts[i:i + 32]))
            pooled = out.pooled[self.pooling] if isinstance(out.pooled, dict) else \
                out.pooled[("mean", "cls", "max").index(self.pooling)]
            parts.append(pooled)
        states = np.concatenate(parts)  # [n, H, d]
        return parse_view(self.view).apply(states).reshape(len(texts), -1)


def search(transformer: Any, texts: list[str], y: list[int], cv: int) -> tuple[Any, float, float]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import Pipeline

    pipe = Pipeline([("feats", transformer), ("clf", LogisticRegression(max_iter=1000))])
    wall, cpu = time.perf_counter(), time.process_time()
    s = GridSearchCV(pipe, GRID, cv=cv).fit(texts, y)
    return s, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--texts", type=int, default=300)
    ap.add_argument("--cv", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import torch

    from layerbank import Bank, LayerFeatures
    from layerbank.workers.encoder import Encoder

    torch.set_num_threads(args.threads)
    texts, y = sst2(args.texts, args.seed)
    ReEncode.encoder = Encoder.load(None, device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        bank = Bank(tmp, threads=args.threads)  # the Bank every LayerFeatures(data_dir=tmp) shares
        lb, lb_wall, lb_cpu = search(LayerFeatures(data_dir=tmp), texts, y, args.cv)
        lb_encoded = bank.stats["encoded"]
        bank.close()
    base, base_wall, base_cpu = search(ReEncode(), texts, y, args.cv)

    rows = [("layerbank.LayerFeatures", lb_encoded, lb_wall, lb_cpu, lb.best_params_, lb.best_score_),
            ("re-encode per transform", ReEncode.texts_encoded, base_wall, base_cpu, base.best_params_,
             base.best_score_)]
    print(f"GridSearchCV, {args.texts} SST-2 sentences, {args.cv} folds, 6 candidates, "
          f"all-MiniLM-L6-v2 on {args.threads} thread(s)")
    print(f"{'':<26}{'texts encoded':>14}{'wall s':>9}{'CPU s':>9}  best (accuracy)")
    for name, n, wall, cpu, best, score in rows:
        print(f"{name:<26}{n:>14,}{wall:>9.1f}{cpu:>9.1f}  {best['feats__view']}, "
              f"{best['feats__pooling']} ({score:.3f})")
    print(f"speed-up: {base_wall / lb_wall:.1f}x wall, {base_cpu / lb_cpu:.1f}x CPU")
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "grid_search.json").write_text(json.dumps(
        {"texts": args.texts, "cv": args.cv, "threads": args.threads,
         "layerbank": {"encoded": lb_encoded, "wall_s": lb_wall, "cpu_s": lb_cpu, "best": lb.best_params_,
                       "score": lb.best_score_},
         "reencode": {"encoded": ReEncode.texts_encoded, "wall_s": base_wall, "cpu_s": base_cpu,
                      "best": base.best_params_, "score": base.best_score_}}, indent=1))


if __name__ == "__main__":
    main()

"""Freeze or fine-tune on SST-2: every regime, three training sizes, CPU.

Samples a pool from ../shared/data/sst2/train.tsv (seeded), splits it once
(stratified: ``--val`` validation and ``--test`` test sentences, the rest
train), and runs ``layerbank.workers.regimes.run.run_regimes`` with the bundled
all-MiniLM-L6-v2 on the CPU at training sizes 100, 500 and 2,000 (each seed
draws its own stratified subsample of the train split; every regime of a seed
shares it). Prints the table (test macro-F1 and accuracy, trainable share,
bytes per task, seconds per epoch, peak memory) per size, and the verdict.

Out of domain: every regime is also scored on ``--shifted`` sentences drawn
from ../shared/data/sst2/test.tsv, the GLUE development *sentences* (full
movie-review sentences), while training and the in-domain test use the
training *phrases* (fragments of parse trees, 13 tokens on average). Same
labels and source, a shift in length and structure (negation, contrast)
that the shared data holds; the table gives each regime's macro-F1 there and
its gap to the in-domain test (docs/regimes.md).

    .venv/bin/python bench/regimes.py                   # the documented run
    .venv/bin/python bench/regimes.py --seeds 2 --epochs 100:2,500:1,2000:1
    .venv/bin/python bench/regimes.py --curve           # the layer-cut curve (Lee et al.)

``--curve``: the layer-cut curve on its own: ``top_k`` at every cut 0..6 and
``full`` (no frozen probe, no shifted set unless asked), at one training size
(``--sizes``, default 2000 then) and the seeds given; prints the points and
the verdict (the fewest fine-tuned layers reaching 90% of full's macro-F1, to
set against the paper's "a fourth of the final layers") and writes
bench/out/layer_cut.png. ``--top-k`` / ``--xi`` take comma-separated cut
points and rate factors for any run (the curve and the xi sweep).

Settings chosen to stay near 30 minutes on two shared cores, and so smaller
than a tuned study: at most 3 / 1 / 1 epochs for 100 / 500 / 2,000 sentences,
max_length 32 (SST-2 training phrases average 13 tokens; 6% exceed 32),
batch 32, default learning rates (``layerbank.workers.regimes.run.DEFAULT_LR``),
fine-tuned heads starting from the last layer's probe (LP-FT), one torch
thread (on the shared machine two threads ran 5x slower, not faster).
The documented run took 37.6 minutes of wall time, at a load average of
about 11 on two cores, and about 12 minutes of CPU time: the process got about
30% of one core.

Writes bench/out/regimes.json and bench/out/regimes.png (ignored by git).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from common import SHARED, require_data  # the full data sets: ../shared/data, checked when opened

SST2 = SHARED / "sst2" / "train.tsv"
SENTENCES = SHARED / "sst2" / "test.tsv"


def _epochs(spec: str) -> dict[int, int]:
    return {int(k): int(v) for k, v in (part.split(":") for part in spec.split(","))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,500,2000", help="training sizes, comma-separated")
    ap.add_argument("--epochs", default="100:3,500:1,2000:1", help="max epochs per size, size:epochs")
    ap.add_argument("--seeds", type=int, default=3, help="0: the seed rule (docs/regimes.md)")
    ap.add_argument("--regimes", default=None, help="comma-separated (default: all six)")
    ap.add_argument("--shifted", type=int, default=300, help="out-of-domain sentences to score on (0: none)")
    ap.add_argument("--val", type=int, default=100, help="validation sentences")
    ap.add_argument("--test", type=int, default=200, help="test sentences")
    ap.add_argument("--spare", type=int, default=400, help="extra train-split sentences so the "
                    "largest size is a subsample too")
    ap.add_argument("--max-length", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0, help="pool sampling and split seed")
    ap.add_argument("--curve", action="store_true", help="the layer-cut curve: top_k at every cut and full")
    ap.add_argument("--top-k", default=None, help="comma-separated cut points (default: every layer count)")
    ap.add_argument("--xi", default=None, help="comma-separated per-layer rate factors (a sweep)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out"))
    args = ap.parse_args()

    import torch

    from layerbank.app.probes.regimes_plot import format_regimes_table, regimes_plot_png
    from layerbank.workers.regimes.run import run_regimes

    torch.set_num_threads(args.threads)
    if args.curve:  # one size unless asked, the two regimes the curve needs, nothing shifted unless asked
        args.regimes = args.regimes or "top_k,full"
        if args.sizes == ap.get_default("sizes"):
            args.sizes, args.epochs = "2000", "2000:1"
        if args.shifted == ap.get_default("shifted"):
            args.shifted = 0
    sizes = [int(s) for s in args.sizes.split(",")]
    top_k = [int(k) for k in args.top_k.split(",")] if args.top_k else None
    xi = [float(x) for x in args.xi.split(",")] if args.xi else None
    rows = [line.split("\t") for line in require_data(SST2).read_text(encoding="utf-8").splitlines()[1:]]
    pool = max(sizes) + args.spare + args.val + args.test
    rows = random.Random(args.seed).sample(rows, pool)
    texts, labels = [r[0] for r in rows], [int(r[1]) for r in rows]
    started, cpu_started = time.perf_counter(), time.process_time()

    def progress(done: int, total: int) -> None:
        print(f"\r{done}/{total} epochs, {time.perf_counter() - started:.0f} s", end="", flush=True)

    shifted_rows = [line.split("\t") for line in require_data(SENTENCES).read_text(encoding="utf-8").splitlines()[1:]]
    shifted_rows = random.Random(args.seed).sample(shifted_rows, min(args.shifted, len(shifted_rows)))
    eval_sets = {"sentences": ([r[0] for r in shifted_rows], [int(r[1]) for r in shifted_rows])} \
        if args.shifted else None
    regimes = tuple(args.regimes.split(",")) if args.regimes else None
    result = run_regimes(texts, labels, seeds=args.seeds or None, train_sizes=sizes, split_seed=args.seed,
                         regimes=regimes, eval_sets=eval_sets, top_k=top_k, xi=xi,
                         test_size=args.test / pool, val_size=args.val / pool,
                         max_epochs=_epochs(args.epochs), batch_size=args.batch_size,
                         max_length=args.max_length, device="cpu", progress=progress)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    result["bench"] = {"data": str(SST2), "pool": pool, "seconds": elapsed, "cpu_seconds": cpu,
                       "threads": args.threads}
    print()
    print(format_regimes_table(result))
    print(f"pool {pool} sentences (train {result['split']['n_train']}, val {result['split']['n_val']}, "
          f"test {result['split']['n_test']}); seeds per size {result['settings']['seeds_by_size']}"
          f"{' (the seed rule)' if not args.seeds else ''}; epochs {args.epochs}; "
          f"max_length {args.max_length}; batch {args.batch_size}; {args.threads} thread(s); "
          f"{elapsed / 60:.1f} min wall, {cpu / 60:.1f} min CPU")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "regimes.json").write_text(json.dumps(result, indent=1))
    (out / "regimes.png").write_bytes(regimes_plot_png(result))
    print(f"wrote {out / 'regimes.json'} and {out / 'regimes.png'}")
    if result.get("layer_cut"):
        from layerbank.app.probes.regimes_plot import layer_cut_png

        (out / "layer_cut.png").write_bytes(layer_cut_png(result))
        cut = result["layer_cut"]
        fewest = cut.get("fewest_layers_at_90")
        paper = "" if fewest is None else (f" ({fewest / cut['n_layers']:.0%} of the layers; Lee et al.: "
                                           "a fourth of the final layers reach 90%)")
        print(f"layer cut: {cut['verdict']}{paper}; wrote {out / 'layer_cut.png'}")


if __name__ == "__main__":
    main()

"""``layerbank regimes``: freeze or fine-tune, measured, in-process.

    layerbank regimes FILE --text-column sentence --label-column label \\
        [--regimes frozen,bitfit,bitfit_query,lora,top_k,gradual,full] [--seeds 3] [--top-k 0,1,2] \\
        [--xi 0.85,0.95,1.0] \\
        [--train-sizes 100,500] [--max-epochs 10] [--plot DIR] [--json OUT]

extracts the texts the store lacks (layerbank.workers.local.LocalExtractor; the data
directory is held meanwhile), hands their stored mean-pooled states to
``layerbank.workers.regimes.run.run_regimes`` as the frozen features, and prints
``format_regimes_table`` (one line per regime: test macro-F1 and accuracy as
mean ± std over seeds, trainable parameters and share, bytes per task,
seconds per epoch, peak memory) and the verdict: the best regime, and the
cheapest one within one std of it; then the layer-cut curve (``--top-k``
takes a list of cut points, default every layer count) with its 90% verdict,
the xi sweep (``--xi`` with several values) and, with ``--train-sizes``, the
crossover. Trained tensors go to
``<data dir>/regimes/cli-<id>/`` as safetensors. ``--plot DIR`` writes
``regimes.png`` (the HTTP API's picture) and, with a layer-cut curve,
``layer_cut.png``; ``--json OUT`` the whole result.
Every flag has a ``LAYERBANK_*`` twin; list flags take commas.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from layerbank.app.cli.common import (
    ProgressBar,
    add_common_flags,
    add_flag,
    fail,
    load_table,
    settings_from,
)
from layerbank.app.cli.store_first import StoreFirst, locate
from layerbank.app.features_service import TextsLost, features_for

__all__ = ["register", "run", "verdict"]

from layerbank.regime_names import REGIMES

_ALL = ",".join(REGIMES)


def register(sub: Any) -> None:
    p = sub.add_parser("regimes", help="freeze or fine-tune: compare training regimes on labelled texts")
    p.add_argument("file", help="texts with labels (.tsv, .csv, .jsonl)")
    add_flag(p, "--text-column", help="column (or JSON field) holding the text")
    add_flag(p, "--label-column", help="column (or JSON field) holding the label")
    add_flag(p, "--format", help="file format (default: from the suffix)")
    add_flag(p, "--no-header", action="store_true", help="the CSV/TSV file has no header row")
    add_common_flags(p)
    add_flag(p, "--regimes", default=_ALL, help="comma-separated regimes to compare")
    add_flag(p, "--seeds", type=int, help="seeds per regime (the std is over these); default: the seed "
             "rule, ceil(1500 / training texts) within [2, 10] (docs/regimes.md)")
    add_flag(p, "--eval", dest="eval_sets", help="extra evaluation sets, NAME=FILE[,NAME=FILE...] (same "
             "columns and format as FILE; e.g. a shifted domain): every regime is scored on each too")
    add_flag(p, "--top-k", help="bottom layers the top_k regime freezes, or comma-separated cut points "
             "(one row each and the layer-cut curve; default: every layer count 0..L, every other above 12)")
    add_flag(p, "--xi", help="per-layer rate factor of full, top_k, gradual (lr of layer l = lr * xi ** (L - l)); "
             "comma-separated to sweep it (default: gradual 1/2.6, the others one rate)")
    add_flag(p, "--train-sizes", help="comma-separated training-set sizes (default: the whole train split)")
    add_flag(p, "--max-epochs", type=int, default=10, help="epoch budget of each fine-tune")
    add_flag(p, "--split-seed", type=int, default=0, help="seed of the train/validation/test split")
    add_flag(p, "--plot", help="directory to write regimes.png into")
    add_flag(p, "--json", help="file to write the whole result into (JSON)")
    p.set_defaults(run=run)


def verdict(result: dict[str, Any]) -> str:
    """One line a person acts on: the best regime, and the cheapest within one std of it.

    With one seed there is no std: the line says so rather than "± 0.000"."""
    from layerbank.app.probes.regimes_plot import NO_SPREAD

    rows = result["regimes"]
    best, cheap = result["best"], result["cheapest_within_one_std"]
    close = result.get("too_close_to_call") or []
    if close and len(result.get("settings", {}).get("seeds", [])) > 1:
        return (f"verdict: the spread is too wide to separate {best} (macro-F1 "
                f"{rows[best]['macro_f1_mean']:.3f} ± {rows[best]['macro_f1_std']:.3f}) from "
                + ", ".join(f"{r} ({rows[r]['macro_f1_mean']:.3f} ± {rows[r]['macro_f1_std']:.3f})"
                            for r in close)
                + f": their one-std intervals overlap; run more seeds to rank them. Cheapest within one "
                f"std of {best}: {cheap} ({rows[cheap]['bytes_per_task']:,} bytes per task)")
    if len(result.get("settings", {}).get("seeds", [])) == 1:
        return (f"verdict: best {best} (macro-F1 {rows[best]['macro_f1_mean']:.3f}; {NO_SPREAD}, so no "
                "cheaper regime can be called as good: run with --seeds 3 to compare within noise)")
    line = (f"verdict: best {best} (macro-F1 {rows[best]['macro_f1_mean']:.3f} ± "
            f"{rows[best]['macro_f1_std']:.3f}); cheapest within one std: {cheap} "
            f"({rows[cheap]['bytes_per_task']:,} bytes per task")
    if cheap == best:
        return line + ")"
    return line + f", {rows[best]['bytes_per_task'] / max(rows[cheap]['bytes_per_task'], 1):,.0f}x " \
                  f"less than {best})"


def _numbers(flag: str, text: str | None, kind: type) -> Any:
    """None, one number, or a list of them, from a comma-separated flag."""
    if not text:
        return None
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        fail(f"{flag} must be comma-separated numbers, got {text!r}")
        raise
    return values[0] if len(values) == 1 else values


def _args(args: argparse.Namespace) -> tuple[list[str], list[int] | None]:
    regimes = [r.strip() for r in args.regimes.split(",") if r.strip()]
    unknown = [r for r in regimes if r not in REGIMES]
    if unknown or not regimes:
        fail(f"--regimes: unknown {unknown}; choose from {','.join(REGIMES)}")
    if (args.seeds is not None and args.seeds < 1) or args.max_epochs < 1:
        fail("--seeds and --max-epochs must be at least 1")
    try:
        sizes = [int(s) for s in args.train_sizes.split(",") if s.strip()] if args.train_sizes else None
    except ValueError:
        fail(f"--train-sizes must be comma-separated integers, got {args.train_sizes!r}")
        raise
    return regimes, sizes


def _eval_sets(args: argparse.Namespace) -> dict[str, tuple[list[str], list[Any]]]:
    """``--eval NAME=FILE,...`` read with the main file's columns and format, checked before any work."""
    out: dict[str, tuple[list[str], list[Any]]] = {}
    for item in (args.eval_sets or "").split(","):
        if not item.strip():
            continue
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            fail(f"--eval: expected NAME=FILE, got {item!r}")
        if name.strip() in out:
            fail(f"--eval: the name {name.strip()!r} is given twice")
        table = load_table(argparse.Namespace(**{**vars(args), "file": path.strip()}),
                           label_column=args.label_column)
        if not table.labels or any(v is None or v == "" for v in table.labels):
            fail(f"--eval {name}: some texts in {path} have no label in column {args.label_column!r}")
        out[name.strip()] = (table.texts, list(table.labels))
    return out


def run(args: argparse.Namespace) -> int:
    if args.label_column is None:
        fail("--label-column is required: the column (or JSON field) holding each text's label")
    regimes, sizes = _args(args)
    top_k, xi = _numbers("--top-k", args.top_k, int), _numbers("--xi", args.xi, float)
    settings = settings_from(args)
    table = load_table(args, label_column=args.label_column)
    labels = table.labels or []
    if len(labels) != len(table.texts) or any(label is None or label == "" for label in labels):
        fail(f"{args.file}: some texts have no label in column {args.label_column!r}")
    eval_sets = _eval_sets(args)
    from layerbank.app.probes.regimes_plot import format_regimes_table, regimes_plot_png
    from layerbank.workers.regimes.resources import Cancelled
    from layerbank.workers.regimes.run import run_regimes  # imports torch only when run

    run_id = "cli-" + uuid.uuid4().hex[:10]
    bar = ProgressBar(not args.no_progress, "epoch")
    with StoreFirst.open(settings, locate(settings), url_flag=True) as sf:
        from layerbank.workers.regimes.families import UnmappableModel, describe, require

        ex = sf.extractor()  # fine-tuning needs the weights: they load whatever is stored
        try:  # a model whose layers or projections cannot be found: one line, before any work
            require(describe(ex.encoder.torch_model()), regimes, name=repr(ex.encoder.name))
        except UnmappableModel as e:
            fail(str(e))
        # the frozen regime's features: the stored mean states, the misses extracted first
        # (layerbank.app.features_service); rows that cannot be read back are computed by the regime
        try:
            frozen = features_for(table.texts, sf.text_source(
                lambda keys: [sf.store.read_pooled(keys, "mean")], progress=not args.no_progress)).results[0].data
        except TextsLost:
            frozen = None
        try:
            result = run_regimes(
                table.texts, labels, model_path=ex.encoder.name, regimes=regimes, seeds=args.seeds,
                eval_sets=eval_sets,
                top_k=top_k, xi=xi,
                train_sizes=sizes, max_epochs=args.max_epochs, split_seed=args.split_seed,
                max_length=int(ex.encoder.config.max_length or 512), device=str(ex.encoder.device),
                frozen_features=frozen, storage_dtype=str(ex.encoder.config.storage_dtype),
                out_dir=ex.store.root / "regimes" / run_id, progress=bar, stage=bar.stage)
        except (ValueError, Cancelled) as e:  # labels too few to split, a size too big, Ctrl-C'd
            bar.close()
            fail(str(e))
            raise
    bar.close()
    print(format_regimes_table(result))
    print(verdict(result))
    print(f"trained tensors: {settings.data_dir / 'regimes' / run_id}", file=sys.stderr)
    if args.plot:
        out = Path(args.plot)
        out.mkdir(parents=True, exist_ok=True)
        (out / "regimes.png").write_bytes(regimes_plot_png(result))
        print(f"wrote {out / 'regimes.png'}", file=sys.stderr)
        if result.get("layer_cut"):
            from layerbank.app.probes.regimes_plot import layer_cut_png

            (out / "layer_cut.png").write_bytes(layer_cut_png(result))
            print(f"wrote {out / 'layer_cut.png'}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0

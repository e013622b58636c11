"""The BERT paper's feature-based NER table, on the bundled encoder.

Devlin et al. (2019), Table 7, froze BERT-base and fed its states to a
two-layer BiLSTM tagger on CoNLL-2003 (development F1). This script repeats
the experiment with layerbank on the FULL CoNLL-2003 training set (14,041
sentences) against validation: it extracts token-level states of every
layer, reads one vector per word (first sub-token, as the paper did) view by
view from the store (layerbank.app.probes.word_views: one view's matrix in
memory at a time), fits a linear tagger per view
(layerbank.app.probes.token_probe) with the word-type control task and MDL,
and prints entity F1, control F1, selectivity, MDL compression and control
compression next to the paper's figures; then the total time (extraction
included), the peak resident memory (VmHWM) of the process that probes and,
separately, of the one that extracts (a spawned child, as a server's worker:
torch and the weights are ~1 GB resident on their own), and the bytes stored
per token and per word.

    .venv/bin/python bench/ner_table.py                          # the documented run (full set)
    .venv/bin/python bench/ner_table.py --train-sentences 1500   # a quick seeded subset
    .venv/bin/python bench/ner_table.py --views layer:-1 scalar_mix --no-mdl

``scalar_mix`` is not in the default views: its head mixes every hidden
state, so it needs all of them at once ([n_words, 7, 384] float32, 2.2 GB on
the full set), which is what the view-by-view path avoids.

The numbers are not comparable one to one: the paper's encoder is BERT-base
(12 layers, hidden 768, cased) with a BiLSTM head and document context; ours
is all-MiniLM-L6-v2 (6 layers, hidden 384, uncased, tuned for sentence
similarity) with a linear head on single sentences. The table shows which
views help, not who wins.

Writes JSON to bench/out/ner_table.json (ignored by git).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import Any

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common import SHARED, require_data  # the full data sets: ../shared/data, checked when opened

from layerbank.app.probes.token_probe import run_token_probe
from layerbank.app.probes.word_features import sentence_texts, uncovered_words
from layerbank.app.probes.word_views import word_views
from layerbank.app.probes.wordsets import read_wordset
from layerbank.cache.store import FeatureStore

DATA = SHARED / "conll2003"

# (our view, what the paper called it, its dev F1); fine-tuning is the ceiling.
PAPER = [
    ("layer:0", "Embeddings", 91.0),
    ("layer:-1", "Last Hidden", 94.9),
    ("layer:-2", "Second-to-Last Hidden", 95.6),
    ("sum_last_4", "Sum Last Four Hidden", 95.9),
    ("concat_last_4", "Concat Last Four Hidden", 96.1),
    ("mean_all", "(uniform weights: not in the paper)", None),
    ("scalar_mix", "Weighted Sum All 12 Layers", 95.5),
]
FINE_TUNE = ("Fine-tuning (all parameters)", 96.4)


def subset(sentences: list[Any], n: str, seed: int) -> tuple[list[Any], list[int] | None]:
    if n == "all" or int(n) >= len(sentences):
        return sentences, None
    idx = sorted(np.random.default_rng(seed).choice(len(sentences), int(n), replace=False).tolist())
    return [sentences[i] for i in idx], idx


def peak_rss_bytes() -> int:
    """VmHWM of this process: the most resident memory it has held so far (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_seconds() -> float:
    """User + system CPU time of this process so far (the time it would take one idle core)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def extract_in_child(data_dir: str, texts: list[str], threads: int, job: str) -> dict[str, Any]:
    """Extract with token-level states (in a spawned process); what the parent needs to read them."""
    from layerbank.workers.local import LocalExtractor

    with LocalExtractor.open(data_dir, threads=threads) as ex:
        summary = ex.extract(texts, job_id=job, want_tokens=True)
        return {"summary": summary.as_dict(), "sizes": token_bytes(ex.store.shard_dir, job),
                "info": dict(ex.encoder.info), "fingerprint": ex.encoder.fingerprint,
                "config": ex.encoder.config.canonical(), "storage_dtype": ex.encoder.config.storage_dtype,
                "peak_rss_bytes": peak_rss_bytes(), "cpu_seconds": cpu_seconds()}


def token_bytes(shard_dir: Path, job: str) -> dict[str, int]:
    """Bytes on disk of the token-level datasets vs the rest, over this job's shards."""
    out = {"token_level": 0, "token_states": 0, "pooled_and_index": 0, "tokens": 0}
    for path in sorted(shard_dir.glob(f"{job}-*.h5")):
        with h5py.File(path, "r") as f:
            def visit(name: str, obj: object) -> None:
                if isinstance(obj, h5py.Dataset):
                    size = obj.id.get_storage_size()
                    if name.startswith("tokens/"):
                        out["token_level"] += size
                        if name.startswith("tokens/layer_"):
                            out["token_states"] += size
                    else:
                        out["pooled_and_index"] += size
            f.visititems(visit)
            out["tokens"] += int(f["tokens/offsets"][-1])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", help="layerbank data directory (default: a temporary one, removed after)")
    ap.add_argument("--train-sentences", default="all",
                    help="seeded subset of train.txt sentences, or 'all' (default: all 14,041)")
    ap.add_argument("--valid-sentences", default="all",
                    help="seeded subset of valid.txt sentences for a smoke run, or 'all' (default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-iter", type=int, default=200, help="lbfgs iterations of each linear head")
    ap.add_argument("--mix-rounds", type=int, default=10,
                    help="rounds of the learned scalar mix's alternating fit (each ~ one logistic fit)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--views", nargs="+", default=[v for v, _, _ in PAPER if v != "scalar_mix"])
    ap.add_argument("--no-mdl", action="store_true", help="skip the MDL codelengths (faster)")
    ap.add_argument("--no-control", action="store_true", help="skip the word-type control task")
    ap.add_argument("--mode", choices=("first", "mean"), default="first")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "ner_table.json"))
    args = ap.parse_args()
    t_start = time.perf_counter()
    load_start = os.getloadavg()

    train_all = read_wordset(require_data(DATA / "train.txt"))
    valid, _ = subset(read_wordset(require_data(DATA / "valid.txt")), args.valid_sentences, args.seed)
    train, picked = subset(train_all, args.train_sentences, args.seed)
    texts = sentence_texts(train + valid)  # validates every sentence before anything is stored
    n_words = {"train": sum(len(s.words) for s in train), "valid": sum(len(s.words) for s in valid)}
    print(f"CoNLL-2003: train {len(train)} of {len(train_all)} sentences ({n_words['train']} words"
          f"{'' if picked is None else f', seeded subset, seed {args.seed}'}), "
          f"valid {len(valid)} sentences ({n_words['valid']} words)", flush=True)

    data_dir = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="ner-table-"))
    job = "ner-table"
    try:
        # Extraction runs in its own process, as a server's worker does: torch and the weights
        # (about 1 GB resident) are gone before the probe starts; both peaks are reported.
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            ext = pool.submit(extract_in_child, str(data_dir), texts, args.threads, job).result()
        info, summary, sizes = ext["info"], ext["summary"], ext["sizes"]
        h, d, itemsize = info["n_hidden_states"], info["hidden_size"], np.dtype(ext["storage_dtype"]).itemsize
        extraction = {
            **summary,
            "tokens_per_second": summary["tokens_encoded"] / summary["seconds"] if summary["seconds"] else None,
            "bytes_per_token_all": summary["bytes_written"] / max(1, summary["tokens_encoded"]),
            "bytes_per_token_token_level": sizes["token_level"] / max(1, sizes["tokens"]),
            "bytes_per_token_states_expected": h * d * itemsize,
            **{f"disk_{k}": v for k, v in sizes.items()},
            "device": info["device"], "threads": args.threads, "peak_rss_bytes": ext["peak_rss_bytes"],
        }
        print(f"extraction: {summary['texts_encoded']} texts, {summary['tokens_encoded']} tokens in "
              f"{summary['seconds']:.1f} s ({extraction['tokens_per_second'] or 0:,.0f} tokens/s, "
              f"{info['device']}, {args.threads} threads), {summary['cache_hits']} cache hits; peak RSS of the "
              f"extracting process {ext['peak_rss_bytes'] / 2**30:.2f} GiB", flush=True)
        print(f"stored: {summary['bytes_written'] / 1e6:,.1f} MB = "
              f"{extraction['bytes_per_token_all']:,.0f} bytes/token in all, of which token-level "
              f"{extraction['bytes_per_token_token_level']:,.0f} bytes/token (expected states "
              f"{h} x {d} x {itemsize} B = {extraction['bytes_per_token_states_expected']:,} + ids, spans, "
              "word ids)", flush=True)

        with closing(FeatureStore(data_dir)) as store:
            t0 = time.perf_counter()
            fp, cfg = ext["fingerprint"], ext["config"]
            train_ws = word_views(store, fp, cfg, train, mode=args.mode)
            valid_ws = word_views(store, fp, cfg, valid, mode=args.mode)
            read_seconds = time.perf_counter() - t0
            print(f"word states ({args.mode} sub-token, read view by view): train {train_ws.shape}, valid "
                  f"{valid_ws.shape} resolved in {read_seconds:.1f} s; words cut by truncation: "
                  f"train {len(uncovered_words(train_ws))}, valid {len(uncovered_words(valid_ws))}", flush=True)

            rows, warned = [], []
            for view in args.views:
                t0 = time.perf_counter()
                res = run_token_probe(train_ws, valid_ws, views=[view], control_task=not args.no_control,
                                      mdl=not args.no_mdl, max_iter=args.max_iter, mix_rounds=args.mix_rounds,
                                      seed=args.seed)
                row = res["rows"][0]
                row["seconds"] = time.perf_counter() - t0
                rows.append(row)
                warned += res["warnings"]
                mdl = row.get("mdl") or {}
                # everything the table shows, as each view finishes (a long run can be read before its end)
                print(f"  {view:<14} F1 {100 * row['f1']:5.1f}  control F1 "
                      f"{100 * (row['control_f1'] or 0):5.1f}  compression {mdl.get('compression')} "
                      f"(control {mdl.get('control_compression')})  ({row['seconds']:.0f} s: tagger "
                      f"{row['fit_seconds']:.0f}, control {row['control_fit_seconds'] or 0:.0f}, MDL "
                      f"{mdl.get('seconds', 0):.0f}; peak RSS so far {peak_rss_bytes() / 2**30:.2f} GiB"
                      f"{'' if row['converged'] else ', not converged'})", flush=True)
    finally:
        if not args.data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)

    print_table(rows, info, len(train), n_words["train"])
    for w in warned:
        print(f"warning: {w}")
    total = time.perf_counter() - t_start
    peak = peak_rss_bytes()
    # where the time went: the views' parts are summed over views (the control head runs beside the tagger)
    spent = {"extraction": summary["seconds"], "resolve_words": read_seconds,
             "tagger": sum(r["fit_seconds"] for r in rows),
             "control_head": sum(r["control_fit_seconds"] or 0.0 for r in rows),
             "mdl": sum((r["mdl"] or {}).get("seconds", 0.0) for r in rows),
             "views_total": sum(r["seconds"] for r in rows)}
    spent["view_reads_and_rest"] = spent["views_total"] - spent["tagger"] - spent["mdl"]
    load_end = os.getloadavg()
    cpu = {"extracting": ext["cpu_seconds"], "probing": cpu_seconds()}
    # on a shared machine the wall time says more about the others than about this run
    print(f"CPU time: extracting process {cpu['extracting']:.0f} s, probing process {cpu['probing']:.0f} s "
          f"(user + system; wall time {total:.0f} s on {os.cpu_count()} CPUs)")
    print("time: " + ", ".join(f"{k} {v:.0f} s" for k, v in spent.items())
          + f" (the control head fits beside the tagger); load average {load_start[0]:.1f} at the start, "
          f"{load_end[0]:.1f} at the end (1 min), {load_end[1]:.1f} (5 min) on {os.cpu_count()} CPUs")
    print(f"total {total / 60:.1f} min (extraction included), peak resident memory {peak / 2**30:.2f} GiB "
          f"probing (VmHWM of this process), {ext['peak_rss_bytes'] / 2**30:.2f} GiB extracting; stored {extraction['bytes_per_token_token_level']:,.0f} bytes per token, "
          f"{extraction['disk_token_level'] / max(1, n_words['train'] + n_words['valid']):,.0f} bytes per word "
          "at token level")
    result = {
        "model": info, "extraction_config": json.loads(cfg),
        "train_sentences": len(train), "train_subset_seed": None if picked is None else args.seed,
        "valid_sentences": len(valid), "n_words": n_words, "word_mode": args.mode,
        "max_iter": args.max_iter, "mix_rounds": args.mix_rounds, "extraction": extraction, "word_states_seconds": read_seconds,
        "rows": rows, "paper": {v: {"name": n, "f1": f} for v, n, f in PAPER},
        "paper_fine_tune": FINE_TUNE[1], "total_seconds": total, "peak_rss_bytes": peak, "warnings": warned,
        "seconds_by_stage": spent, "cpu_seconds": cpu, "load_average": {"start": load_start, "end": load_end},
        "bytes_per_word_token_level": extraction["disk_token_level"] / max(1, n_words["train"] + n_words["valid"]),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


def print_table(rows: list[dict[str, Any]], info: dict[str, Any], n_train: int, n_train_words: int) -> None:
    paper = {v: (n, f) for v, n, f in PAPER}
    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    print("\nCoNLL-2003 NER, development entity F1, frozen encoder")
    print(f"{'view':<15}{'F1':>6}{'ctl F1':>8}{'select':>8}{'compr':>7}{'ctl cmp':>8}{'s':>6}   "
          f"{'BERT paper (Table 7)':<40}{'paper':>6}")
    for row in rows:
        name, f1 = paper.get(row["view"], ("", None))
        mdl = row.get("mdl") or {}
        extra = ""
        if row.get("mix"):
            extra = "  weights " + " ".join(f"{w:.2f}" for w in row["mix"]["layer_weights"])
        sel = None if row.get("selectivity") is None else 100 * row["selectivity"]
        ctl = None if row.get("control_f1") is None else 100 * row["control_f1"]
        print(f"{row['view']:<15}{100 * row['f1']:>6.1f}{num(ctl, '.1f'):>8}{num(sel, '.1f'):>8}"
              f"{num(mdl.get('compression'), '.2f'):>7}{num(mdl.get('control_compression'), '.2f'):>8}"
              f"{row['seconds']:>6.0f}   {name:<40}{'' if f1 is None else f1:>6}{extra}")
    print(f"{'':<56}{FINE_TUNE[0]:<40}{FINE_TUNE[1]:>6}")
    print("F1, control F1 (word-type control, Hewitt & Liang) and selectivity in points; compr = MDL "
          "compression (uniform / online codelength, Voita & Titov), ctl cmp the same on the control tags; "
          "s = seconds for the view (read, tagger, control, MDL).")
    print(f"ours: {info['name']} ({info['num_layers']} layers, hidden {info['hidden_size']}), linear head "
          f"(logistic regression) on the first sub-token, {n_train} train sentences ({n_train_words} words)."
          "\npaper: BERT-base (12 layers, hidden 768, cased), two-layer BiLSTM head, document context."
          "\nThe encoders and heads differ: compare the ordering of views, not the absolute numbers.")


if __name__ == "__main__":
    raise SystemExit(main())

"""The BERT paper's feature-based NER table, on the bundled encoder.

Devlin et al. (2019), Table 7, froze BERT-base and fed its states to a
two-layer BiLSTM tagger on CoNLL-2003 (development F1). This script repeats
the experiment with layerbank: it extracts token-level states of every layer
for CoNLL-2003 train and valid, takes one vector per word (first sub-token,
as the paper did), fits a linear tagger per view (layerbank.app.probes.token_probe) and prints
entity F1 next to the paper's figures, with extraction time and bytes stored
per token.

    .venv/bin/python bench/ner_table.py                       # the documented run
    .venv/bin/python bench/ner_table.py --train-sentences all --max-iter 300
    .venv/bin/python bench/ner_table.py --views layer:-1 --train-sentences 1000   # timing one view

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
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from layerbank.app.probes.token_probe import run_token_probe
from layerbank.app.probes.word_features import sentence_texts, uncovered_words, word_states
from layerbank.app.probes.wordsets import read_wordset
from layerbank.workers.local import LocalExtractor

DATA = ROOT.parent / "shared" / "data" / "conll2003"

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
    # 1,500 keeps the whole run under 25 minutes on 2 busy cores (the learned
    # mix dominates); the full train set took 9 minutes for one view there.
    ap.add_argument("--train-sentences", default="1500",
                    help="seeded subset of train.txt sentences, or 'all' (default 1500)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-iter", type=int, default=200, help="lbfgs iterations of each linear head")
    ap.add_argument("--mix-rounds", type=int, default=10,
                    help="rounds of the learned scalar mix's alternating fit (each ~ one logistic fit)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--views", nargs="+", default=[v for v, _, _ in PAPER])
    ap.add_argument("--mode", choices=("first", "mean"), default="first")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "ner_table.json"))
    args = ap.parse_args()
    t_start = time.perf_counter()

    train_all = read_wordset(DATA / "train.txt")
    valid = read_wordset(DATA / "valid.txt")
    train, picked = subset(train_all, args.train_sentences, args.seed)
    texts = sentence_texts(train + valid)  # validates every sentence before anything is stored
    n_words = {"train": sum(len(s.words) for s in train), "valid": sum(len(s.words) for s in valid)}
    print(f"CoNLL-2003: train {len(train)} of {len(train_all)} sentences ({n_words['train']} words"
          f"{'' if picked is None else f', seeded subset, seed {args.seed}'}), "
          f"valid {len(valid)} sentences ({n_words['valid']} words)", flush=True)

    data_dir = Path(args.data_dir) if args.data_dir else Path(tempfile.mkdtemp(prefix="ner-table-"))
    job = "ner-table"
    try:
        with LocalExtractor.open(data_dir, threads=args.threads) as ex:
            enc = ex.encoder
            summary = ex.extract(texts, job_id=job, want_tokens=True)
            sizes = token_bytes(ex.store.shard_dir, job)
            h, d = enc.info["n_hidden_states"], enc.info["hidden_size"]
            extraction = {
                **summary.as_dict(),
                "tokens_per_second": summary.tokens_encoded / summary.seconds if summary.seconds else None,
                "bytes_per_token_all": summary.bytes_written / max(1, summary.tokens_encoded),
                "bytes_per_token_token_level": sizes["token_level"] / max(1, sizes["tokens"]),
                "bytes_per_token_states_expected": h * d * np.dtype(enc.config.storage_dtype).itemsize,
                **{f"disk_{k}": v for k, v in sizes.items()},
                "device": enc.info["device"], "threads": args.threads,
            }
            print(f"extraction: {summary.texts_encoded} texts, {summary.tokens_encoded} tokens in "
                  f"{summary.seconds:.1f} s ({extraction['tokens_per_second'] or 0:,.0f} tokens/s, "
                  f"{enc.info['device']}, {args.threads} threads), {summary.cache_hits} cache hits", flush=True)
            print(f"stored: {summary.bytes_written / 1e6:,.1f} MB = "
                  f"{extraction['bytes_per_token_all']:,.0f} bytes/token in all, of which token-level "
                  f"{extraction['bytes_per_token_token_level']:,.0f} bytes/token (expected states "
                  f"{h} x {d} x {np.dtype(enc.config.storage_dtype).itemsize} B = "
                  f"{extraction['bytes_per_token_states_expected']:,} + ids, spans, word ids)", flush=True)

            t0 = time.perf_counter()
            fp, cfg = enc.fingerprint, enc.config
            train_ws = word_states(ex.store, fp, cfg, train, mode=args.mode)
            valid_ws = word_states(ex.store, fp, cfg, valid, mode=args.mode)
            read_seconds = time.perf_counter() - t0
            print(f"word states ({args.mode} sub-token): train {train_ws.states.shape}, valid "
                  f"{valid_ws.states.shape} read in {read_seconds:.1f} s; words cut by truncation: "
                  f"train {len(uncovered_words(train_ws))}, valid {len(uncovered_words(valid_ws))}", flush=True)

        rows = []
        for view in args.views:
            t0 = time.perf_counter()
            res = run_token_probe(train_ws, valid_ws, views=[view], control_task=False,
                                  max_iter=args.max_iter, mix_rounds=args.mix_rounds, seed=args.seed)
            row = res["rows"][0]
            rows.append(row)
            print(f"  {view:<14} F1 {100 * row['f1']:5.1f}  ({time.perf_counter() - t0:.0f} s"
                  f"{'' if row['converged'] else ', not converged'})", flush=True)
    finally:
        if not args.data_dir:
            shutil.rmtree(data_dir, ignore_errors=True)

    print_table(rows, enc.info, len(train), n_words["train"])
    result = {
        "model": enc.info, "extraction_config": json.loads(cfg.canonical()),
        "train_sentences": len(train), "train_subset_seed": None if picked is None else args.seed,
        "valid_sentences": len(valid), "n_words": n_words, "word_mode": args.mode,
        "max_iter": args.max_iter, "mix_rounds": args.mix_rounds, "extraction": extraction, "word_states_seconds": read_seconds,
        "rows": rows, "paper": {v: {"name": n, "f1": f} for v, n, f in PAPER},
        "paper_fine_tune": FINE_TUNE[1], "total_seconds": time.perf_counter() - t_start,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {out}; total {result['total_seconds'] / 60:.1f} min")
    return 0


def print_table(rows: list[dict[str, Any]], info: dict[str, Any], n_train: int, n_train_words: int) -> None:
    paper = {v: (n, f) for v, n, f in PAPER}
    print("\nCoNLL-2003 NER, development entity F1, frozen encoder")
    print(f"{'view':<15}{'ours':>7}   {'BERT paper (Table 7)':<40}{'paper':>6}")
    for row in rows:
        name, f1 = paper.get(row["view"], ("", None))
        extra = ""
        if row.get("mix"):
            extra = "  weights " + " ".join(f"{w:.2f}" for w in row["mix"]["layer_weights"])
        print(f"{row['view']:<15}{100 * row['f1']:>7.1f}   {name:<40}{'' if f1 is None else f1:>6}{extra}")
    print(f"{'':<15}{'':>7}   {FINE_TUNE[0]:<40}{FINE_TUNE[1]:>6}")
    print(f"ours: {info['name']} ({info['num_layers']} layers, hidden {info['hidden_size']}), linear head "
          f"(logistic regression) on the first sub-token, {n_train} train sentences ({n_train_words} words)."
          "\npaper: BERT-base (12 layers, hidden 768, cased), two-layer BiLSTM head, document context."
          "\nThe encoders and heads differ: compare the ordering of views, not the absolute numbers.")


if __name__ == "__main__":
    raise SystemExit(main())

"""Extraction throughput against its peers (issue 2), same texts, same process.

On the first N AG News texts (1,000 by default), real (non-padding) tokens
per second of:

(a) ``layerbank``: ``layerbank.workers.extract.extract`` into a fresh ``FeatureStore``
    in a temp dir: every hidden state, mean/cls/max pooled, written to HDF5
    and committed (tokenizing, hashing keys and the catalog included);
(b) ``hf-loop``: a plain ``transformers.AutoModel`` loop, batches of 32 in
    file order, ``output_hidden_states=True``, mask-aware mean pooling of
    every hidden state, copied to the host;
(c) ``sentence-transformers``: ``SentenceTransformer(model_dir).encode(...,
    output_value="token_embeddings")`` (batch 32), the same model directory;
and issue 18's rows (fp32, CPU; bench/engine_peers.py):
(d) ``hf-sorted``: the plain loop with texts sorted by length first;
(e) ``layerbank onnx``: (a) with the ONNX Runtime engine (workers/engines/onnx.py);
(f) ``layerbank oneDNN``: (a) with every ``nn.Linear`` sent through oneDNN;
(g) ``layerbank compile``: (a) on ``torch.compile(dynamic=True)`` (``--no-compile`` skips it).
and issue 28's bf16 peers, when ``--precision`` names bf16:
(h) ``hf-sorted bf16``: (d) under ``torch.autocast("cpu", dtype=torch.bfloat16)``;
(i) ``sentence-transformers bf16``: (c) with its weights cast to bfloat16.
Their bound is the bf16 matrix product of the model's shapes (``bf16 matmul bound``).
Targets of issue 28: layerbank bf16 >= 1.2x (h) and >= 35% of the bf16 bound.
Targets of issue 18: (e)/(a) >= 1.8 and (e)/(d) >= 1.7. The fp32 compute bound
is taken against the fastest of torch's BLAS, oneDNN and ONNX Runtime on the
model's matrix shapes, each printed.

Targets: (a)/(b) >= 1.7 and (a)/(c) >= 1.1. The runs alternate (a b c a b c
...) and each keeps its best round, because the machine is shared. Also
printed: the fraction of the compute bound (real tokens x matrix FLOPs per
text, against the FLOP/s of a matrix product of the model's own shapes timed
in the same run), where the time of (a) goes (tokenize / forward+pool /
HDF5 write / rest), bytes stored per text, cached reads per second against
extraction per second, and the peak resident memory of a separate process
extracting 10,000 texts (target < 1.5 GiB; ``VmHWM``, see ``peak_rss_bytes``).

Run from the repository root::

    .venv/bin/python bench/extract.py                       # ~10 min on 2 busy cores
    .venv/bin/python bench/extract.py --rss-texts 0 --rounds 2
    python3 bench/extract.py --device cuda --precision fp32,bf16,fp16 --no-st \\
        --data bench/data/agnews_dev.tsv --model bench/data/minilm      # on a GPU

Writes bench/out/extract.json (``--json``).
"""

# isort: skip_file  (the order matters: workers must load before torch, see below)
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch
from common import (
    AGNEWS,
    ROOT,
    alternate,
    bert_flops_per_text,
    environment,
    load_model_path,
    matmul_flops_per_second,
    quiet_transformers,
    read_tsv,
    time_extraction,
    write_json,
)
from engine_peers import matmul_bounds, onednn_linear, sorted_loop_run

# repo modules before numpy/torch: importing workers sets the OpenMP and oneDNN
# defaults (workers/__init__.py), which only work before torch loads
from layerbank.cache.store import FeatureStore
from layerbank.workers.encoder import Encoder, set_threads
from layerbank.workers.extract import extract
from layerbank.workers.precision import autocast_dtype


def hf_loop_run(texts: list[str], model: Any, tok: Any, device: torch.device, precision: str,
                real_tokens: int, max_length: int) -> Callable[[], dict[str, Any]]:
    dtype = autocast_dtype(precision)

    @torch.inference_mode()
    def run() -> dict[str, Any]:
        c0, t0 = time.process_time(), time.perf_counter()
        for i in range(0, len(texts), 32):
            b = tok(texts[i:i + 32], padding=True, truncation=True, max_length=max_length,
                    return_tensors="pt").to(device)
            if dtype is None:
                out = model(**b, output_hidden_states=True)
            else:
                with torch.autocast(device.type, dtype=dtype):
                    out = model(**b, output_hidden_states=True)
            m = b["attention_mask"][:, :, None].float()
            pooled = torch.stack([(h.float() * m).sum(1) / m.sum(1) for h in out.hidden_states], 1)
            pooled.cpu()
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"tokens_per_second": real_tokens / dt, "seconds": dt, "tokens_per_cpu_second": real_tokens / cpu}
    return run


def st_run(texts: list[str], model_dir: str, device: torch.device, real_tokens: int,
           dtype: torch.dtype | None = None) -> Callable[[], dict[str, Any]]:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(model_dir, device=str(device))
    if dtype is not None:  # issue 28's peer: every weight in bfloat16, no autocast
        st.to(dtype)

    def run() -> dict[str, Any]:
        c0, t0 = time.process_time(), time.perf_counter()
        out = st.encode(texts, output_value="token_embeddings", batch_size=32, show_progress_bar=False)
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        got = sum(int(o.shape[0]) for o in out)
        return {"tokens_per_second": real_tokens / dt, "seconds": dt, "tokens_per_cpu_second": real_tokens / cpu,
                "tokens_returned": got}
    return run


def sorted_autocast_run(texts: list[str], model: Any, tok: Any, real_tokens: int, max_length: int,
                        dtype: torch.dtype) -> Callable[[], dict[str, Any]]:
    """(h): the length-sorted loop (bench/engine_peers.sorted_loop_run), batches of 32,
    under autocast; pooled in float32 like layerbank's rows."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    ordered = [texts[i] for i in order]

    @torch.inference_mode()
    def run() -> dict[str, Any]:
        c0, t0 = time.process_time(), time.perf_counter()
        for i in range(0, len(ordered), 32):
            b = tok(ordered[i:i + 32], padding=True, truncation=True, max_length=max_length,
                    return_tensors="pt")
            with torch.autocast("cpu", dtype=dtype):
                out = model(**b, output_hidden_states=True)
            m = b["attention_mask"][:, :, None].float()
            torch.stack([(h.float() * m).sum(1) / m.sum(1) for h in out.hidden_states], 1).numpy()
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"tokens_per_second": real_tokens / dt, "seconds": dt,
                "tokens_per_cpu_second": real_tokens / cpu}
    return run


def with_load(fn: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """``fn`` whose result also carries the 1-minute load average at its end (a shared machine)."""
    def run() -> dict[str, Any]:
        res = fn()
        res["load"] = os.getloadavg()[0]
        return res
    return run


def peak_rss_bytes() -> int:
    """This process's peak resident memory since its exec (``VmHWM``).

    Not ``getrusage().ru_maxrss``: Linux carries into it, at exec, the peak
    of the memory image the child was forked from, so a child started by
    this (large) benchmark process reported the parent's ~1.2 GiB, not its
    own ~0.85.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # not Linux


def rss_child(args: argparse.Namespace) -> None:
    """Extract ``--n`` texts in this fresh process; print peak RSS as JSON."""
    set_threads(args.threads)
    texts, _ = read_tsv(args.data, args.n)
    enc = Encoder.load(load_model_path(args.model), device=args.device,
                       precision=args.precision.split(",")[0])
    with tempfile.TemporaryDirectory() as d:
        store = FeatureStore(d)
        t0 = time.perf_counter()
        s = extract(texts, store, enc, job_id="rss", max_tokens=args.max_tokens)
        dt = time.perf_counter() - t0
        store.close()
    print(json.dumps({"texts": len(texts), "tokens": s.tokens_encoded, "seconds": dt,
                      "bytes_written": s.bytes_written, "shards": s.shards_written,
                      "peak_rss_bytes": peak_rss_bytes()}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(AGNEWS), help="TSV of text<TAB>label, no header")
    p.add_argument("--model", help="model directory (default: the bundled all-MiniLM-L6-v2)")
    p.add_argument("--n", type=int, default=1000, help="texts (the first N of the file)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", help="comma-separated: fp32,bf16,fp16")
    p.add_argument("--threads", type=int, help="torch threads (default: all usable cores)")
    p.add_argument("--max-tokens", type=int, help="token budget per batch (default: extract's)")
    p.add_argument("--rss-texts", type=int, default=10_000, help="texts for the memory run; 0: skip")
    p.add_argument("--no-st", action="store_true", help="skip sentence-transformers")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile row (compiles for ~20 s+)")
    p.add_argument("--no-peers", action="store_true", help="skip issue 18's rows (d)-(g)")
    p.add_argument("--json", default=str(ROOT / "bench" / "out" / "extract.json"))
    p.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rss_child:
        return rss_child(args)

    set_threads(args.threads)
    quiet_transformers()
    model_dir = load_model_path(args.model)
    device = torch.device(args.device)
    precisions = args.precision.split(",")
    texts, _ = read_tsv(args.data, args.n)
    encoders = {prec: Encoder.load(model_dir, device=args.device, precision=prec) for prec in precisions}
    enc0 = encoders[precisions[0]]
    lengths = enc0.tokenize(texts).lengths
    real = int(sum(lengths))
    cfg = enc0.model.config
    print(f"{len(texts)} texts from {args.data}, {real:,} real tokens (mean {real / len(texts):.1f}, "
          f"max {max(lengths)}); model {model_dir}")
    print("environment:", environment())

    from transformers import AutoModel, AutoTokenizer

    hf_kw: dict[str, Any] = {"attn_implementation": "sdpa"} if device.type == "cuda" else {}
    hf_model = AutoModel.from_pretrained(model_dir, **hf_kw).eval().to(device)
    hf_tok = AutoTokenizer.from_pretrained(model_dir)
    runs: dict[str, Callable[[], dict[str, Any]]] = {}
    for prec, enc in encoders.items():
        runs[f"layerbank {prec}"] = time_extraction(texts, enc, real, args.max_tokens)
        runs[f"hf-loop {prec}"] = hf_loop_run(texts, hf_model, hf_tok, device, prec, real,
                                              int(enc0.config.max_length or 512))
    if not args.no_st:
        runs["sentence-transformers fp32"] = st_run(texts, model_dir, device, real)
    if "bf16" in precisions and device.type == "cpu":  # issue 28's bf16 peers
        runs["hf-sorted bf16"] = sorted_autocast_run(texts, hf_model, hf_tok, real,
                                                     int(enc0.config.max_length or 512), torch.bfloat16)
        if not args.no_st:
            runs["sentence-transformers bf16"] = st_run(texts, model_dir, device, real, torch.bfloat16)
    compile_seconds = None
    if "fp32" in precisions and device.type == "cpu" and not args.no_peers:
        max_len = int(enc0.config.max_length or 512)
        runs["hf-sorted fp32"] = sorted_loop_run(texts, hf_model, hf_tok, real, max_len)
        onnx_dir = tempfile.mkdtemp(prefix="bench-onnx-")  # the export, as a data dir would keep it
        runs["layerbank onnx fp32"] = time_extraction(
            texts, Encoder.load(model_dir, device="cpu", precision="fp32", engine="onnx", data_dir=onnx_dir),
            real, args.max_tokens)
        dnn_enc = Encoder.load(model_dir, device="cpu", precision="fp32")
        dnn_inner = time_extraction(texts, dnn_enc, real, args.max_tokens)

        def dnn_run() -> dict[str, Any]:
            with onednn_linear(dnn_enc.model):
                return dnn_inner()
        runs["layerbank oneDNN fp32"] = dnn_run
        if not args.no_compile:
            comp_enc = Encoder.load(model_dir, device="cpu", precision="fp32")
            comp_enc.model = torch.compile(comp_enc.model, dynamic=True)
            t0 = time.perf_counter()
            comp_enc.encode(comp_enc.tokenize(texts[:8]))
            comp_enc.encode(comp_enc.tokenize(texts[8:40]))  # a second shape: the dynamic graph
            compile_seconds = time.perf_counter() - t0
            print(f"torch.compile(dynamic=True): {compile_seconds:.1f} s to compile before timing")
            runs["layerbank compile fp32"] = time_extraction(texts, comp_enc, real, args.max_tokens)

    # the compute bound, measured now: before the runs and after, best kept
    d, dff, n_layers = int(cfg.hidden_size), int(cfg.intermediate_size), int(cfg.num_hidden_layers)
    flops = sum(bert_flops_per_text(t, d, dff, n_layers) for t in lengths)
    peak: dict[str, float] = {}

    libraries: dict[str, float] = {}

    # every precision a row was run at (sentence-transformers fp32 runs whatever --precision says)
    bound_precs = list(dict.fromkeys(precisions + [name.rsplit(" ", 1)[1] for name in runs]))

    def measure_peak() -> None:
        for prec in bound_precs:
            dt = autocast_dtype(prec) or torch.float32
            f = matmul_flops_per_second(d, dff, device=args.device, dtype=dt)
            if prec == "fp32" and device.type == "cpu":  # the fastest library, not torch's BLAS alone
                for lib, v in matmul_bounds(d, dff).items():
                    libraries[lib] = max(libraries.get(lib, 0.0), v)
                f = max(f, *libraries.values())
            peak[prec] = max(peak.get(prec, 0.0), f)

    measure_peak()
    print(f"\nalternating runs, best of {args.rounds}:")
    best = alternate({k: with_load(fn) for k, fn in runs.items()}, args.rounds)
    measure_peak()

    if libraries:
        print("\nfp32 matrix products of the model's shapes, best of each library (GFLOP/s): " + ", ".join(
            f"{lib} {v / 1e9:,.0f}" for lib, v in libraries.items()) + "; the bound below uses the fastest")
    print("\nbf16 / fp32 matrix products of the model's shapes (GFLOP/s): " + ", ".join(
        f"{prec} {v / 1e9:,.0f}" for prec, v in peak.items()) + f"; load {os.getloadavg()[0]:.1f}")
    print("\nresults (real tokens per second, best round; vs layerbank = over layerbank fp32):")
    base_tps = best[f"layerbank {precisions[0]}"]["tokens_per_second"]
    for name, r in best.items():
        prec = name.rsplit(" ", 1)[1]
        bound = real / (flops / peak[prec])
        r["compute_bound_fraction"] = r["tokens_per_second"] / bound
        print(f"  {name:<28} {r['tokens_per_second']:>10,.0f} tok/s   {r['tokens_per_second'] / base_tps:5.2f}x   "
              f"{r['compute_bound_fraction']:.0%} of the {prec} matmul bound ({bound:,.0f} tok/s); "
              f"median {np.median(r['all']):,.0f}, load {r.get('load', 0):.1f}")
    ratios: dict[str, float] = {}
    for prec in precisions:
        a = best[f"layerbank {prec}"]["tokens_per_second"]
        ratios[f"layerbank/hf-loop {prec}"] = a / best[f"hf-loop {prec}"]["tokens_per_second"]
        if not args.no_st and prec == "fp32":
            ratios["layerbank/sentence-transformers fp32"] = (
                a / best["sentence-transformers fp32"]["tokens_per_second"])
    if "hf-sorted bf16" in best:  # issue 28's targets: >= 1.2, and >= 35% of the bf16 bound
        med = {k: float(np.median(best[k]["all"])) for k in best}
        ratios["layerbank/hf-sorted bf16"] = best["layerbank bf16"]["tokens_per_second"] / (
            best["hf-sorted bf16"]["tokens_per_second"])
        ratios["layerbank/hf-sorted bf16 (medians)"] = med["layerbank bf16"] / med["hf-sorted bf16"]
        if "sentence-transformers bf16" in best:
            ratios["layerbank/sentence-transformers bf16 (medians)"] = (
                med["layerbank bf16"] / med["sentence-transformers bf16"])
    if "layerbank onnx fp32" in best:  # issue 18's targets: >= 1.8 and >= 1.7
        onnx_tps = best["layerbank onnx fp32"]["tokens_per_second"]
        ratios["layerbank onnx/layerbank fp32"] = onnx_tps / best["layerbank fp32"]["tokens_per_second"]
        ratios["layerbank onnx/hf-sorted fp32"] = onnx_tps / best["hf-sorted fp32"]["tokens_per_second"]
    if len(precisions) > 1:
        base = best[f"layerbank {precisions[0]}"]["tokens_per_second"]
        for prec in precisions[1:]:
            ratios[f"layerbank {prec}/{precisions[0]}"] = best[f"layerbank {prec}"]["tokens_per_second"] / base
    # the same ratios on tokens per CPU-second (median of the rounds): the work
    # each one does, which time spent waiting for a shared CPU does not blur
    cpu_med = {name: float(np.median(r["cpu_all"])) for name, r in best.items()}
    cpu_ratios = {}
    for prec in precisions:
        cpu_ratios[f"layerbank/hf-loop {prec}"] = cpu_med[f"layerbank {prec}"] / cpu_med[f"hf-loop {prec}"]
    if "hf-sorted bf16" in cpu_med:
        cpu_ratios["layerbank/hf-sorted bf16"] = cpu_med["layerbank bf16"] / cpu_med["hf-sorted bf16"]
    if "layerbank onnx fp32" in cpu_med:
        cpu_ratios["layerbank onnx/layerbank fp32"] = cpu_med["layerbank onnx fp32"] / cpu_med["layerbank fp32"]
        cpu_ratios["layerbank onnx/hf-sorted fp32"] = cpu_med["layerbank onnx fp32"] / cpu_med["hf-sorted fp32"]
    if not args.no_st and "fp32" in precisions:
        cpu_ratios["layerbank/sentence-transformers fp32"] = (
            cpu_med["layerbank fp32"] / cpu_med["sentence-transformers fp32"])
    print("\nratios of the best rounds' tokens/s (targets: layerbank/hf-loop >= 1.7, "
          "layerbank/sentence-transformers >= 1.1, layerbank onnx/layerbank fp32 >= 1.8, "
          "layerbank onnx/hf-sorted >= 1.7), and of the median tokens per CPU-second:")
    for k, v in ratios.items():
        extra = f"   per CPU-second {cpu_ratios[k]:.2f}" if k in cpu_ratios else ""
        print(f"  {k:<40} {v:.2f}{extra}")
    print()
    for prec in precisions:
        print(f"layerbank {prec}: where the time goes: " + ", ".join(
            f"{k[6:]} {v:.0%}" for k, v in best[f"layerbank {prec}"].items() if k.startswith("share_")))
    a = best[f"layerbank {precisions[0]}"]
    print(f"bytes stored per text: {a['bytes_per_text']:,.0f} "
          f"({enc0.config.storage_dtype}, 3 poolings x {n_layers + 1} hidden states x {d})")
    print(f"cached reads: {a['cached_reads_per_second']:,.0f} texts/s (all hidden states, mean) vs "
          f"extraction {a['texts_per_second']:,.1f} texts/s: "
          f"{a['cached_reads_per_second'] / a['texts_per_second']:,.0f}x")

    rss: dict[str, Any] | None = None
    if args.rss_texts:
        cmd = [sys.executable, __file__, "--rss-child", "--n", str(args.rss_texts), "--data", args.data,
               "--device", args.device, "--precision", precisions[0]]
        if args.model:
            cmd += ["--model", args.model]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        if args.max_tokens:
            cmd += ["--max-tokens", str(args.max_tokens)]
        print(f"\npeak memory: extracting {args.rss_texts:,} texts in a fresh process ...", flush=True)
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
        if out.returncode != 0:
            print(out.stderr[-3000:])
            raise SystemExit("the memory run failed")
        rss = json.loads(out.stdout.strip().splitlines()[-1])
        gib = rss["peak_rss_bytes"] / 2**30
        print(f"  peak RSS {gib:.2f} GiB (target < 1.5 GiB) for {rss['texts']:,} texts, "
              f"{rss['tokens']:,} tokens in {rss['seconds']:.0f} s "
              f"({rss['tokens'] / rss['seconds']:,.0f} tok/s), {rss['shards']} shards")
    write_json(args.json, {"texts": len(texts), "real_tokens": real, "environment": environment(),
                           "flops": flops, "matmul_flops_per_second": peak, "best": best,
                           "matmul_flops_per_second_fp32_by_library": libraries,
                           "compile_seconds": compile_seconds,
                           "ratios": ratios, "cpu_second_ratios": cpu_ratios, "rss": rss, "data": args.data, "model": model_dir,
                           "lengths_mean": float(np.mean(lengths))})


if __name__ == "__main__":
    main()

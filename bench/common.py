"""Helpers shared by the extraction benchmarks (bench/extract.py, bench/precision.py).

The machine these run on is usually shared, so every figure is taken as the
best of several runs that alternate between the things compared (A B C A B C
...), and ratios are taken between the best runs. ``Timer`` sums the wall
time of named stages across calls (tokenize, forward, write) by wrapping
methods, so the benchmark needs no hooks in the code it measures.

Example::

    texts, labels = read_tsv(AGNEWS, 1000)
    best = alternate({"a": run_a, "b": run_b}, rounds=3)   # name -> best result
"""

from __future__ import annotations

import csv
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub: the models are local
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

SHARED = ROOT.parent / "shared" / "data"
AGNEWS = SHARED / "agnews" / "dev.tsv"
SST2_TEST = SHARED / "sst2" / "test.tsv"

__all__ = [
    "AGNEWS",
    "ROOT",
    "SHARED",
    "SST2_TEST",
    "Timer",
    "alternate",
    "bert_flops_per_text",
    "environment",
    "load_model_path",
    "matmul_flops_per_second",
    "quiet_transformers",
    "read_tsv",
    "require_data",
    "save_tiny_bert",
    "time_extraction",
    "write_json",
]


def require_data(path: str | os.PathLike[str]) -> Path:
    """``path`` if it exists; else one line on stderr and exit status 2.

    The benchmarks' full-size data sets sit beside the repository on the
    development machines (``../shared/data``); a clone does not have them
    (the tests read the small subsets in tests/data/ instead), and a
    traceback would not say so."""
    p = Path(path)
    if not p.exists():
        where = "the full data sets in ../shared/data, beside the repository" if SHARED in p.parents else "it"
        print(f"{Path(sys.argv[0]).name}: {p} not found: this benchmark needs {where} "
              "(tests/data/ holds only the small subsets the tests use; see tests/data/README.md)",
              file=sys.stderr)
        raise SystemExit(2)
    return p


def read_tsv(path: str | os.PathLike[str], n: int | None = None, header: bool = False,
             skip: int = 0) -> tuple[list[str], list[str]]:
    """``text<TAB>label`` rows (unquoted TSV), the first ``n`` after ``skip``."""
    texts: list[str] = []
    labels: list[str] = []
    with open(require_data(path), encoding="utf-8", newline="") as f:
        rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        if header:
            next(rows)
        for i, row in enumerate(rows):
            if i < skip:
                continue
            if n is not None and len(texts) >= n:
                break
            texts.append(row[0])
            labels.append(row[1] if len(row) > 1 else "")
    return texts, labels


def load_model_path(arg: str | None) -> str:
    """The model directory: ``arg`` if given, else the bundled all-MiniLM-L6-v2."""
    if arg:
        return arg
    from layerbank.cache.fingerprint import default_model_path

    return str(default_model_path())


def quiet_transformers() -> None:
    """No weight-loading progress bars: they would run into the printed figures."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def time_extraction(texts: list[str], enc: Any, real_tokens: int, max_tokens: int | None = None,
                    keep: dict[str, Any] | None = None) -> Callable[[], dict[str, Any]]:
    """A run of ``layerbank.workers.extract.extract`` into a fresh store in a temp dir.

    Returns tokens/s (real tokens), texts/s, bytes per text, cached reads
    per second (every hidden state, mean pooling, read back three times,
    best kept) and the share of wall time in tokenize / forward_pool /
    hdf5_write / rest. ``keep``: if given, ``keep["rows"]`` gets the stored
    rows of every pooling, as read back (float32 from the storage dtype).
    """
    import tempfile

    from layerbank.cache.shard import POOLINGS
    from layerbank.cache.store import FeatureStore
    from layerbank.workers.extract import extract

    def run() -> dict[str, Any]:
        timer = Timer()
        with tempfile.TemporaryDirectory() as d:
            store = FeatureStore(d)
            timer.wrap(enc, "tokenize", "tokenize")
            timer.wrap(enc, "encode", "forward_pool")
            timer.wrap(store, "write", "hdf5_write")
            kw: dict[str, Any] = {} if max_tokens is None else {"max_tokens": max_tokens}
            try:
                c0, t0 = time.process_time(), time.perf_counter()
                s = extract(texts, store, enc, job_id="bench", **kw)
                dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            finally:
                timer.unwrap(enc, "tokenize")
                timer.unwrap(enc, "encode")
            reads = []
            for _ in range(3):
                r0 = time.perf_counter()
                res = store.read_pooled(s.keys, "mean")
                reads.append(time.perf_counter() - r0)
            if not res.found.all() or s.tokens_encoded != real_tokens:
                raise RuntimeError(f"extraction stored {s.tokens_encoded} tokens, expected {real_tokens}")
            if keep is not None:
                keep["rows"] = {p: store.read_pooled(s.keys, p).data for p in POOLINGS}
            store.close()
        out: dict[str, Any] = {"tokens_per_second": real_tokens / dt, "seconds": dt,
                               "tokens_per_cpu_second": real_tokens / cpu,
                               "texts_per_second": len(texts) / dt,
                               "cached_reads_per_second": len(texts) / min(reads),
                               "bytes_per_text": s.bytes_written / len(texts)}
        out.update({f"share_{k}": v / dt for k, v in timer.seconds.items()})
        out["share_rest"] = 1.0 - sum(timer.seconds.values()) / dt
        return out
    return run


def alternate(runs: dict[str, Callable[[], dict[str, float]]], rounds: int,
              key: str = "tokens_per_second", log: Callable[[str], None] = print
              ) -> dict[str, dict[str, Any]]:
    """Run each entry once per round, in turn; keep each one's best round by ``key``.

    Returns name -> the best run's dict, plus ``all``: every round's ``key``,
    and ``cpu_all``: every round's tokens per CPU-second (process time of all
    threads), a measure of work that waiting for a shared CPU does not inflate.
    """
    best: dict[str, dict[str, Any]] = {}
    for r in range(rounds):
        for name, fn in runs.items():
            res = fn()
            log(f"  round {r + 1}  {name:<28} {res[key]:>10,.0f} {key}  ({res.get('seconds', 0):.1f} s, "
                f"{res.get('tokens_per_cpu_second', 0):,.0f} per CPU-second)")
            prev = best.get(name)
            seen = (prev or {}).get("all", []) + [res[key]]
            cpu = (prev or {}).get("cpu_all", []) + [res.get("tokens_per_cpu_second", 0.0)]
            if prev is None or res[key] > prev[key]:
                best[name] = dict(res)
            best[name]["all"] = seen
            best[name]["cpu_all"] = cpu
    return best


class Timer:
    """Wall seconds per stage, summed over calls of wrapped methods.

    ``timer.wrap(obj, "encode", "forward")`` replaces ``obj.encode`` (on the
    instance only) by a timed call; ``timer.seconds["forward"]`` adds up.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, obj: Any, method: str, stage: str) -> None:
        real = getattr(obj, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - t0

        setattr(obj, method, timed)

    def unwrap(self, obj: Any, method: str) -> None:
        obj.__dict__.pop(method, None)


def environment() -> dict[str, Any]:
    """What the figures depend on: versions, threads, load."""
    import torch
    import transformers

    env: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(unset)"),
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
        "loadavg_1min": round(os.getloadavg()[0], 2),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
    return env


def write_json(path: str | os.PathLike[str] | None, data: dict[str, Any]) -> None:
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2, default=str) + "\n")
    print(f"wrote {path}")


def bert_flops_per_text(n_tokens: int, hidden: int, intermediate: int, layers: int) -> float:
    """Multiply-adds x 2 of one BERT forward over ``n_tokens`` real tokens.

    Per layer and token: Q, K, V and output projections (4 d^2), the two
    feed-forward matrices (2 d d_ff), and attention scores and weighted sum
    (2 t d, t the text's own length). Embedding lookups, layer norms, GELU
    and softmax are left out: they are not matrix work.
    """
    per_token = 4 * hidden * hidden + 2 * hidden * intermediate + 2 * n_tokens * hidden
    return 2.0 * layers * n_tokens * per_token


def matmul_flops_per_second(hidden: int, intermediate: int, tokens: int = 2048,
                            device: str = "cpu", dtype: Any = None, repeats: int = 5) -> float:
    """Best FLOP/s of the model's own matrix shapes: [tokens, d] x [d, d_ff],
    [tokens, d_ff] x [d_ff, d] and [tokens, d] x [d, d] (one layer's linear
    work, in the same proportions), timed here and now."""
    import torch

    dtype = dtype or torch.float32
    dev = torch.device(device)
    x = torch.randn(tokens, hidden, device=dev, dtype=dtype)
    h = torch.randn(tokens, intermediate, device=dev, dtype=dtype)
    w_up = torch.randn(hidden, intermediate, device=dev, dtype=dtype)
    w_down = torch.randn(intermediate, hidden, device=dev, dtype=dtype)
    w_sq = torch.randn(hidden, hidden, device=dev, dtype=dtype)
    flops = 2.0 * tokens * (2 * hidden * intermediate + 4 * hidden * hidden)

    def once() -> None:
        x @ w_up
        h @ w_down
        for _ in range(4):
            x @ w_sq

    best = float("inf")
    with torch.inference_mode():
        once()
        for _ in range(repeats):
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            once()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
    return flops / best


def save_tiny_bert(out: str | os.PathLike[str], *, seed: int = 0, hidden: int = 32, layers: int = 2,
                   max_positions: int = 128) -> str:
    """A random ``BertModel`` with the bundled model's tokenizer, saved to ``out``: an encoder
    so small that what a benchmark measures is the store and the server, not the forward pass.

    The same recipe as the tests' builder (tests/tiny_models.py), copied: benchmarks never
    import from tests/."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from layerbank.cache.fingerprint import default_model_path

    tok = AutoTokenizer.from_pretrained(default_model_path(), use_fast=True)
    config = BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=37, vocab_size=len(tok), max_position_embeddings=max_positions)
    torch.manual_seed(seed)
    BertModel(config).eval().save_pretrained(out)
    tok.save_pretrained(out)
    return os.fspath(out)

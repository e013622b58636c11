"""What a store costs as it grows to a million texts (issue 28 item 4).

One data directory grows through ``--sizes`` (default 10^4, 10^5, 10^6 texts)
of a tiny random BERT's rows (2 layers, 32 wide: the encoder is not the
cost here, the store and the server are). At each
size it prints one block:

- extraction tokens/s of ``--extract`` new texts (default 5,000) encoded by
  ``layerbank extract`` into the store as it stands (the CLI's own figure, and
  its wall time); the rest of each size is stored without the encoder, as
  random rows under the keys the encoder's would have, written and committed
  through ``FeatureStore.write`` as the worker does (on 2 busy cores the tiny
  model encodes ~50-100 texts/s, so 10^6 encoded texts would take hours);
- the catalog check ``serve`` runs before it binds (SQLite ``quick_check``), seconds;
- server start: ``layerbank serve`` on the directory, seconds until ``/ready``
  first answers, whatever its status (the API), and until it lists a worker (cached reads answer),
  with the pinned flags below (the torch engine) and again on the defaults
  (engine and precision by measurement; the first such start, which measures,
  is timed apart), each with the engine the worker says it runs;
- cached one-text ``POST /v1/features`` of a row in memory (the row cache):
  p50 / p99 and req/s at 1 and 16 clients, bench/serve.py's raw keep-alive
  socket client, and the API process's CPU time per request (on a shared
  machine latency swells with the wait for a core; CPU time much less);
- cached reads of stored texts not in memory (each a different text, drawn
  over the whole store, one client): p50 / p99, req/s and API CPU per
  request, each answer checked to be a hit;
- resident memory (VmRSS) of the API process and of its worker, after those reads;
- catalog size (``catalog.sqlite`` with its WAL) and bytes per text (shards,
  catalog);
- micro-batch commits: 64 small shards (16 rows each, what one-text misses
  write) written through ``FeatureStore.write``, ms per commit; then
  ``cache/compact.py`` ``compact`` merging them (seconds);
- ``layerbank repair --force`` (catalog rebuilt from every shard), seconds.

Targets: store-read and in-memory p50 at the largest size within 1.5x of the
smallest, start under 5 s, memory not growing with the store beyond the
configured caches. The last lines compare the largest size with the first.

Run from the repository root::

    .venv/bin/python bench/scale.py --sizes 10000,100000        # ~5 min on 2 busy cores
    .venv/bin/python bench/scale.py                              # 10^6 too: ~1 h
    .venv/bin/python bench/scale.py --dir /tmp/lb-scale --json bench/results/scale.json
    .venv/bin/python bench/scale.py --dir /tmp/lb-scale --reuse    # measure that store again, no refill

Texts are random words of the bundled tokenizer's vocabulary (seeded, 4-24
words), so no data set is needed and every text is new.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import ROOT, save_tiny_bert, write_json  # bench/ is the script directory
from serve import _drive_raw, _raw_request, pct
from serve_replicas import _read_response

# the flags both `extract` and `serve` get, so that their keys agree
_MODEL_FLAGS = ["--precision", "fp32", "--engine", "torch", "--storage-dtype", "float16"]
_DEFAULT_FLAGS = ["--storage-dtype", "float16"]  # engine and precision left to measurement
_SMALL_SHARDS, _SMALL_ROWS = 64, 16


def _env(threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYERBANK_")}
    env.update(LAYERBANK_THREADS=str(threads), LAYERBANK_LOG_LEVEL="WARNING", HF_HUB_OFFLINE="1")
    return env


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "layerbank.app.cli.main", *args]


def make_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` texts of 4-24 random whole words from the bundled tokenizer's vocabulary."""
    from layerbank.cache.fingerprint import default_model_path

    vocab = [w.strip() for w in (Path(default_model_path()) / "vocab.txt").read_text(encoding="utf-8").splitlines()]
    words = np.array([w for w in vocab if w.isalpha() and w.isascii()])
    rng = np.random.default_rng(seed)
    lengths = rng.integers(4, 25, size=n)
    picks = rng.integers(0, len(words), size=int(lengths.sum()))
    out, at = [], 0
    for k in lengths:
        out.append(" ".join(words[picks[at: at + k]]))
        at += k
    return out


def fill(data_dir: Path, texts: list[str], seed: int, part: int = 2048) -> float:
    """Store ``texts`` without the encoder: shards of ``part`` random rows under the keys the
    encoder's rows would have (model and config of a shard ``extract`` wrote), written and
    committed through ``FeatureStore.write``, as the worker does. Returns seconds."""
    from layerbank.cache.keys import ExtractionConfig
    from layerbank.cache.lock import DataDirLock
    from layerbank.cache.shard import ShardContents
    from layerbank.cache.store import FeatureStore

    t0 = time.perf_counter()
    lock = DataDirLock(data_dir).acquire()
    store = FeatureStore(data_dir)
    try:
        name = sorted(store.catalog.shard_names())[0]
        info = store.catalog.shard_info(name)
        assert info is not None
        h, d = store._reader(name).read_pooled(np.array([0]), "mean").shape[1:]  # noqa: SLF001
        cfg = ExtractionConfig.from_json(info["config"])
        rng = np.random.default_rng(seed)
        for at in range(0, len(texts), part):
            chunk = texts[at: at + part]
            keys = [store.key(info["model"], cfg, t) for t in chunk]
            pooled = {p: rng.standard_normal((len(chunk), h, d), dtype=np.float32) for p in info["poolings"]}
            n_tokens = np.array([t.count(" ") + 3 for t in chunk])
            store.write(f"scale-fill-{seed}-{at // part:05d}", ShardContents(
                keys, n_tokens, np.zeros(len(chunk), bool), pooled), model=info["model"], config=cfg)
    finally:
        store.close()
        lock.release()
    return time.perf_counter() - t0


def extract(data_dir: Path, model: str, texts: list[str], threads: int) -> dict[str, float]:
    """``layerbank extract`` of ``texts`` into ``data_dir``: its tokens/s and wall seconds."""
    f = data_dir.parent / "add.txt"
    f.write_text("\n".join(texts) + "\n", encoding="utf-8")
    t0 = time.perf_counter()
    r = subprocess.run(_cli("extract", "--data-dir", str(data_dir), "--model", model, *_MODEL_FLAGS,
                            "--no-progress", str(f)), cwd=ROOT, env=_env(threads), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    f.unlink()
    if r.returncode != 0:
        raise SystemExit(f"extract failed ({r.returncode}):\n{r.stderr[-3000:]}")
    m = re.search(r"encoded\s+(\d+) texts, (\d+) tokens \(([\d,.]+) tokens/s\)", r.stdout)
    if m is None:
        raise SystemExit(f"no 'encoded' line in:\n{r.stdout}")
    return {"texts": int(m[1]), "tokens": int(m[2]), "tokens_per_s": float(m[3].replace(",", "")),
            "wall_s": wall}


class Serving:
    """``layerbank serve`` on the directory, timed from the process start."""

    def __init__(self, data_dir: Path, model: str, threads: int, flags: list[str] = _MODEL_FLAGS) -> None:
        self.data_dir = data_dir
        (data_dir / "server.json").unlink(missing_ok=True)
        self.log = open(data_dir.parent / "serve.log", "ab")
        self.log_from = self.log.tell()
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(_cli("serve", "--data-dir", str(data_dir), "--port", "0", "--model", model,
                                          *flags), cwd=ROOT, env=_env(threads),
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.port = 0
        self.api_s = self.ready_s = 0.0
        self.worker_pid = 0
        deadline = t0 + 300
        while not self.ready_s:
            if self.proc.poll() is not None or time.perf_counter() > deadline:
                raise SystemExit(f"server did not start: {(data_dir.parent / 'serve.log').read_text()[-2000:]}")
            try:
                if not self.port:
                    meta = json.loads((data_dir / "server.json").read_text())
                    self.port = int(meta["port"]) if meta["pid"] == self.proc.pid else 0
                if self.port:
                    status, body = self.call("GET", "/ready")
                    if not self.api_s:
                        self.api_s = time.perf_counter() - t0
                    workers = json.loads(body).get("workers", [])
                    if status == 200 and workers:
                        self.ready_s = time.perf_counter() - t0
                        self.worker_pid = int(workers[0]["pid"])
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.02)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        data = b"" if body is None else json.dumps(body).encode()
        with socket.create_connection(("127.0.0.1", self.port), timeout=60) as s:
            s.sendall(b"%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (method.encode(), path.encode(), len(data), data))
            status, out, _ = _read_response(s, b"")
        return status, out

    def engine(self) -> str:
        """What the worker said it runs on ("engine onnx (...), precision fp32"), from this start's log."""
        with open(self.data_dir.parent / "serve.log", "rb") as f:
            f.seek(self.log_from)
            said = re.findall(rb"layerbank worker: (engine [^\n]*)", f.read())
        return said[-1].decode() if said else "engine not logged"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()


def default_starts(data_dir: Path, model: str, threads: int) -> dict[str, float]:
    """``serve`` as a user starts it: engine and precision by measurement (docs/decisions.md).

    The first such start on a directory measures both and checks the ONNX export; it is timed
    apart. Every later one finds those decisions and, when they are ONNX at fp32, serves on the
    checked export without importing transformers' modeling code (workers/quick_start.py).
    Its keys differ from the pinned flags' rows, so only the start and the worker's memory are read.
    """
    res: dict[str, float] = {}
    if not any((data_dir / "engines").glob("*/*.onnx")):
        srv = Serving(data_dir, model, threads, flags=_DEFAULT_FLAGS)
        srv.stop()  # the child wrote its log; `engine` reads the file, not the closed handle
        res["start_first_default_ready_s"] = srv.ready_s
        print(f"  first start on defaults (measures engine and precision, exports ONNX): /ready after "
              f"{srv.ready_s:.2f} s; {srv.engine()}", flush=True)
    srv = Serving(data_dir, model, threads, flags=_DEFAULT_FLAGS)
    try:
        res.update(start_default_api_s=srv.api_s, start_default_ready_s=srv.ready_s,
                   rss_worker_default_mb=rss_mb(srv.worker_pid))
        print(f"  start on defaults: API answers after {srv.api_s:.2f} s, /ready after {srv.ready_s:.2f} s, "
              f"worker {res['rss_worker_default_mb']:.0f} MB; {srv.engine()}", flush=True)
    finally:
        srv.stop()
    return res


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used: on a shared machine a request's cost
    in CPU does not swell with the time it waits for a core, as its latency does."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def store_reads(port: int, texts: list[str]) -> dict[str, float]:
    """One keep-alive socket, one request per text (each text once: never in memory before)."""
    reqs = [_raw_request("/v1/features", {"texts": [t]}) for t in texts]
    lat = []
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        t_all = time.perf_counter()
        for req in reqs:
            t0 = time.perf_counter()
            s.sendall(req)
            status, body, buf = _read_response(s, buf)
            lat.append(time.perf_counter() - t0)
            if status != 200 or b'"cache_hits":1' not in body:
                raise SystemExit(f"a stored text was not a cached read: HTTP {status} {body[-300:]!r}")
        wall = time.perf_counter() - t_all
    return {"p50": pct(lat, 50) * 1e3, "p99": pct(lat, 99) * 1e3, "rps": len(lat) / wall}


def small_shards_and_compact(data_dir: Path) -> dict[str, float]:
    """What one-text misses cost the catalog at this size: 64 small shards written and committed
    (ms each), then compacted into one (s). Holds the data directory's lock, as a CLI writer must."""
    from layerbank.cache.compact import compact
    from layerbank.cache.keys import ExtractionConfig
    from layerbank.cache.lock import DataDirLock
    from layerbank.cache.shard import ShardContents
    from layerbank.cache.store import FeatureStore

    lock = DataDirLock(data_dir).acquire()
    store = FeatureStore(data_dir)
    try:
        name = next(iter(sorted(store.catalog.shard_names())))
        info = store.catalog.shard_info(name)
        assert info is not None
        reader = store._reader(name)  # noqa: SLF001  (the shape of a stored row)
        h, d = reader.read_pooled(np.array([0]), "mean").shape[1:]
        cfg = ExtractionConfig.from_json(info["config"])
        rng = np.random.default_rng(1)
        commits = []
        for i in range(_SMALL_SHARDS):
            keys = [store.key(info["model"], cfg, f"scale small shard {i} {j} {random.random()}")
                    for j in range(_SMALL_ROWS)]
            pooled = {p: rng.standard_normal((_SMALL_ROWS, h, d)).astype(np.float32) for p in info["poolings"]}
            contents = ShardContents(keys, np.full(_SMALL_ROWS, 5), np.zeros(_SMALL_ROWS, bool), pooled)
            t0 = time.perf_counter()
            store.write(f"scale-small-{time.time_ns():x}-{i:03d}", contents, model=info["model"], config=cfg)
            commits.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        s = compact(store, max_rows=256)
        seconds = time.perf_counter() - t0
        if s.shards_merged < _SMALL_SHARDS:
            raise SystemExit(f"compaction merged {s.shards_merged} shards, expected {_SMALL_SHARDS}")
        return {"small_commit_ms": statistics.median(commits) * 1e3, "compact_s": seconds,
                "compact_rows": s.rows}
    finally:
        store.close()
        lock.release()


def repair(data_dir: Path) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(_cli("repair", "--data-dir", str(data_dir), "--force"), cwd=ROOT, env=_env(1),
                       capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"repair failed:\n{r.stderr[-2000:]}")
    for aside in data_dir.glob("catalog.sqlite.damaged-*"):  # the old file, kept by repair: ours to drop
        aside.unlink()
    return seconds


def measure(data_dir: Path, model: str, texts: list[str], args: argparse.Namespace) -> dict[str, float]:
    from layerbank.cache.repair import check_catalog

    res: dict[str, float] = {}
    t0 = time.perf_counter()
    problem = check_catalog(data_dir / "catalog.sqlite")
    res["catalog_check_s"] = time.perf_counter() - t0
    print(f"  catalog check (SQLite quick_check, what serve runs beside its imports, before it binds): "
          f"{res['catalog_check_s']:.2f} s"
          f"{'' if problem is None else ' ' + problem}", flush=True)
    srv = Serving(data_dir, model, args.threads)
    try:
        res.update(start_api_s=srv.api_s, start_ready_s=srv.ready_s)
        print(f"  start ({' '.join(_MODEL_FLAGS[:4])}): API answers after {srv.api_s:.2f} s, /ready (worker "
              f"loaded) after {srv.ready_s:.2f} s; {srv.engine()}", flush=True)
        hot = {"texts": [texts[0]]}
        for _ in range(2):  # read from the store, then from memory
            status, body = srv.call("POST", "/v1/features", hot)
            if status != 200 or b'"cache_hits":1' not in body:
                raise SystemExit(f"the first stored text is not a cached read: {status} {body[-300:]!r}")
        req = _raw_request("/v1/features", hot)
        for c in (1, 16):
            runs = []
            for _ in range(args.rounds):
                c0 = cpu_s(srv.proc.pid)
                r = _drive_raw(srv.port, req, c, 1 if c == 1 else args.client_procs, args.seconds)
                r["cpu_ms"] = (cpu_s(srv.proc.pid) - c0) * 1e3 / max(1.0, r["rps"] * args.seconds)
                runs.append(r)
            m = {k: statistics.median(r[k] for r in runs) for k in ("p50", "p99", "rps", "cpu_ms")}
            res.update({f"memory_c{c}_p50_ms": m["p50"], f"memory_c{c}_p99_ms": m["p99"],
                        f"memory_c{c}_rps": m["rps"], f"memory_c{c}_api_cpu_ms": m["cpu_ms"]})
            print(f"  cached read, row in memory, {c:2d} client(s): p50 {m['p50']:.3f} ms  p99 {m['p99']:.3f} ms  "
                  f"{m['rps']:,.0f} req/s; API CPU {m['cpu_ms']:.3f} ms per request (load {os.getloadavg()[0]:.1f})",
                  flush=True)
        picks = random.Random(len(texts)).sample(range(1, len(texts)), min(args.store_reads, len(texts) - 1))
        c0 = cpu_s(srv.proc.pid)
        m = store_reads(srv.port, [texts[i] for i in picks])
        m["cpu_ms"] = (cpu_s(srv.proc.pid) - c0) * 1e3 / len(picks)
        res.update(store_p50_ms=m["p50"], store_p99_ms=m["p99"], store_rps=m["rps"], store_api_cpu_ms=m["cpu_ms"])
        print(f"  cached read, row from the store ({len(picks)} texts drawn over all {len(texts):,}), 1 client: "
              f"p50 {m['p50']:.3f} ms  p99 {m['p99']:.3f} ms  {m['rps']:,.0f} req/s; API CPU {m['cpu_ms']:.3f} ms "
              f"per request (load {os.getloadavg()[0]:.1f})", flush=True)
        res.update(rss_api_mb=rss_mb(srv.proc.pid), rss_worker_mb=rss_mb(srv.worker_pid))
        print(f"  resident memory: API {res['rss_api_mb']:.0f} MB, worker {res['rss_worker_mb']:.0f} MB", flush=True)
    finally:
        srv.stop()
    res.update(default_starts(data_dir, model, args.threads))
    cat = sum(p.stat().st_size for p in data_dir.glob("catalog.sqlite*") if "damaged" not in p.name)
    shards = sum(p.stat().st_size for p in (data_dir / "shards").glob("*.h5"))
    n_shards = len(list((data_dir / "shards").glob("*.h5")))
    res.update(catalog_mb=cat / 1e6, catalog_bytes_per_text=cat / len(texts),
               shard_bytes_per_text=shards / len(texts), shards=n_shards)
    print(f"  catalog {cat / 1e6:.1f} MB ({cat / len(texts):.0f} B/text); shards {shards / 1e6:.1f} MB in "
          f"{n_shards} files ({shards / len(texts):.0f} B/text); {(cat + shards) / len(texts):.0f} B/text in all",
          flush=True)
    res.update(small_shards_and_compact(data_dir))
    print(f"  {_SMALL_SHARDS} small shards of {_SMALL_ROWS} rows: {res['small_commit_ms']:.1f} ms per write+commit "
          f"(median); compaction of them {res['compact_s']:.2f} s", flush=True)
    res["repair_s"] = repair(data_dir)
    print(f"  layerbank repair --force: {res['repair_s']:.1f} s", flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000,1000000", help="store sizes, ascending, comma-separated")
    ap.add_argument("--dir", type=Path, default=None, help="work directory (kept); default a temp dir (removed)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of extract and the worker")
    ap.add_argument("--seconds", type=float, default=2.0, help="seconds per measured window (reads in memory)")
    ap.add_argument("--rounds", type=int, default=3, help="windows per figure, median kept")
    ap.add_argument("--client-procs", type=int, default=4, help="processes the 16 clients are spread over")
    ap.add_argument("--store-reads", type=int, default=1000, help="distinct stored texts read per size")
    ap.add_argument("--extract", type=int, default=5000,
                    help="texts encoded through `layerbank extract` at each size; the rest of the store "
                         "is filled with random rows under the same keys (the encoder is not the cost here)")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--reuse", action="store_true",
                    help="with --dir: sizes an earlier run there already stored are measured again without "
                         "extracting or filling (the 10^6 fill takes minutes); the rest grow as usual")
    args = ap.parse_args()
    if args.reuse and args.dir is None:
        raise SystemExit("--reuse needs --dir (the work directory of an earlier run)")
    sizes = [int(s) for s in args.sizes.split(",")]
    if sizes != sorted(sizes):
        raise SystemExit("--sizes must ascend: one directory grows through them")
    work = args.dir or Path(tempfile.mkdtemp(prefix="layerbank-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    data_dir = work / "data"
    print(f"layerbank scale benchmark: sizes {sizes}; {os.cpu_count()} CPUs, load "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; work dir {work}", flush=True)
    model = str(work / "model")
    if not (work / "model" / "config.json").exists():
        save_tiny_bert(model)
    texts = make_texts(sizes[-1])
    out: dict[str, Any] = {"sizes": {}, "cpus": os.cpu_count()}
    filled = work / "filled.json"  # texts[:n] are in the store: what --reuse may skip
    stored = json.loads(filled.read_text())["stored"] if args.reuse and filled.exists() else 0
    if not args.reuse:
        filled.unlink(missing_ok=True)
    try:
        for size in sizes:
            print(f"\n== {size:,} texts", flush=True)
            if size <= stored:
                print(f"  reused: the store holds the first {stored:,} texts from an earlier run (--reuse)",
                      flush=True)
                res = {"extract_tokens_per_s": float("nan"), "extract_wall_s": float("nan")}
                res.update(measure(data_dir, model, texts[:size], args))
                res["load"] = os.getloadavg()[0]
                out["sizes"][size] = res
                write_json(args.json, out)
                continue
            # the encoder's share: --extract new texts through the CLI, into a store of `stored`
            n_new = min(args.extract, size - stored)
            e = extract(data_dir, model, texts[stored: stored + n_new], args.threads)
            print(f"  extraction of {e['texts']:,} new texts into a store of {stored:,}: "
                  f"{e['tokens_per_s']:,.0f} tokens/s ({e['tokens']:,} tokens; {e['wall_s']:.1f} s wall "
                  "with the CLI's start)", flush=True)
            if size > stored + n_new:
                sec = fill(data_dir, texts[stored + n_new: size], seed=size)
                print(f"  {size - stored - n_new:,} more texts stored without the encoder (random rows): "
                      f"{sec:.1f} s", flush=True)
            stored = size
            filled.write_text(json.dumps({"stored": stored}))
            res = {"extract_tokens_per_s": e["tokens_per_s"], "extract_wall_s": e["wall_s"]}
            res.update(measure(data_dir, model, texts[:size], args))
            res["load"] = os.getloadavg()[0]
            out["sizes"][size] = res
            write_json(args.json, out)
        first, last = out["sizes"][sizes[0]], out["sizes"][sizes[-1]]
        if len(sizes) > 1:
            print(f"\n{sizes[-1]:,} vs {sizes[0]:,} texts:")
            for k in ("memory_c1_p50_ms", "memory_c1_api_cpu_ms", "memory_c16_rps", "store_p50_ms",
                      "store_api_cpu_ms", "start_api_s", "start_ready_s", "start_default_ready_s",
                      "catalog_check_s", "rss_api_mb",
                      "rss_worker_mb", "small_commit_ms", "compact_s", "repair_s", "catalog_bytes_per_text"):
                print(f"  {k:24s} {first[k]:10.2f} -> {last[k]:10.2f}  ({last[k] / first[k]:.2f}x)")
        print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

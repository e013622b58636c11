"""Benchmark of the HTTP service: a real ``layerbank serve`` process on
loopback (bundled model), driven from this process (the load generator) with
keep-alive connections, one per client thread.

Figures printed:

1. cached ``POST /v1/features`` of one text: p50 / p99 latency and req/s at
   concurrency 1 and 16 (target: p50 < 5 ms at concurrency 1);
2. the same with every text a miss: req/s (target: cached >= 20x faster);
3. 64 concurrent one-text miss requests vs the same 64 texts sent one by one,
   each on a fresh server warmed up with other texts (target: micro-batching
   >= 3x the throughput);
4. 1,000 cached texts with ``all_layers``: base64 vs JSON response size and
   time (target: base64 >= 3x faster).

With ``--floor`` it measures instead how near cached reads come to the
framework's floor (issue 28): the same ``layerbank serve`` against a bare
FastAPI + uvicorn app run with layerbank's own uvicorn config (its loop and
HTTP protocol, app/api/slow_clients.py where present; one worker, access log
off; ``--httptools-floor`` adds one on uvicorn's defaults) whose ``POST /v1/features`` and ``/v1/embeddings``
return precomputed bytes of layerbank's own answers (same size), started in
the same run. The client is light enough not to hide the server: forked
processes, each with one keep-alive raw socket sending a prebuilt HTTP/1.1
request and reading the reply by its Content-Length. It prints p50 / p99 and
req/s at 1 and 16 clients for cached one-text ``/v1/features`` and
``/v1/embeddings`` and the floor, rounds alternating, medians of
``--rounds``, the ratios layerbank / floor, and the load average with every
figure (targets: p50 <= 1.5x the floor at 1 client; req/s >= 2.5x the code
before at 16: ``--before DIR`` serves an older checkout in the same rounds).

With ``--replicas 1,2`` it measures instead how cached reads scale over API
replicas (issue 19): one real PostgreSQL server (Debian's binaries, as the
tests start it), then for each N a fresh data directory and schema shared by N
``layerbank serve --catalog-url`` processes on their own ports, a set of texts
stored through one of them, and cached one-text ``POST /v1/features`` from
keep-alive connections spread over all N. The load comes from separate
processes (so the generator's GIL is not the limit) speaking raw HTTP/1.1 on
sockets (a few microseconds of Python per request, where http.client costs
more than the server's cached path). It prints req/s for each N (best of
``--rounds`` rounds, the N alternating), N / 1 ratios (target on 2 cores: >= 1.6x with two; on
16 cores >= 0.7 efficiency at 8), and where the CPU went: the machine's
cores and load average, the CPU seconds of the servers (with their workers),
of PostgreSQL and of the load generator. On a small machine the generator
shares the cores it measures: the figures say how much it took.

Run from the repository root::

    .venv/bin/python bench/serve.py                 # ~2-4 minutes on 2 CPU cores
    .venv/bin/python bench/serve.py --threads 1 --quick
    .venv/bin/python bench/serve.py --replicas 1,2        # ~2 minutes; needs Debian's postgresql
    .venv/bin/python bench/serve.py --floor               # ~2 minutes

Texts are SST-2 dev phrases from ../shared/data (seeded), made unique per
phase so that "miss" really means never stored.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
from common import SHARED, require_data  # the full data sets: ../shared/data, checked when opened

DATA = SHARED / "sst2" / "dev.tsv"


class Server:
    """``layerbank serve`` on ``data_dir``. With ``catalog_url`` (a replica) it listens on
    ``port`` (server.json names only the replica started last) and ``wait`` is left to
    the caller, which starts the replicas side by side."""

    def __init__(self, data_dir: Path, threads: int | None, catalog_url: str | None = None,
                 port: int = 0, log_name: str | None = None, wait: bool = True,
                 extra: list[str] | None = None, root: Path = ROOT) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAYERBANK_")}
        if threads:
            env["LAYERBANK_THREADS"] = str(threads)
        env["LAYERBANK_LOG_LEVEL"] = "WARNING"
        cmd = [sys.executable, "-m", "layerbank.app.cli.main", "serve", "--data-dir", str(data_dir),
               "--port", str(port)]
        if catalog_url:
            # CPU workers, torch engine: idle once the texts are stored, and no engine timing
            # by N replicas at once on a fresh data directory
            cmd += ["--catalog-url", catalog_url, "--device", "cpu", "--engine", "torch"]
        cmd += extra or []
        self.data_dir = data_dir
        self.log_path = data_dir.parent / f"{log_name or data_dir.name}.log"
        self.log = open(self.log_path, "wb")
        # `python -m` puts the working directory first on sys.path: ``root``'s layerbank runs
        self.proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.host, self.port = "127.0.0.1", port
        if wait:
            self.wait()

    def wait(self, workers: int = 1, timeout: float = 300) -> None:
        """Until /ready answers 200 and lists at least ``workers`` live workers."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited: {self.log_path.read_text()}")
            try:
                if not self.port:
                    meta = json.loads((self.data_dir / "server.json").read_text())
                    if meta["pid"] == self.proc.pid:
                        self.host, self.port = meta["host"], int(meta["port"])
                if self.port:
                    status, body = Conn(self.host, self.port).call("GET", "/ready")
                    if status == 200 and len(json.loads(body)["workers"]) >= workers:
                        break
            except (OSError, ValueError, KeyError):
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"server not ready after {timeout:.0f} s: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()


class Conn:
    """A keep-alive HTTP/1.1 connection (stdlib: little client-side overhead)."""

    def __init__(self, host: str, port: int) -> None:
        self.c = http.client.HTTPConnection(host, port, timeout=600)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"content-type": "application/json"} if data is not None else {}
        self.c.request(method, path, body=data, headers=headers)
        r = self.c.getresponse()
        return r.status, r.read()


def load(server: Server, concurrency: int, bodies: Callable[[int, int], dict[str, Any]],
         per_client: int) -> tuple[list[float], float]:
    """Each client sends ``per_client`` requests back to back; latencies (s) and wall time."""
    lat: list[list[float]] = [[] for _ in range(concurrency)]
    barrier = threading.Barrier(concurrency + 1)

    def client(i: int) -> None:
        conn = Conn(server.host, server.port)
        conn.call("GET", "/health")  # connect before the clock starts
        barrier.wait()
        for j in range(per_client):
            t0 = time.perf_counter()
            status, body = conn.call("POST", "/v1/features", bodies(i, j))
            lat[i].append(time.perf_counter() - t0)
            if status != 200:
                raise SystemExit(f"HTTP {status}: {body[:300]!r}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return [x for xs in lat for x in xs], time.perf_counter() - t0


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def texts_pool(path: Path = DATA) -> list[str]:
    with open(require_data(path), encoding="utf-8") as fh:
        next(fh)  # SST-2's header (a headerless file loses one text)
        rows = sorted({line.split("\t")[0] for line in fh if len(line.split()) >= 5})
    random.Random(0).shuffle(rows)
    return rows


# ---- --floor: cached reads against a bare FastAPI route (issue 28) ----

_FLOOR_APP = """
import sys, uvicorn
from fastapi import FastAPI
from fastapi.responses import Response
features, embeddings = open(sys.argv[2], 'rb').read(), open(sys.argv[3], 'rb').read()
app = FastAPI()

@app.post('/v1/features')
async def f() -> Response:
    return Response(features, media_type='application/json')

@app.post('/v1/embeddings')
async def e() -> Response:
    return Response(embeddings, media_type='application/json')

kw = dict(host='127.0.0.1', port=int(sys.argv[1]), access_log=False, log_level='warning')
try:  # the uvicorn config `layerbank serve` runs (its HTTP protocol, keep-alive), as this checkout has it
    from layerbank.app.api.slow_clients import server_config
    from layerbank.app.api.settings import Settings
except ImportError:
    server_config = None
if sys.argv[4] == 'layerbank' and server_config is not None:
    config = server_config(app, Settings(), **kw)
else:  # uvicorn's defaults: loop and http 'auto' (uvloop, httptools)
    config = uvicorn.Config(app, **kw)
print('floor', sys.argv[4], 'http:', getattr(config.http, '__name__', config.http), file=sys.stderr, flush=True)
uvicorn.Server(config).run()
"""


def _start_floor(tmp: Path, kind: str, probe: dict[str, Any], want: bytes) -> tuple[subprocess.Popen[bytes], int]:
    """The bare app on a free port, with layerbank's server config (``kind`` 'layerbank') or
    uvicorn's defaults ('uvicorn'); returns once it answers ``probe`` with ``want``."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", _FLOOR_APP, str(port), str(tmp / "features.json"),
                             str(tmp / "embeddings.json"), kind], cwd=ROOT)
    deadline = time.monotonic() + 60
    while True:
        try:
            if Conn("127.0.0.1", port).call("POST", "/v1/features", probe)[1] == want:
                return proc, port
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("the floor app did not start")
        time.sleep(0.1)


def _raw_request(path: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (path.encode(), len(data))) + data


def _client(port: int, req: bytes, seconds: float, threads: int, go: Any, out: Any) -> None:
    """One forked client process: ``threads`` keep-alive sockets, requests back to back for
    ``seconds`` after ``go``; sends (latencies of the measured window, count, errors) to ``out``."""
    import socket

    from serve_replicas import _read_response

    lats: list[list[float]] = [[] for _ in range(threads)]
    errors: list[str] = []
    socks = []
    for _ in range(threads):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(req)
        _read_response(s, b"")  # connected and answered once before the clock starts
        socks.append(s)

    def run(i: int) -> None:
        sock, mine, buf = socks[i], lats[i], b""
        clock = time.perf_counter
        stop = start + seconds
        try:
            while (t0 := clock()) < stop:
                sock.sendall(req)
                status, body, buf = _read_response(sock, buf)
                mine.append(clock() - t0)
                if status != 200:
                    errors.append(f"HTTP {status}: {body[:200]!r}")
                    return
        except Exception as e:  # noqa: BLE001  (reported to the parent)
            errors.append(f"{type(e).__name__}: {e}")

    go.wait()
    start = time.perf_counter()
    if threads == 1:
        run(0)
    else:
        ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    out.put(([x for xs in lats for x in xs], errors))


def _drive_raw(port: int, req: bytes, clients: int, procs: int, seconds: float) -> dict[str, float]:
    """``clients`` sockets over ``procs`` forked processes; p50, p99 (ms), req/s and the load."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    procs = min(procs, clients)
    go, out = ctx.Event(), ctx.Queue()
    per = [clients // procs + (i < clients % procs) for i in range(procs)]
    ps = [ctx.Process(target=_client, args=(port, req, seconds, n, go, out)) for n in per]
    for p in ps:
        p.start()
    time.sleep(0.3)  # every process connected and sent its first request
    go.set()
    got = [out.get(timeout=seconds + 60) for _ in ps]
    for p in ps:
        p.join()
    lat = [x for xs, _ in got for x in xs]
    errors = [e for _, es in got for e in es]
    if errors:
        raise SystemExit(f"client errors: {errors[:3]}")
    return {"p50": pct(lat, 50) * 1e3, "p99": pct(lat, 99) * 1e3, "rps": len(lat) / seconds,
            "load": os.getloadavg()[0]}


def run_floor(args: argparse.Namespace) -> dict[str, float]:
    """layerbank's cached one-text reads against the bare route, alternating rounds."""
    hot = texts_pool(args.data)[0]
    tmp = Path(tempfile.mkdtemp(prefix="layerbank-floor-"))
    server = Server(tmp / "a", args.threads)
    floors: list[subprocess.Popen[bytes]] = []
    before = None
    try:
        if args.before:  # another checkout (e.g. `git worktree add /tmp/old HEAD~1`), measured alongside
            before = Server(tmp / "before", args.threads, root=args.before)
        feats = {"texts": [hot]}
        embs = {"input": [hot], "model": "all-MiniLM-L6-v2", "encoding_format": "float"}
        answers = {}
        for name, path, body in (("features", "/v1/features", feats), ("embeddings", "/v1/embeddings", embs)):
            status, answers[name] = Conn(server.host, server.port).call("POST", path, body)
            assert status == 200, answers[name][:300]
            status, answers[name] = Conn(server.host, server.port).call("POST", path, body)  # cached now
            for _ in range(2 if before else 0):
                assert Conn(before.host, before.port).call("POST", path, body)[0] == 200  # type: ignore[union-attr]
            (tmp / f"{name}.json").write_bytes(answers[name])
        floor, floor_port = _start_floor(tmp, "layerbank", feats, answers["features"])
        floors = [floor]
        if args.httptools_floor:
            plain, plain_port = _start_floor(tmp, "uvicorn", feats, answers["features"])
            floors.append(plain)
        print(f"answers: features {len(answers['features'])} B, embeddings {len(answers['embeddings'])} B; "
              f"the floor returns the same bytes; {os.cpu_count()} CPUs; client: raw keep-alive sockets, "
              f"16 clients over {args.client_procs} processes; {args.seconds:.1f} s windows, "
              f"medians of {args.rounds} alternating rounds")
        targets = {"layerbank features": (server.port, _raw_request("/v1/features", feats)),
                   "layerbank embeddings": (server.port, _raw_request("/v1/embeddings", embs)),
                   "floor features": (floor_port, _raw_request("/v1/features", feats)),
                   "floor embeddings": (floor_port, _raw_request("/v1/embeddings", embs))}
        if args.httptools_floor:  # what the floor costs with uvicorn's default protocol (httptools)
            targets.update({"httptools floor features": (plain_port, _raw_request("/v1/features", feats)),
                            "httptools floor embeddings": (plain_port, _raw_request("/v1/embeddings", embs))})
        if before:
            targets.update({"before features": (before.port, _raw_request("/v1/features", feats)),
                            "before embeddings": (before.port, _raw_request("/v1/embeddings", embs))})
        got: dict[tuple[str, int], list[dict[str, float]]] = {}
        for rnd in range(args.rounds):
            order = list(targets) if rnd % 2 == 0 else list(reversed(targets))
            for c in (1, 16):
                for name in order:
                    port, req = targets[name]
                    got.setdefault((name, c), []).append(
                        _drive_raw(port, req, c, 1 if c == 1 else args.client_procs, args.seconds))
        res: dict[str, float] = {}
        for c in (1, 16):
            for name in targets:
                runs = got[(name, c)]
                m = {k: statistics.median(r[k] for r in runs) for k in ("p50", "p99", "rps")}
                loads = [r["load"] for r in runs]
                key = name.replace(" ", "_") + f"_c{c}"
                res.update({f"{key}_p50_ms": m["p50"], f"{key}_p99_ms": m["p99"], f"{key}_rps": m["rps"]})
                print(f"{name:26s} {c:2d} client{'s' if c > 1 else ' '}: p50 {m['p50']:6.3f} ms  "
                      f"p99 {m['p99']:6.3f} ms  {m['rps']:8.0f} req/s   (load {min(loads):.1f}-{max(loads):.1f})")
            for what in ("features", "embeddings"):
                lb, fl = f"layerbank_{what}_c{c}", f"floor_{what}_c{c}"
                res[f"ratio_{what}_c{c}_p50"] = res[f"{lb}_p50_ms"] / res[f"{fl}_p50_ms"]
                res[f"ratio_{what}_c{c}_rps"] = res[f"{lb}_rps"] / res[f"{fl}_rps"]
                print(f"  {what}, {c} client(s): layerbank / floor p50 {res[f'ratio_{what}_c{c}_p50']:.2f}x "
                      f"{'(target <= 1.5x) ' if c == 1 else ''}req/s {res[f'ratio_{what}_c{c}_rps']:.2f}x")
                if before:
                    res[f"speedup_{what}_c{c}_rps"] = res[f"{lb}_rps"] / res[f"before_{what}_c{c}_rps"]
                    print(f"  {what}, {c} client(s): layerbank / before req/s "
                          f"{res[f'speedup_{what}_c{c}_rps']:.2f}x{' (target >= 2.5x)' if c == 16 else ''}")
        res["load_end"] = os.getloadavg()[0]
        print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        return res
    finally:
        server.stop()
        if before is not None:
            before.stop()
        for p in floors:
            p.terminate()
            p.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="torch threads of the worker")
    ap.add_argument("--quick", action="store_true", help="fewer requests")
    ap.add_argument("--replicas", default=None,
                    help="instead of the phases above: cached req/s over N API replicas on one "
                         "PostgreSQL catalog, for each N of this list (e.g. 1,2)")
    ap.add_argument("--data", type=Path, default=DATA, help="TSV whose first column is the texts")
    ap.add_argument("--model", default=None, help="--model of the replicas (default: the bundled one)")
    ap.add_argument("--per-replica", type=int, default=8, help="connections per replica (--replicas)")
    ap.add_argument("--window", type=float, default=3.0, help="seconds per measured window (--replicas)")
    ap.add_argument("--rounds", type=int, default=5, help="measured windows per N, best counts (--replicas)")
    ap.add_argument("--floor", action="store_true",
                    help="instead of the phases above: cached reads against a bare FastAPI route")
    ap.add_argument("--client-procs", type=int, default=16,
                    help="processes the 16 clients are spread over (--floor)")
    ap.add_argument("--seconds", type=float, default=2.0, help="seconds per measured window (--floor)")
    ap.add_argument("--httptools-floor", action="store_true",
                    help="also a floor on uvicorn's default protocol (httptools), for comparison (--floor)")
    ap.add_argument("--before", type=Path, default=None,
                    help="a checkout of older code whose server is measured in the same rounds (--floor)")
    args = ap.parse_args()
    if args.floor:
        args.rounds = args.rounds if args.rounds != 5 else 3
        res = run_floor(args)
        print("\nsummary: " + json.dumps({k: round(v, 4) for k, v in res.items()}))
        return
    if args.replicas:
        from serve_replicas import run_replicas

        res = run_replicas([int(n) for n in args.replicas.split(",")], texts_pool(args.data)[:256],
                           args.threads, args.model, args.per_replica, warmup=1.0, window=args.window,
                           rounds=args.rounds)
        print("\nsummary: " + json.dumps({k: round(v, 1) for k, v in res.items()}))
        return
    n_cached = 300 if args.quick else 1000
    pool = texts_pool(args.data)
    tmp = Path(tempfile.mkdtemp(prefix="layerbank-bench-"))
    print(f"layerbank serve benchmark ({os.cpu_count()} CPUs, worker threads: "
          f"{args.threads or 'all'}); server data in {tmp}")
    server = Server(tmp / "a", args.threads)
    res: dict[str, float] = {}
    try:
        hot = pool[0]
        Conn(server.host, server.port).call("POST", "/v1/features", {"texts": [hot]})
        for c in (1, 16):
            per = (n_cached if c == 1 else max(50, n_cached // 8))
            lat, wall = load(server, c, lambda i, j: {"texts": [hot]}, per)
            res[f"cached_c{c}_p50"], res[f"cached_c{c}_p99"] = pct(lat, 50), pct(lat, 99)
            res[f"cached_c{c}_rps"] = len(lat) / wall
            print(f"cached, 1 text, concurrency {c:2d}: p50 {pct(lat, 50) * 1e3:6.2f} ms  "
                  f"p99 {pct(lat, 99) * 1e3:6.2f} ms  {len(lat) / wall:8.1f} req/s  ({len(lat)} requests)")
        k = iter(range(10**9))
        for c in (1, 16):
            per = 20 if c == 1 else 6
            base = 1 + next(k) * 1000
            lat, wall = load(server, c, lambda i, j, base=base: {"texts": [pool[base + i * 50 + j]]}, per)
            res[f"miss_c{c}_rps"] = len(lat) / wall
            res[f"miss_c{c}_p50"] = pct(lat, 50)
            print(f"miss,   1 text, concurrency {c:2d}: p50 {pct(lat, 50) * 1e3:6.1f} ms  "
                  f"p99 {pct(lat, 99) * 1e3:6.1f} ms  {len(lat) / wall:8.1f} req/s  ({len(lat)} requests)")
        print(f"  cached / miss req/s at concurrency 1: {res['cached_c1_rps'] / res['miss_c1_rps']:.0f}x "
              "(target >= 20x)")

        # 4. 1,000 cached texts, all_layers: JSON vs base64
        big = pool[2000: 2000 + n_cached]
        conn = Conn(server.host, server.port)
        t0 = time.perf_counter()
        conn.call("POST", "/v1/features", {"texts": big[: n_cached // 2]})
        conn.call("POST", "/v1/features", {"texts": big[n_cached // 2:]})
        print(f"(stored {n_cached} texts for the all_layers test in {time.perf_counter() - t0:.1f} s)")
        sizes, times = {}, {}
        for fmt in ("json", "base64"):
            ts = []
            for _ in range(3):
                t0 = time.perf_counter()
                status, body = conn.call("POST", "/v1/features", {"texts": big, "view": "all_layers",
                                                                  "format": fmt})
                ts.append(time.perf_counter() - t0)
                assert status == 200, body[:200]
            sizes[fmt], times[fmt] = len(body), statistics.median(ts)
            print(f"{n_cached} cached texts, all_layers, {fmt:6s}: {len(body) / 1e6:7.1f} MB  "
                  f"{statistics.median(ts) * 1e3:8.1f} ms (median of 3)")
        res["b64_speedup"] = times["json"] / times["base64"]
        print(f"  base64 vs JSON: {times['json'] / times['base64']:.1f}x faster, "
              f"{sizes['json'] / sizes['base64']:.1f}x smaller (target >= 3x faster)")
    finally:
        server.stop()

    # 3. micro-batching: the same 64 texts, one by one on a fresh server, then concurrently on another
    texts64, warm = pool[4000:4064], pool[4100:4140]
    for mode in ("one by one", "64 concurrent"):
        s = Server(tmp / ("seq" if mode == "one by one" else "conc"), args.threads)
        try:
            # warm both paths (first forward passes of new shapes are slow) with other texts
            load(s, 32, lambda i, j: {"texts": [warm[i]]}, 1)
            load(s, 1, lambda i, j: {"texts": [warm[32 + j]]}, 8)
            before = {j["id"] for j in json.loads(Conn(s.host, s.port).call(
                "GET", "/v1/jobs?limit=1000")[1])["data"]}
            if mode == "one by one":
                lat, wall = load(s, 1, lambda i, j: {"texts": [texts64[j]]}, 64)
            else:
                lat, wall = load(s, 64, lambda i, j: {"texts": [texts64[i]]}, 1)
            res[mode] = 64 / wall
            jobs = json.loads(Conn(s.host, s.port).call("GET", "/v1/jobs?limit=1000")[1])["data"]
            print(f"64 one-text misses, {mode:13s}: {wall:6.2f} s  {64 / wall:7.1f} req/s  "
                  f"({sum(j['id'] not in before for j in jobs)} encoder jobs)")
        finally:
            s.stop()
    print(f"  micro-batching: {res['64 concurrent'] / res['one by one']:.1f}x the throughput "
          "(target >= 3x)")
    print("\nsummary: " + json.dumps({k: round(v, 5) for k, v in res.items()}))


if __name__ == "__main__":
    main()

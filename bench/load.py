"""Bounded load test of the HTTP service: N concurrent clients on loopback for
a fixed time, mixing the requests users make, and what the server does under it.

The mix (per request, seeded): cached ``POST /v1/features`` (1-8 stored
texts) 50%, misses (1-4 new texts) 20%, dataset uploads (20 new labelled
texts) 10%, probe submissions (``POST /v1/probes`` on a small labelled
dataset, when the server has that route) 5%, reads (``/info``, ``/v1/jobs``,
a dataset, cached ``/v1/embeddings``) 15%. A client that gets 429 waits
briefly (``Retry-After`` is checked, not obeyed in full) and goes on.

Printed (and written as JSON with ``--json``): requests per second, p50/p99
latency overall and per kind, status counts, 5xx, client timeouts, the API
process's resident memory after warm-up (first and last sample, peak, growth)
and the same for the worker. Pass/fail against the targets (zero 5xx, zero
timeouts, memory growth under 10%) is the exit status.

Run from the repository root::

    .venv/bin/python bench/load.py                          # own server, bundled model, 60 s
    .venv/bin/python bench/load.py --model /path/to/model --duration 20
    .venv/bin/python bench/load.py --url http://127.0.0.1:8000 --server-pid 1234

Used by tests/reliability/test_load.py (``run_load``) for a 20-second version.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT.parent / "shared" / "data" / "sst2" / "train.tsv"
MIX = {"cached": 0.50, "miss": 0.20, "dataset": 0.10, "probe": 0.05, "read": 0.15}

__all__ = ["LoadReport", "main", "rss_bytes", "run_load"]


def rss_bytes(pid: int) -> int:
    """Resident set size of a process, from /proc (Linux)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise ValueError(f"no VmRSS for pid {pid}")


def _phrases(offset: int, n: int, train: Path = TRAIN) -> list[str]:
    with open(train, encoding="utf-8") as fh:
        next(fh)
        rows = sorted({t.strip() for t in (line.split("\t")[0] for line in fh) if len(t.split()) >= 3})
    random.Random(11).shuffle(rows)
    return rows[offset: offset + n]


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


@dataclass
class LoadReport:
    duration_s: float
    clients: int
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    statuses: dict[str, int]
    by_kind: dict[str, dict[str, Any]]
    server_errors: int  # 5xx
    timeouts: int  # client gave up waiting (30 s)
    transport_errors: int  # connection refused/reset
    overloaded: int  # 429
    missing_retry_after: int  # 429s without a Retry-After header
    probes: str  # "included" or why not
    rss_api_mb: list[float] = field(default_factory=list)  # after warm-up, one sample a second
    rss_worker_mb: list[float] = field(default_factory=list)
    memory_growth: float = 0.0  # API process: peak / first sample after warm-up - 1
    errors: list[str] = field(default_factory=list)  # first few unexpected answers

    def ok(self) -> bool:
        return self.server_errors == 0 and self.timeouts == 0 and self.transport_errors == 0 \
            and self.memory_growth <= 0.10 and self.missing_retry_after == 0

    def summary(self) -> str:
        lines = [(f"{self.clients} clients, {self.duration_s:.0f} s: {self.requests} requests, "
                  f"{self.rps:.1f} req/s, p50 {self.p50_ms:.1f} ms, p99 {self.p99_ms:.1f} ms"),
                 (f"statuses {dict(sorted(self.statuses.items()))}; 5xx {self.server_errors}, "
                  f"429 {self.overloaded}, timeouts {self.timeouts}, transport errors {self.transport_errors}"),
                 f"probes: {self.probes}"]
        for kind, d in self.by_kind.items():
            lines.append(f"  {kind:8s} n={d['n']:6d}  p50 {d['p50_ms']:8.1f} ms  p99 {d['p99_ms']:8.1f} ms"
                         f"  {d['statuses']}")
        if self.rss_api_mb:
            lines.append(f"API resident memory after warm-up: {self.rss_api_mb[0]:.1f} -> "
                         f"{self.rss_api_mb[-1]:.1f} MB (peak {max(self.rss_api_mb):.1f}, growth "
                         f"{100 * self.memory_growth:.1f}%)")
        if self.rss_worker_mb:
            lines.append(f"worker resident memory: {self.rss_worker_mb[0]:.1f} -> "
                         f"{self.rss_worker_mb[-1]:.1f} MB (peak {max(self.rss_worker_mb):.1f})")
        return "\n".join(lines)


class _Texts:
    """Never-seen texts: real phrases, made unique per run and per use."""

    def __init__(self, pool: list[str], tag: str) -> None:
        self.pool, self.tag, self.n = pool, tag, 0

    def take(self, k: int) -> list[str]:
        out = []
        for _ in range(k):
            self.n += 1
            out.append(f"{self.pool[self.n % len(self.pool)]} [{self.tag}-{self.n}]")
        return out


async def _prepare(c: httpx.AsyncClient, warm: list[str], labelled: list[str],
                   max_texts: int) -> tuple[str | None, str]:
    """Store the cached pool; make a small labelled dataset for probes (if the route exists)."""
    for i in range(0, len(warm), max_texts):
        r = await c.post("/v1/features", json={"texts": warm[i: i + max_texts]})
        r.raise_for_status()
    paths = (await c.get("/openapi.json")).json().get("paths", {})
    if "post" not in paths.get("/v1/probes", {}):
        return None, "not available: the server has no POST /v1/probes"
    labels = [str(i % 2) for i in range(len(labelled))]
    r = await c.post("/v1/datasets", json={"name": "load-probe", "texts": labelled, "labels": labels})
    r.raise_for_status()
    ds = r.json()
    if not await _finished(c, ds["job_id"]):
        return None, "not included: the probe dataset was not extracted"
    # one probe before the clock starts: its first run loads libraries into the server
    r = await c.post("/v1/probes", json=_PROBE | {"dataset": ds["id"]})
    if r.status_code != 202 or not await _finished(c, r.json()["id"]):
        return None, f"not included: a first probe did not succeed ({r.status_code} {r.text[:200]})"
    return ds["id"], "included"


async def _finished(c: httpx.AsyncClient, job_id: str, timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = (await c.get(f"/v1/jobs/{job_id}")).json()["state"]
        if state in ("succeeded", "failed", "cancelled"):
            return state == "succeeded"
        await asyncio.sleep(0.2)
    return False


async def run_load(url: str, *, duration_s: float = 60.0, clients: int = 32, warmup_s: float | None = None,
                   server_pid: int | None = None, worker_pid: int | None = None, api_key: str | None = None,
                   seed: int = 0, text_offset: int = 10_000, timeout_s: float = 30.0,
                   mix: dict[str, float] | None = None, train: Path = TRAIN) -> LoadReport:
    """Drive ``url`` for ``duration_s`` with ``clients`` concurrent clients; measure it.

    Texts: SST-2 training phrases from ``train`` (the tests pass tests/data's subset)."""
    warmup_s = max(5.0, 0.3 * duration_s) if warmup_s is None else warmup_s
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    # idle connections are dropped before the server (uvicorn: 5 s) closes them under a request
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4,
                          keepalive_expiry=2.0)
    phrases = _phrases(text_offset, 3000, train)
    assert len(phrases) == 3000, f"{train}: too few phrases past offset {text_offset}"
    warm, labelled, fresh = phrases[:256], phrases[256:316], phrases[316:]
    tag = f"{os.getpid()}-{int(time.time())}"
    samples: list[tuple[str, int, float]] = []  # kind, status (0: timeout, -1: transport), seconds
    errors: list[str] = []
    missing_retry_after = 0
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits, headers=headers) as c:
        info = (await c.get("/info")).json()
        max_texts = int(info["limits"]["max_texts_per_request"])
        probe_ds, probes = await _prepare(c, warm, labelled, max_texts)
        chosen = {k: v for k, v in (mix or MIX).items() if v > 0 and (k != "probe" or probe_ds)}
        kinds, weights = list(chosen), list(chosen.values())
        datasets: list[str] = [probe_ds] if probe_ds else []
        start = time.monotonic()
        deadline = start + duration_s
        rss_api: list[float] = []
        rss_worker: list[float] = []

        async def sample_memory() -> None:
            while time.monotonic() < deadline:
                await asyncio.sleep(1.0)
                if time.monotonic() - start < warmup_s:
                    continue
                for pid, out in ((server_pid, rss_api), (worker_pid, rss_worker)):
                    if pid:
                        try:
                            out.append(rss_bytes(pid) / 2**20)
                        except (OSError, ValueError):
                            pass

        async def client(i: int) -> None:
            nonlocal missing_retry_after
            rng = random.Random(seed * 1000 + i)
            texts = _Texts(fresh, f"{tag}-{i}")
            while time.monotonic() < deadline:
                kind = rng.choices(kinds, weights)[0]
                t0 = time.perf_counter()
                try:
                    r = await _request(c, kind, rng, warm, texts, datasets, probe_ds, max_texts)
                except httpx.TimeoutException:
                    samples.append((kind, 0, time.perf_counter() - t0))
                    continue
                except httpx.TransportError as e:
                    samples.append((kind, -1, time.perf_counter() - t0))
                    errors.append(f"{kind}: {type(e).__name__}: {e}")
                    await asyncio.sleep(0.1)
                    continue
                samples.append((kind, r.status_code, time.perf_counter() - t0))
                if r.status_code == 202 and kind == "dataset":
                    datasets.append(r.json()["id"])
                if r.status_code == 429:
                    if "retry-after" not in r.headers:
                        missing_retry_after += 1
                    await asyncio.sleep(rng.uniform(0.01, 0.05))
                elif (r.status_code >= 500 or r.status_code not in _EXPECTED[kind]) and len(errors) < 20:
                    errors.append(f"{kind}: {r.status_code} {r.text[:300]}")

        await asyncio.gather(sample_memory(), *(client(i) for i in range(clients)))
        elapsed = time.monotonic() - start

    done = [s for s in samples if s[1] > 0]
    by_kind: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        lat = [t for k, st, t in done if k == kind]
        sts: dict[str, int] = {}
        for k, st, _ in samples:
            if k == kind:
                sts[str(st)] = sts.get(str(st), 0) + 1
        by_kind[kind] = {"n": len(lat), "p50_ms": 1e3 * _pct(lat, 50), "p99_ms": 1e3 * _pct(lat, 99),
                         "statuses": dict(sorted(sts.items()))}
    statuses: dict[str, int] = {}
    for _, st, _ in samples:
        statuses[str(st)] = statuses.get(str(st), 0) + 1
    lat_all = [t for _, _, t in done]
    growth = (max(rss_api) / rss_api[0] - 1.0) if len(rss_api) >= 2 else 0.0
    return LoadReport(
        duration_s=elapsed, clients=clients, requests=len(done), rps=len(done) / elapsed,
        p50_ms=1e3 * _pct(lat_all, 50), p99_ms=1e3 * _pct(lat_all, 99), statuses=statuses,
        by_kind=by_kind, server_errors=sum(1 for s in done if s[1] >= 500),
        timeouts=sum(1 for s in samples if s[1] == 0),
        transport_errors=sum(1 for s in samples if s[1] == -1),
        overloaded=statuses.get("429", 0), missing_retry_after=missing_retry_after, probes=probes,
        rss_api_mb=[round(x, 1) for x in rss_api], rss_worker_mb=[round(x, 1) for x in rss_worker],
        memory_growth=growth, errors=errors)


# a small probe: one view, one pooling, 2 folds, no control task or learning curve
_PROBE = {"views": ["layer:-1"], "poolings": ["mean"], "cv": 2, "control_task": False,
          "learning_curve": False}

# statuses a well-behaved server may give each kind of request under load
_EXPECTED = {"cached": {200}, "miss": {200, 429}, "dataset": {202, 429}, "probe": {202, 429},
             "read": {200}}


async def _request(c: httpx.AsyncClient, kind: str, rng: random.Random, warm: list[str],
                   texts: _Texts, datasets: list[str], probe_ds: str | None,
                   max_texts: int) -> httpx.Response:
    if kind == "cached":
        return await c.post("/v1/features", json={"texts": rng.sample(warm, rng.randint(1, min(8, max_texts)))})
    if kind == "miss":
        return await c.post("/v1/features", json={"texts": texts.take(rng.randint(1, min(4, max_texts)))})
    if kind == "dataset":
        new = texts.take(20)
        return await c.post("/v1/datasets", json={"name": "load", "texts": new,
                                                  "labels": [str(j % 2) for j in range(len(new))]})
    if kind == "probe":
        return await c.post("/v1/probes", json=_PROBE | {"dataset": probe_ds})
    which = rng.randrange(4)
    if which == 0:
        return await c.get("/info")
    if which == 1:
        return await c.get("/v1/jobs", params={"limit": 5})
    if which == 2 and datasets:
        return await c.get(f"/v1/datasets/{rng.choice(datasets)}")
    return await c.post("/v1/embeddings", json={"input": rng.choice(warm)})


def _start_server(data_dir: Path, model: str | None, queue_depth: int) -> tuple[subprocess.Popen[bytes], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYERBANK_")}
    env.update({"LAYERBANK_LOG_LEVEL": "WARNING", "LAYERBANK_MAX_QUEUE_DEPTH": str(queue_depth)})
    if model:
        env["LAYERBANK_MODEL"] = model
    with open(data_dir.parent / "server.log", "wb") as log:  # the child keeps its own copy
        proc = subprocess.Popen([sys.executable, "-m", "layerbank.app.cli.main", "serve", "--data-dir", str(data_dir),
                                 "--port", "0"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit((data_dir.parent / "server.log").read_text())
        try:
            meta = json.loads((data_dir / "server.json").read_text())
            if meta["pid"] == proc.pid and httpx.get(meta["url"] + "/ready").status_code == 200:
                return proc, meta["url"]
        except (OSError, ValueError, KeyError, httpx.TransportError):
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the server was not ready after 300 s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="an existing server (default: start one on a temporary data dir)")
    ap.add_argument("--server-pid", type=int, help="with --url: the API process, for its memory")
    ap.add_argument("--model", help="model for the server this starts (default: the bundled one)")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--queue-depth", type=int, default=8,
                    help="max_queue_depth of the server this starts (small: overload shows as 429)")
    ap.add_argument("--api-key")
    ap.add_argument("--mix", help=f"request mix as JSON, e.g. '{{\"cached\": 1}}' (default: {json.dumps(MIX)})")
    ap.add_argument("--json", help="also write the report here")
    args = ap.parse_args(argv)
    from common import require_data  # here: the tests load this file without bench/ on sys.path

    require_data(TRAIN)
    proc = None
    server_pid, worker_pid = args.server_pid, None
    url = args.url
    if url is None:
        tmp = Path(tempfile.mkdtemp(prefix="layerbank-load-"))
        proc, url = _start_server(tmp / "data", args.model, args.queue_depth)
        server_pid = proc.pid
    try:
        ready = httpx.get(url + "/ready", headers={"Authorization": f"Bearer {args.api_key}"}
                          if args.api_key else {}).json()
        if ready.get("workers"):
            worker_pid = int(ready["workers"][0]["pid"])
        report = asyncio.run(run_load(url, duration_s=args.duration, clients=args.clients,
                                      server_pid=server_pid, worker_pid=worker_pid, api_key=args.api_key,
                                      mix=json.loads(args.mix) if args.mix else None))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)
    print(report.summary())
    for e in report.errors[:5]:
        print("  unexpected:", e)
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(report), indent=2))
    print("PASS" if report.ok() else "FAIL", "(zero 5xx, zero timeouts, 429 with Retry-After, "
          "memory growth <= 10%)")
    return 0 if report.ok() else 1


if __name__ == "__main__":
    sys.exit(main())

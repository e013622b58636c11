"""Cached reads over N API replicas on one PostgreSQL catalog (issue 19);
``bench/serve.py --replicas 1,2`` runs it (its docstring says what is printed).

For each N: a fresh data directory and schema, N ``layerbank serve
--catalog-url`` processes on their own ports (the first started alone, so that
only one creates the tables), the texts stored through the first, every text
read once through each replica (its row cache), then keep-alive connections
spread round-robin over the replicas send cached one-text ``POST
/v1/features`` back to back: one window per N per round after a short
warm-up, every set of replicas up all along and the N taking turns, so that
each N meets the shared machine's changing load; the best round of each N
counts.

The load comes from ``min(N, cores)`` spawned processes with threads, each
connection a raw socket sending a prebuilt HTTP/1.1 request and reading the
reply by its Content-Length: http.client spends more Python per request than
the server's cached path, and on 2 cores that would be measuring the client.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["run_replicas"]


def _request(text: str) -> bytes:
    body = json.dumps({"texts": [text]}).encode()
    return (b"POST /v1/features HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


def _read_response(sock: socket.socket, buf: bytes) -> tuple[int, bytes, bytes]:
    """(status, body, bytes read past this response) of one HTTP/1.1 reply with a Content-Length."""
    while (end := buf.find(b"\r\n\r\n")) < 0:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        buf += chunk
    head = buf[:end].lower()
    i = head.find(b"content-length:")
    if i < 0:
        raise ValueError(f"a reply without Content-Length: {buf[:200]!r}")
    j = head.find(b"\r\n", i)
    total = end + 4 + int(head[i + 15: j if j >= 0 else len(head)])
    while len(buf) < total:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        buf += chunk
    return int(buf[9:12]), buf[end + 4: total], buf[total:]


def _drive(ports: list[int], reqs: list[bytes], ready: Any, go: Any, times: Any, out: Any) -> None:
    """One load-generator process: a thread per port in ``ports`` (one connection each)."""
    n_win = len(times) - 2  # times: load start, then the window edges
    counts = [[0] * n_win for _ in ports]
    lats: list[list[list[float]]] = [[[] for _ in range(n_win)] for _ in ports]
    errors: list[str] = []
    connected = threading.Barrier(len(ports) + 1)

    def client(i: int) -> None:
        sock = socket.create_connection(("127.0.0.1", ports[i]))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connected.wait()
        go.wait()
        edges = list(times)
        first, stop = edges[1], edges[-1]
        width = (stop - first) / n_win
        k, buf = i * 7919, b""
        try:
            while (t0 := time.time()) < stop:
                sock.sendall(reqs[k % len(reqs)])
                k += 1
                status, body, buf = _read_response(sock, buf)
                t1 = time.time()
                if status != 200:
                    errors.append(f"HTTP {status}: {body[:300]!r}")
                    return
                if first <= t1 < stop:  # completions inside the measured windows
                    w = min(n_win - 1, int((t1 - first) / width))
                    counts[i][w] += 1
                    lats[i][w].append(t1 - t0)
        except Exception as e:  # noqa: BLE001  (reported to the parent, which stops the run)
            errors.append(f"{type(e).__name__}: {e}")
        finally:
            sock.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(ports))]
    for t in threads:
        t.start()
    connected.wait()
    ready.put(os.getpid())
    go.wait()
    cpu = []
    for edge in list(times)[1:]:  # this process's CPU seconds at each window edge
        time.sleep(max(0.0, edge - time.time()))
        cpu.append(time.process_time())
    for t in threads:
        t.join()
    out.put({"counts": [sum(c[w] for c in counts) for w in range(n_win)],
             "lats": [[x for ls in lats for x in ls[w]] for w in range(n_win)],
             "cpu": [b - a for a, b in itertools.pairwise(cpu)], "errors": errors})


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes and all their descendants."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            procs = [psutil.Process(pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
    return total


def _loadavg() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def _measure(servers: list[Any], pg_pid: int | None, reqs: list[bytes], per_replica: int,
             warmup: float, window: float, rounds: int) -> dict[str, Any]:
    """Drive the replicas; req/s, p50 latency and CPU shares of the best window."""
    n = len(servers)
    ports = [servers[c % n].port for c in range(per_replica * n)]  # round-robin over replicas
    n_proc = min(n, os.cpu_count() or 1)
    ctx = mp.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    times = ctx.Array("d", rounds + 2, lock=False)
    procs = [ctx.Process(target=_drive, args=(ports[p::n_proc], reqs, ready, go, times, out), daemon=True)
             for p in range(n_proc)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)  # every connection open before the clock starts
    t = time.time() + 0.05
    edges = [t] + [t + warmup + w * window for w in range(rounds + 1)]
    times[:] = edges
    go.set()
    server_pids = [s.proc.pid for s in servers]
    srv_cpu, pg_cpu = [], []
    for edge in edges[1:]:
        time.sleep(max(0.0, edge - time.time()))
        srv_cpu.append(_cpu_seconds(server_pids))
        pg_cpu.append(_cpu_seconds([pg_pid]) if pg_pid else 0.0)
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    errors = [e for r in results for e in r["errors"]]
    if errors:
        raise SystemExit(f"load generator: {errors[0]} ({len(errors)} errors)")
    counts = [sum(r["counts"][w] for r in results) for w in range(rounds)]
    best = max(range(rounds), key=counts.__getitem__)
    lats = sorted(x for r in results for x in r["lats"][best])
    return {"rps": counts[best] / window, "all_rps": [c / window for c in counts],
            "p50_ms": lats[len(lats) // 2] * 1e3 if lats else float("nan"),
            "servers_cpu": (srv_cpu[best + 1] - srv_cpu[best]) / window,
            "postgres_cpu": (pg_cpu[best + 1] - pg_cpu[best]) / window,
            "client_cpu": sum(r["cpu"][best] for r in results) / window,
            "connections": len(ports), "client_processes": n_proc}


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _postmaster_pid(root: Path) -> int | None:
    try:
        return int((root / "data" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _start_set(n: int, pg: Any, data: Path, texts: list[str], threads: int, model: str | None) -> list[Any]:
    """N replicas on a fresh data directory and schema, every text stored and read by each."""
    from serve import Conn, Server

    url = pg.new_schema_url(f"bench_r{n}")
    data.mkdir()  # serve --catalog-url does not create it (told the lead)
    ports = _free_ports(n)
    extra = ["--model", model] if model else []
    servers = [Server(data, threads, url, ports[0], f"{data.name}-0", wait=False, extra=extra)]
    try:
        servers[0].wait()  # the schema's tables exist before the others start
        servers += [Server(data, threads, url, p, f"{data.name}-{i + 1}", wait=False, extra=extra)
                    for i, p in enumerate(ports[1:])]
        for s in servers:
            s.wait(workers=n)
        conn = Conn(servers[0].host, servers[0].port)
        for i in range(0, len(texts), 128):  # stored once, through the first replica
            status, body = conn.call("POST", "/v1/features", {"texts": texts[i: i + 128]})
            assert status == 200, body[:300]
        for s in servers:  # every replica reads every text once: all cached from here on
            status, body = Conn(s.host, s.port).call("POST", "/v1/features", {"texts": texts})
            assert status == 200, body[:300]
            hits = json.loads(body)["usage"]["cache_hits"]
            assert hits == len(texts), f"replica on port {s.port}: {hits} of {len(texts)} cached"
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


def run_replicas(counts: list[int], texts: list[str], threads: int | None, model: str | None,
                 per_replica: int, warmup: float, window: float, rounds: int) -> dict[str, Any]:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.postgres_server import PostgresServer

    threads = threads or 1  # one torch thread per replica's worker: the cores are for serving
    # `timeout` sends SIGTERM: leave through the finally blocks, which stop the replicas and
    # PostgreSQL (left running, they would hold the machine and the caller's output pipe)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="layerbank-bench-replicas-"))
    # outside pytest's and the bench's temp dirs: postgres (not root) must enter it
    pg = PostgresServer.start(Path(tempfile.mkdtemp(prefix="layerbank-pg-")))
    pg_pid = _postmaster_pid(pg.root)
    reqs = [_request(t) for t in texts]
    print(f"replicas on one PostgreSQL catalog: {os.cpu_count()} CPUs, load average {_loadavg()} "
          f"(1/5/15 min) before; torch threads per worker {threads}; {len(texts)} cached texts; "
          f"{per_replica} keep-alive connections per replica; {rounds} rounds, each a {window:g} s "
          f"window per N after {warmup:g} s of warm-up, the N alternating (all sets of replicas "
          f"stay up, idle but the one driven), best round per N; data in {tmp}", flush=True)
    sets: dict[int, list[Any]] = {}
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
    try:
        for n in counts:
            t0 = time.monotonic()
            sets[n] = _start_set(n, pg, tmp / f"r{n}", texts, threads, model)
            print(f"{n} replica{'s' if n > 1 else ''} started, texts stored and read by each in "
                  f"{time.monotonic() - t0:.0f} s", flush=True)
        # alternating: a shared machine's load changes by the minute, and each N gets its turns
        for rnd in range(rounds):
            for n in counts:
                runs[n].append(_measure(sets[n], pg_pid, reqs, per_replica, warmup, window, 1))
            print(f"round {rnd + 1}: " + ", ".join(f"N={n} {runs[n][-1]['rps']:.0f}" for n in counts)
                  + f" req/s; load average {_loadavg()}", flush=True)
    finally:
        for servers in sets.values():
            for s in servers:
                s.stop()
        pg.stop()
    res: dict[int, dict[str, Any]] = {}
    for n in counts:
        r = res[n] = max(runs[n], key=lambda x: x["rps"])
        r["per_cpu"] = r["rps"] / max(r["servers_cpu"], 1e-9)
        print(f"{n} replica{'s' if n > 1 else ' '}: {r['rps']:8.0f} cached req/s  p50 {r['p50_ms']:5.2f} ms  "
              f"{r['per_cpu']:6.0f} req per server CPU second; CPU cores busy: servers "
              f"{r['servers_cpu']:.2f}, postgres {r['postgres_cpu']:.2f}, load generator "
              f"{r['client_cpu']:.2f} ({r['client_processes']} processes, {r['connections']} connections)")
    base = res.get(1)
    if base:
        for n, r in res.items():
            if n > 1:
                ratio = r["rps"] / base["rps"]
                print(f"  {n} replicas / 1: {ratio:.2f}x ({ratio / n:.2f} efficiency; target on 2 cores: "
                      f">= 1.6x with two, on 16 cores >= 0.7 efficiency at 8); server CPU per request "
                      f"{base['per_cpu'] / r['per_cpu']:.2f}x one replica's (near 1: replicas add no "
                      "work per request, whatever share of a loaded machine they got)")
    print(f"load average after: {_loadavg()}")
    shutil.rmtree(tmp, ignore_errors=True)
    return {f"replicas_{n}_{k}": r[k] for n, r in res.items() for k in ("rps", "per_cpu")}

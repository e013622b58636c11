"""``layerbank serve`` start-up against an earlier revision, side by side (issue 28 item 4).

Times, from the process start, when ``serve`` has started its worker process,
when the API answers (``/health``) and when ``/ready`` says 200 (the worker has
loaded its model and registered it), and the worker's resident memory then,
on one data directory per side that an untimed first start filled with its
measured decisions and exports (as a server's second start finds them). The
two sides alternate, round by round; medians are printed with the ratio.

The earlier revision runs from a ``git worktree`` of it with this checkout's
virtual environment; the editable install's finder is dropped so that
``layerbank`` imports from that tree (as bench/mutation.sh does).

    .venv/bin/python bench/serve_start.py --against e7e3de8            # embedded model, 5 rounds
    .venv/bin/python bench/serve_start.py --against HEAD~3 --model tests-tiny --rounds 7
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIM = "import sys\nsys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in getattr(f, '__module__', '')]\n"


def worktree(rev: str, where: Path) -> dict[str, str]:
    """A checkout of ``rev`` importable as ``layerbank``; the environment that selects it."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(where), rev],
                   check=True, capture_output=True)
    for pkg in ("app", "cache", "workers"):  # pyproject's package-dir mapping
        link = where / "layerbank" / pkg
        if not link.exists():
            link.symlink_to(f"../{pkg}")
    shim = where / ".shim"
    shim.mkdir(exist_ok=True)
    (shim / "sitecustomize.py").write_text(SHIM)
    return {"PYTHONPATH": f"{shim}:{where}"}


def _children(pid: int) -> list[int]:
    """The processes ``pid`` has started, from /proc (empty off Linux)."""
    out: list[int] = []
    for f in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out += [int(c) for c in f.read_text().split()]
        except OSError:
            pass
    return out


def _rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` in MB (nan when it cannot be read, or off Linux)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _has_child(pid: int) -> bool:
    """Whether ``pid`` has started a process (serve's worker), from /proc (Linux)."""
    return bool(_children(pid))


def start(data_dir: Path, model: str | None, env: dict[str, str],
          cwd: Path) -> tuple[float, float, float, float]:
    """Seconds until serve has started its worker (nan off Linux), until /health answers and
    until /ready is 200, and the worker's resident MB then; the server is stopped after."""
    (data_dir / "server.json").unlink(missing_ok=True)
    argv = [sys.executable, "-m", "layerbank.app.cli.main", "serve", "--data-dir", str(data_dir), "--port", "0"]
    if model:
        argv += ["--model", model]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("LAYERBANK_") and k != "PYTHONPATH"}
    full_env.update(env)
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    api = ready = 0.0
    spawned = float("nan")
    try:
        while not ready:
            if proc.poll() is not None or time.perf_counter() - t0 > 300:
                raise SystemExit(f"serve did not start (status {proc.returncode})")
            if spawned != spawned and _has_child(proc.pid):  # nan: not seen yet
                spawned = time.perf_counter() - t0
            try:
                meta = json.loads((data_dir / "server.json").read_text())
                base = f"http://127.0.0.1:{meta['port']}"
                if not api:
                    urllib.request.urlopen(base + "/health", timeout=5).read()
                    api = time.perf_counter() - t0
                urllib.request.urlopen(base + "/ready", timeout=5).read()  # raises on 503
                ready = time.perf_counter() - t0
            except (OSError, ValueError, KeyError):
                time.sleep(0.02)
        worker_mb = max((_rss_mb(c) for c in _children(proc.pid)), default=float("nan"))
    finally:
        proc.terminate()
        proc.wait(60)
    return spawned, api, ready, worker_mb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", required=True, help="the earlier revision (a commit, tag or HEAD~n)")
    ap.add_argument("--model", default=None,
                    help="a model directory; 'tests-tiny' builds the tests' tiny BERT; default the embedded one")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="layerbank-serve-start-"))
    model = args.model
    if model == "tests-tiny":
        sys.path.insert(0, str(ROOT))
        from tests.tiny_models import save_tiny_bert

        model = save_tiny_bert(work / "tiny", seed=0, hidden=32, layers=2)
    try:
        sides = {"this tree": ({}, ROOT), f"{args.against}": (worktree(args.against, work / "old"), work / "old")}
        dirs = {name: work / f"data-{i}" for i, name in enumerate(sides)}
        for name, (env, cwd) in sides.items():  # untimed: measured decisions and exports are made
            start(dirs[name], model, env, cwd)
        times: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in sides}
        print(f"serve start-up, {args.rounds} alternating rounds; {os.cpu_count()} CPUs, load "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; model {args.model or 'embedded'}", flush=True)
        for r in range(args.rounds):
            for name in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                spawned, api, ready, worker_mb = start(dirs[name], model, *sides[name])
                times[name].append((spawned, api, ready, worker_mb))
                print(f"  round {r + 1} {name}: worker started {spawned:.2f} s, API {api:.2f} s, "
                      f"/ready {ready:.2f} s, worker {worker_mb:.0f} MB resident", flush=True)
        med = {n: tuple(statistics.median(x[i] for x in t) for i in range(4)) for n, t in times.items()}
        for n, (w, a, b, m) in med.items():
            print(f"median {n}: worker started {w:.2f} s, API {a:.2f} s, /ready {b:.2f} s, worker {m:.0f} MB")
        new, old = med["this tree"][2], med[args.against][2]
        print(f"/ready: this tree {new:.2f} s vs {args.against} {old:.2f} s ({old / new:.2f}x); load after "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / "old")],
                       capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""README's first command: first run against a cached rerun (issue 14).

Takes the command from README.md itself (the first line of the first
```bash block, after ``bash scripts/install.sh &&``), and runs it as a user
would, in a subprocess from the repository root, into a fresh data
directory (``LAYERBANK_DATA_DIR``): once with nothing stored (torch import,
model load, encoding, shard write), then again with every text stored (the
catalog answers; torch is never imported). Wall time of the whole process,
best of ``--rounds`` fresh directories. Target: rerun < 2 s and >= 5x
faster than the first run, on the 2-core development machine.

Run from the repository root::

    .venv/bin/python bench/startup.py             # ~1 min on 2 busy cores
    .venv/bin/python bench/startup.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_first_command(readme: Path = ROOT / "README.md") -> str:
    """The first command line of README's first ```bash block."""
    block = re.search(r"```bash\n(.*?)```", readme.read_text(encoding="utf-8"), re.S)
    if block is None:
        raise SystemExit("README.md has no ```bash block")
    return next(line.strip() for line in block.group(1).splitlines()
                if line.strip() and not line.strip().startswith("#"))


def run_part(command: str) -> list[str]:
    """The part of the command that runs layerbank (the install step is done)."""
    parts = [p.strip() for p in command.split("&&")]
    if parts[0] != "bash scripts/install.sh" or len(parts) != 2:
        raise SystemExit(f"unexpected first command in README.md: {command!r}")
    return shlex.split(parts[1])


def timed(argv: list[str], data_dir: str) -> tuple[float, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYERBANK_")}
    env["LAYERBANK_DATA_DIR"] = data_dir
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{shlex.join(argv)} failed ({r.returncode}):\n{r.stderr}")
    return seconds, r.stdout


def encoded_line(stdout: str) -> str:
    return next((line for line in stdout.splitlines() if line.startswith("encoded")), "?")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="fresh data directories (best of)")
    args = ap.parse_args()
    command = readme_first_command()
    argv = run_part(command)
    print(f"README's first command: {command}")
    print(f"timed part:             {shlex.join(argv)} (cwd {ROOT.name}/, fresh data dir)")
    firsts, reruns = [], []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="lb-startup-") as tmp:
            first, out1 = timed(argv, tmp)
            rerun, out2 = timed(argv, tmp)
        firsts.append(first)
        reruns.append(rerun)
        print(f"round {i + 1}: first run {first:6.2f} s ({encoded_line(out1)}); "
              f"rerun {rerun:5.2f} s ({encoded_line(out2)})")
    best_first, best_rerun = min(firsts), min(reruns)
    load = os.getloadavg()
    print(f"best first run {best_first:.2f} s, best cached rerun {best_rerun:.2f} s: "
          f"{best_first / best_rerun:.1f}x (targets: rerun < 2 s, >= 5x)")
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
          f"Python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()

"""Choices made by measuring on the machine at hand, kept in the data directory.

Which engine (torch or ONNX Runtime) and which precision (fp32 or bf16) run
a model fastest depends on the CPU and the library versions far more than
on any flag a CPU reports: bf16 ran 0.68x fp32 on one AVX-512 BF16 VM and
2.2-3.5x on another (docs/precision.md). So ``auto`` times the candidates
on the model's own shapes once, writes what it measured to
``<data_dir>/measured/<kind>-<hash>.json`` (the hash is over the CPU model,
the library versions and the model fingerprint: anything that changes the
answer), and every later start reads that file instead of measuring again.
Delete the file to measure again.

The file is written to a temporary name and ``os.replace``d, so a crash
leaves either the old decision or none, never half of one; an unreadable
file is measured again.

Example::

    choice = measured_choice(data_dir, "engine", {"cpu": cpu_model(), ...},
                             measure=lambda: {"torch": 0.21, "onnx": 0.10},
                             pick=lambda s: ("onnx", s["torch"] / s["onnx"]))
    choice.choice, choice.ratio, choice.reused    # 'onnx', 2.1, False
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["Measured", "cpu_model", "measured_choice", "time_alternating"]


@dataclass(frozen=True)
class Measured:
    """One decision: what was chosen, by how much it won, from which timings.

    ``ratio`` is how much faster the candidate ran than the reference it was
    compared with (onnx over torch, bf16 over fp32): 2.0 means twice as fast,
    whichever was chosen. ``figures`` holds the median seconds of each
    candidate (and any accuracy figure the choice used). ``reused``: read from
    the data directory, not measured in this process.
    """

    kind: str
    choice: str
    ratio: float
    figures: dict[str, float]
    key: dict[str, str]
    reused: bool = False

    def as_info(self) -> dict[str, object]:
        """What /info and the CLI show."""
        return {"chosen": self.choice, "measured_ratio": round(self.ratio, 3),
                "figures": {k: round(v, 6) for k, v in self.figures.items()},
                "reused": self.reused, "machine": self.key.get("cpu", "")}


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ('unknown' off Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _path(directory: Path, kind: str, key: Mapping[str, str]) -> Path:
    digest = hashlib.sha256(json.dumps(dict(key), sort_keys=True).encode()).hexdigest()[:16]
    return directory / "measured" / f"{kind}-{digest}.json"


def _read(path: Path, kind: str, key: Mapping[str, str]) -> Measured | None:
    try:
        data = json.loads(path.read_text())
        found = Measured(**{**data, "reused": True})
    except (OSError, ValueError, TypeError):
        return None  # absent or unreadable: measure again
    return found if found.kind == kind and found.key == dict(key) else None


def _write(path: Path, measured: Measured) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({k: v for k, v in asdict(measured).items() if k != "reused"}, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def measured_choice(directory: str | os.PathLike[str] | None, kind: str, key: Mapping[str, str],
                    measure: Callable[[], dict[str, float]],
                    pick: Callable[[dict[str, float]], tuple[str, float]]) -> Measured:
    """The stored decision for ``(kind, key)``, or a fresh one from ``measure``.

    ``measure`` returns figures (seconds per candidate); ``pick`` turns them
    into (choice, ratio). ``directory`` None: measure every time, store nothing.
    """
    path = None if directory is None else _path(Path(directory), kind, key)
    if path is not None and (found := _read(path, kind, key)) is not None:
        return found
    figures = measure()
    choice, ratio = pick(figures)
    fresh = Measured(kind, choice, float(ratio), {k: float(v) for k, v in figures.items()}, dict(key))
    if path is not None:
        try:
            _write(path, fresh)
        except OSError:
            pass  # a read-only data directory: the choice still holds for this process
    return fresh


def time_alternating(runs: Mapping[str, Callable[[], object]], rounds: int = 3) -> dict[str, float]:
    """Median seconds of each callable, run in alternating rounds after one warm-up each.

    Alternating, so that a burst of load from elsewhere on a shared machine
    falls on every candidate rather than on whichever ran during it.
    """
    for fn in runs.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}

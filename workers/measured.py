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

The file is written to a temporary name, fsynced and ``os.replace``d, so a
crash leaves either the old decision or none, never half of one. It holds
the decision as ``{"payload": {...}, "sha256": <of the payload>}`` and is
verified when read: the checksum, then the schema (kind, a choice of that
kind's candidates, a finite positive ratio, finite figures, the key it was
made for). A file that fails either (half written, edited, bit-rotted: issue
25 found ``"ratio": "fast"`` made a restart loop and ``"choice": "fp16"``
stopped the server blaming ``--precision``) is named in one WARNING line
and measured again; never trusted, never fatal. A bare decision written
before the checksum existed is kept when it passes the schema (so an
upgrade does not re-measure, and so change, a stored precision) and
rewritten with its checksum.

Example::

    choice = measured_choice(data_dir, "engine", {"cpu": cpu_model(), ...},
                             measure=lambda: {"torch": 0.21, "onnx": 0.10},
                             pick=lambda s: ("onnx", s["torch"] / s["onnx"]))
    choice.choice, choice.ratio, choice.reused    # 'onnx', 2.1, False
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["CHOICES", "Measured", "cpu_model", "measured_choice", "stored_choice", "temp_name",
           "time_alternating"]

log = logging.getLogger("layerbank.measured")

# what each kind of decision may choose: anything else in a stored file is damage
CHOICES: dict[str, tuple[str, ...]] = {"engine": ("torch", "onnx"), "precision": ("fp32", "bf16")}


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


class _Damaged(ValueError):
    """A stored decision that fails its checksum or its schema; the message says which."""


def _digest(payload: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check(payload: object, kind: str) -> Measured:
    """The decision ``payload`` holds, or _Damaged naming the first field that is wrong."""
    if not isinstance(payload, dict):
        raise _Damaged(f"holds {type(payload).__name__}, not a decision")
    fields = {"kind", "choice", "ratio", "figures", "key"}
    if set(payload) != fields:
        raise _Damaged(f"has fields {sorted(payload)}, not {sorted(fields)}")
    if payload["kind"] != kind:
        raise _Damaged(f"kind {payload['kind']!r}, not {kind!r}")
    if payload["choice"] not in CHOICES.get(kind, ()):
        raise _Damaged(f"choice {payload['choice']!r} is not one of {', '.join(CHOICES.get(kind, ()))}")
    if not _finite(payload["ratio"]) or payload["ratio"] <= 0:
        raise _Damaged(f"ratio {payload['ratio']!r} is not a positive number")
    figures, key = payload["figures"], payload["key"]
    if not isinstance(figures, dict) or not all(isinstance(k, str) and _finite(v) for k, v in figures.items()):
        raise _Damaged(f"figures {figures!r} are not numbers by name")
    if not isinstance(key, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in key.items()):
        raise _Damaged(f"key {key!r} is not strings by name")
    return Measured(kind, str(payload["choice"]), float(payload["ratio"]),
                    {k: float(v) for k, v in figures.items()}, dict(key), reused=True)


def _read(path: Path, kind: str, key: Mapping[str, str]) -> Measured | None:
    """The verified decision in ``path``; None (measure again) when absent, damaged or another key's."""
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        log.warning("measured decision %s cannot be read (%s); measuring again", path, e)
        return None
    try:
        doc = json.loads(text)
        if isinstance(doc, dict) and "sha256" in doc:
            payload = doc.get("payload")
            if set(doc) != {"payload", "sha256"} or not isinstance(payload, dict) \
                    or doc["sha256"] != _digest(payload):
                raise _Damaged("fails its sha256 checksum")
            found = _check(payload, kind)
        else:  # written before decisions carried a checksum: kept if it passes the schema
            found = _check(doc, kind)
            try:
                _write(path, found)
                log.info("measured decision %s rewritten with its checksum", path)
            except OSError:
                pass  # a read-only data directory: still the decision, checked by its schema
    except (ValueError, OSError) as e:  # json's errors and _Damaged are ValueErrors
        log.warning("measured decision %s is damaged (%s); measuring again", path, e)
        return None
    return found if found.key == dict(key) else None


def temp_name(path: Path, pid: int | None = None) -> str:
    """The temporary name a file is written under before ``os.replace``: it carries the
    writer's pid, so a leftover of a killed process is told from one being written
    (``layerbank.cache.leftovers`` removes those whose process is dead)."""
    return f"{path.name}.{os.getpid() if pid is None else pid}-{os.urandom(4).hex()}.tmp"


def _write(path: Path, measured: Measured) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {k: v for k, v in asdict(measured).items() if k != "reused"}
    tmp = path.parent / temp_name(path)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"payload": payload, "sha256": _digest(payload)}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
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


def stored_choice(directory: str | os.PathLike[str], kind: str, key: Mapping[str, str]) -> Measured | None:
    """The verified decision stored for ``(kind, key)``, without measuring; None when there is none."""
    return _read(_path(Path(directory), kind, key), kind, key)


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

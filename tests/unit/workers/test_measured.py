"""workers/measured.py: a stored decision is trusted only whole, checksummed and of the right shape.

Torch-free and fast (the mutation run, bench/mutation.sh, runs it per mutant):
every way a stored decision can be wrong is measured again with one WARNING
naming the file; a good one is reused without measuring.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from layerbank.workers.measured import CHOICES, measured_choice, temp_name

KEY = {"cpu": "test CPU", "torch": "x"}


def _pick(figures: dict[str, float]) -> tuple[str, float]:
    ratio = figures["fp32"] / figures["bf16"]
    return ("bf16" if ratio >= 1.1 else "fp32"), ratio


class Timer:
    """A measurement that counts its calls."""

    def __init__(self, figures: dict[str, float]) -> None:
        self.figures, self.calls = figures, 0

    def __call__(self) -> dict[str, float]:
        self.calls += 1
        return dict(self.figures)


def _store(tmp_path: Path) -> Path:
    measured_choice(tmp_path, "precision", KEY, Timer({"fp32": 1.0, "bf16": 0.5}), _pick)
    [path] = (tmp_path / "measured").iterdir()
    return path


def _again(tmp_path: Path) -> tuple[Any, Timer]:
    timer = Timer({"fp32": 1.0, "bf16": 2.0})
    return measured_choice(tmp_path, "precision", KEY, timer, _pick), timer


def test_a_stored_decision_is_enveloped_checksummed_and_reused(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    path = _store(tmp_path)
    assert re.fullmatch(r"precision-[0-9a-f]{16}\.json", path.name)  # measured/<kind>-<hash>.json
    doc = json.loads(path.read_text())
    assert set(doc) == {"payload", "sha256"} and len(doc["sha256"]) == 64
    assert doc["payload"] == {"kind": "precision", "choice": "bf16", "ratio": 2.0,
                              "figures": {"fp32": 1.0, "bf16": 0.5}, "key": KEY}
    with caplog.at_level(logging.INFO, logger="layerbank"):
        found, timer = _again(tmp_path)
    assert timer.calls == 0 and found.reused and found.choice == "bf16" and found.ratio == 2.0
    assert found.figures == {"fp32": 1.0, "bf16": 0.5} and found.key == KEY
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temp file left


DAMAGE: list[tuple[str, Any, str]] = [  # (id, fields changed, what the WARNING says, as a regex)
    ("ratio-str", {"ratio": "fast"}, r"ratio 'fast' is not a positive number"),
    ("ratio-zero", {"ratio": 0.0}, r"ratio 0\.0 is not a positive number"),
    ("ratio-negative", {"ratio": -2.0}, r"ratio -2\.0 is not a positive number"),
    ("ratio-bool", {"ratio": True}, r"ratio True is not a positive number"),
    ("ratio-nan", {"ratio": float("nan")}, r"ratio nan is not a positive number"),
    ("choice-nonsense", {"choice": "nonsense"}, r"choice 'nonsense' is not one of fp32, bf16"),
    ("choice-fp16", {"choice": "fp16"}, r"choice 'fp16' is not one of fp32, bf16"),
    ("kind", {"kind": "engine"}, r"kind 'engine', not 'precision'"),
    ("figures-str", {"figures": {"fp32": "slow"}}, r"figures \{'fp32': 'slow'\} are not numbers by name"),
    ("figures-list", {"figures": [1.0]}, r"figures \[1\.0\] are not numbers by name"),
    ("figures-inf", {"figures": {"fp32": float("inf")}}, r"figures \{'fp32': inf\} are not numbers by name"),
    ("key-number", {"key": {"cpu": 3}}, r"key \{'cpu': 3\} is not strings by name"),
    ("key-list", {"key": ["cpu"]}, r"key \['cpu'\] is not strings by name"),
    ("extra-field", {"surprise": 1},
     (r"has fields \['choice', 'figures', 'key', 'kind', 'ratio', 'surprise'\], "
      r"not \['choice', 'figures', 'key', 'kind', 'ratio'\]")),
]


@pytest.mark.parametrize(("changes", "why"), [(c, w) for _, c, w in DAMAGE], ids=[i for i, _, _ in DAMAGE])
@pytest.mark.parametrize("checksum", ["kept", "recomputed"])
def test_every_damage_is_named_and_measured_again(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                  changes: dict[str, Any], why: str, checksum: str) -> None:
    """Edited by hand (the checksum fails) or by someone who also fixed the checksum (the schema fails)."""
    from layerbank.workers.measured import _digest

    path = _store(tmp_path)
    doc = json.loads(path.read_text())
    doc["payload"].update(changes)
    if checksum == "recomputed":
        doc["sha256"] = _digest(doc["payload"])
    path.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="layerbank"):
        found, timer = _again(tmp_path)
    assert timer.calls == 1 and not found.reused and found.choice == "fp32"
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    why = why if checksum == "recomputed" else "fails its sha256 checksum"
    assert re.fullmatch(rf"measured decision {re.escape(str(path))} is damaged \({why}\); measuring again", line)
    stored = json.loads(path.read_text())  # stored again, whole
    assert stored["payload"]["choice"] == "fp32" and stored["sha256"] == _digest(stored["payload"])


def test_a_checksummed_file_with_more_than_its_two_fields_is_damage(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    from layerbank.workers.measured import _digest

    path = _store(tmp_path)
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "sha256": _digest(doc["payload"]), "note": "edited"}))
    with caplog.at_level(logging.WARNING, logger="layerbank"):
        _, timer = _again(tmp_path)
    assert timer.calls == 1 and "fails its sha256 checksum" in caplog.text


def test_a_slower_candidate_is_a_valid_decision_and_a_new_directory_is_made(tmp_path: Path) -> None:
    """bf16 at 0.68x fp32 (ratio under 1) is a decision like any other: reused, not re-measured."""
    data = tmp_path / "not" / "made" / "yet"
    first = measured_choice(data, "precision", KEY, Timer({"fp32": 0.68, "bf16": 1.0}), _pick)
    assert first.choice == "fp32" and first.ratio == pytest.approx(0.68)
    found, timer = _again(data)
    assert timer.calls == 0 and found.reused and found.ratio == pytest.approx(0.68)


def test_time_alternating_runs_each_once_to_warm_up_then_in_rounds() -> None:
    from layerbank.workers.measured import time_alternating

    order: list[str] = []
    figures = time_alternating({"a": lambda: order.append("a"), "b": lambda: order.append("b")})
    assert order == ["a", "b"] + ["a", "b"] * 3  # a warm-up each, then alternating rounds
    assert set(figures) == {"a", "b"} and all(0.0 <= v < 0.5 for v in figures.values())
    order.clear()
    time_alternating({"a": lambda: order.append("a")}, rounds=1)
    assert order == ["a", "a"]


@pytest.mark.parametrize(("content", "why"), [
    (b'{"payload": {"kind": "precision", "cho', " is damaged (Unterminated string"),  # half a file
    (b"\x89PNG\r\n\x1a\n\xff\xfe", " cannot be read ('utf-8' codec can't decode"),  # not UTF-8
    (b"[1, 2]", " is damaged (holds list, not a decision); "),
    (b'{"payload": {}, "sha256": "0", "more": 1}', " is damaged (fails its sha256 checksum); "),
    (b'{"payload": [], "sha256": "0"}', " is damaged (fails its sha256 checksum); "),
])
def test_an_unreadable_file_is_named_and_measured_again(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                       content: bytes, why: str) -> None:
    path = _store(tmp_path)
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="layerbank"):
        found, timer = _again(tmp_path)
    assert timer.calls == 1 and found.choice == "fp32"
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert str(path) in line and line.endswith("; measuring again")
    assert f"{path}{why}" in line  # the words, as they are


def test_a_bare_decision_of_an_older_version_is_kept_and_rewritten_with_its_checksum(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _store(tmp_path)
    payload = json.loads(path.read_text())["payload"]
    path.write_text(json.dumps(payload))  # as written before decisions carried a checksum
    with caplog.at_level(logging.INFO, logger="layerbank"):
        found, timer = _again(tmp_path)
    assert timer.calls == 0 and found.reused and found.choice == "bf16"  # the stored precision holds
    assert [r.getMessage() for r in caplog.records] == [f"measured decision {path} rewritten with its checksum"]
    assert json.loads(path.read_text())["payload"] == payload
    bad = {**payload, "choice": "fp16"}
    path.write_text(json.dumps(bad))  # a bare one must pass the schema too
    found, timer = _again(tmp_path)
    assert timer.calls == 1 and found.choice == "fp32"


def test_another_key_is_another_decision_and_no_directory_stores_nothing(tmp_path: Path) -> None:
    path = _store(tmp_path)
    other = Timer({"fp32": 1.0, "bf16": 0.5})
    found = measured_choice(tmp_path, "precision", {**KEY, "cpu": "other"}, other, _pick)
    assert other.calls == 1 and found.choice == "bf16" and len(list(path.parent.iterdir())) == 2
    # a file whose key differs from its name's (copied from another machine): measured again
    doc = json.loads(path.read_text())
    doc["payload"]["key"] = {**KEY, "cpu": "elsewhere"}
    from layerbank.workers.measured import _digest

    doc["sha256"] = _digest(doc["payload"])
    path.write_text(json.dumps(doc))
    _, timer = _again(tmp_path)
    assert timer.calls == 1
    none = Timer({"fp32": 1.0, "bf16": 0.5})
    measured_choice(None, "precision", KEY, none, _pick)
    measured_choice(None, "precision", KEY, none, _pick)
    assert none.calls == 2


def test_choices_and_temp_names() -> None:
    assert CHOICES == {"engine": ("torch", "onnx"), "precision": ("fp32", "bf16")}
    name = temp_name(Path("/d/precision-ab.json"), pid=123)
    assert name.startswith("precision-ab.json.123-") and name.endswith(".tmp") and len(name) == len(
        "precision-ab.json.123-") + 8 + 4
    assert temp_name(Path("x")) != temp_name(Path("x"))


def test_as_info_is_what_info_and_the_cli_show() -> None:
    import dataclasses

    from layerbank.workers.measured import Measured

    m = Measured("precision", "bf16", 2.123456, {"fp32": 1.23456789, "bf16": 0.5}, {"cpu": "C"}, reused=True)
    assert m.as_info() == {"chosen": "bf16", "measured_ratio": 2.123, "figures": {"fp32": 1.234568, "bf16": 0.5},
                           "reused": True, "machine": "C"}
    fresh = Measured("engine", "torch", 1.0, {}, {})
    assert fresh.reused is False and fresh.as_info()["machine"] == ""
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.choice = "fp32"  # type: ignore[misc]


def test_cpu_model_is_the_model_name_line() -> None:
    from layerbank.workers.measured import cpu_model

    info = Path("/proc/cpuinfo")
    names = [ln.split(":", 1)[1].strip() for ln in info.read_text().splitlines()
             if ln.startswith("model name")] if info.exists() else []
    assert cpu_model() == (names[0] if names else "unknown")

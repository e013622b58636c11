"""``--engine`` and ``--precision`` as the encoder's info reports them (workers/engines/choice.py),
and one real measurement end to end on the tiny model (no timing replaced).

test_precision_calibration.py injects the timings to steer each decision; here
what is stored and shown is checked, and what is not measured is not opened.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("onnxruntime")

from layerbank.workers.engines import choice  # noqa: E402
from layerbank.workers.engines.choice import choices_line  # noqa: E402
from tests.engine_timings import fake_timings  # noqa: E402


def _load(tiny_model_dir: str, data_dir: Path, **kw: Any) -> Any:
    from layerbank.workers.encoder import Encoder

    return Encoder.load(tiny_model_dir, device="cpu", data_dir=data_dir, **kw)


def _stored(data_dir: Path, kind: str) -> dict[str, Any]:
    [path] = (data_dir / "measured").glob(f"{kind}-*.json")
    payload: dict[str, Any] = json.loads(path.read_text())["payload"]
    return payload


def test_engine_torch_measures_nothing_and_says_torch(tiny_model_dir: str, tmp_path: Path) -> None:
    enc = _load(tiny_model_dir, tmp_path, engine="torch")
    assert enc.engine is None and enc.info["engine"] == "torch" and "engine_choice" not in enc.info
    assert not (tmp_path / "measured").exists() and not (tmp_path / "engines").exists()
    assert choices_line(enc.info) == "engine torch, precision fp32"


def test_engine_onnx_asked_for_is_opened_and_said_so(tiny_model_dir: str, tmp_path: Path) -> None:
    enc = _load(tiny_model_dir, tmp_path, engine="onnx")
    assert enc.engine is not None and enc.engine.name == "onnx"
    assert enc.info["engine"] == "onnx"
    assert enc.info["engine_choice"] == {"chosen": "onnx", "reason": "asked for"}
    assert not (tmp_path / "measured").exists()  # asked for: nothing measured


def test_another_engine_is_only_for_fp32_on_a_cpu(tiny_model_dir: str, tmp_path: Path) -> None:
    """bf16 runs on torch: --engine onnx or auto with --precision bf16 opens no ONNX export."""
    for engine in ("onnx", "auto"):
        enc = _load(tiny_model_dir, tmp_path / engine, engine=engine, precision="bf16")
        assert enc.engine is None and enc.info["engine"] == "torch" and "engine_choice" not in enc.info
        assert enc.config.precision == "bf16" and not (tmp_path / engine / "engines").exists()


def test_engine_auto_reports_what_it_measured_and_keys_the_precision_by_that_engine(
        tiny_model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_timings(monkeypatch, {"torch": 1.0, "onnx": 0.5, "fp32": 1.0, "bf16": 0.95})
    enc = _load(tiny_model_dir, tmp_path, engine="auto", precision="auto")
    got = enc.info["engine_choice"]
    assert got["reason"] == "measured: onnx / torch speed" and got["chosen"] == "onnx"
    assert got["measured_ratio"] == 2.0 and got["reused"] is False
    assert enc.info["precision_choice"]["reason"] == "measured: bf16 / fp32 speed"
    assert _stored(tmp_path, "precision")["key"]["fp32_engine"] == "onnx"  # fp32 was timed on onnx
    assert _stored(tmp_path, "engine")["key"]["onnxruntime"]


def test_bf16_past_the_accuracy_bound_is_not_chosen_however_fast(
        tiny_model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows' relative L2 difference is measured on the calibration batches and stored; past
    BF16_MAX_REL_L2 fp32 is kept (docs/precision.md, "Tolerance")."""
    fake_timings(monkeypatch, {"fp32": 1.0, "bf16": 0.2})
    fast = _load(tiny_model_dir, tmp_path / "a", precision="auto")
    worst = _stored(tmp_path / "a", "precision")["figures"]["bf16_max_rel_l2"]
    import numpy as np

    fp32 = _load(tiny_model_dir, tmp_path / "c")
    bf16 = fp32.with_precision("bf16")
    mine = 0.0
    for batch in choice.sample_batches(fp32):  # the calibration batches; the largest row's ||b - a|| / ||a||
        a, b = (e.encode(batch).pooled[fp32.poolings[0]] for e in (fp32, bf16))
        mine = max(mine, float((np.linalg.norm(b - a, axis=-1) / np.linalg.norm(a, axis=-1)).max()))
    assert worst == pytest.approx(mine, rel=1e-6) and 0 < worst < 0.02 and fast.config.precision == "bf16"
    monkeypatch.setattr(choice, "BF16_MAX_REL_L2", worst / 2)
    strict = _load(tiny_model_dir, tmp_path / "b", precision="auto")
    assert strict.config.precision == "fp32" and strict.info["precision_choice"]["measured_ratio"] == 5.0


def test_a_real_measurement_stores_positive_timings_and_follows_its_ratio(tiny_model_dir: str,
                                                                         tmp_path: Path) -> None:
    """No timing replaced: both engines and both precisions run the calibration batches."""
    enc = _load(tiny_model_dir, tmp_path, engine="auto", precision="auto")
    engine, precision = _stored(tmp_path, "engine"), _stored(tmp_path, "precision")
    assert set(engine["figures"]) == {"torch", "onnx"} and all(v > 0 for v in engine["figures"].values())
    assert engine["ratio"] == pytest.approx(engine["figures"]["torch"] / engine["figures"]["onnx"])
    assert engine["choice"] == ("onnx" if engine["ratio"] >= choice.ENGINE_MARGIN else "torch")
    assert enc.info["engine_choice"]["chosen"] == engine["choice"]
    assert set(precision["figures"]) == {"fp32", "bf16", "bf16_max_rel_l2"}
    assert precision["choice"] == enc.config.precision


def test_an_onnx_engine_that_cannot_be_used_stops_when_asked_for_and_falls_back_on_auto(
        tiny_model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from layerbank.workers.encoder import ModelLoadError
    from layerbank.workers.engines.onnx import EngineMismatch, OnnxEngine

    def refuse(*args: object, **kwargs: object) -> OnnxEngine:
        raise EngineMismatch("differs by 0.3")

    monkeypatch.setattr(OnnxEngine, "open", refuse)
    with pytest.raises(ModelLoadError) as e:
        _load(tiny_model_dir, tmp_path, engine="onnx")
    assert str(e.value) == f"--engine onnx cannot be used for {tiny_model_dir!r}: differs by 0.3"
    with caplog.at_level(logging.INFO, logger="layerbank.engines"):
        enc = _load(tiny_model_dir, tmp_path, engine="auto")
    warned = [(r.name, r.getMessage()) for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [("layerbank.engines", "engine auto: ONNX Runtime not used (differs by 0.3); running torch")]
    assert enc.engine is None and enc.info["engine"] == "torch"
    assert enc.info["engine_choice"] == {"chosen": "torch", "reason": "onnx unavailable: differs by 0.3"}
    assert choices_line(enc.info) == "engine torch, precision fp32"


def test_bf16_chosen_over_a_faster_engine_runs_on_torch_and_keeps_every_mode(
        tiny_model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    fake_timings(monkeypatch, {"torch": 1.0, "onnx": 0.5, "fp32": 1.0, "bf16": 0.2})
    with caplog.at_level(logging.INFO, logger="layerbank.engines"):
        enc = _load(tiny_model_dir, tmp_path, engine="auto", precision="auto")
    assert enc.config.precision == "bf16" and enc.engine is None and enc.info["engine"] == "torch"
    line = "engine torch (onnx ran 2.00x torch), precision bf16 (bf16 ran 5.00x fp32)"
    assert choices_line(enc.info) == line
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO][-1] == line
    # every mode the device runs stays known beside auto (the API makes the keys of each from it)
    assert {"fp32", "bf16", "auto"} <= set(enc.info["precision_modes"]) and enc.info["precision_modes"]["auto"] == "bf16"


def test_a_reused_decision_says_stored(tiny_model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_timings(monkeypatch, {"torch": 1.0, "onnx": 0.5, "fp32": 1.0, "bf16": 0.95})
    _load(tiny_model_dir, tmp_path, engine="auto", precision="auto")
    again = _load(tiny_model_dir, tmp_path, engine="auto", precision="auto")
    assert choices_line(again.info) == ("engine onnx (onnx ran 2.00x torch, stored), "
                                        "precision fp32 (bf16 ran 1.05x fp32, stored)")

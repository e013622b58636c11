"""``--precision auto`` and ``--engine auto`` decide by a measurement, store it, and reuse it.

The timings are injected (``time_alternating`` replaced), so each test
controls what was "measured" and checks the decision follows it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from layerbank.workers.engines import choice
from layerbank.workers.engines.choice import pick_engine, pick_precision
from layerbank.workers.measured import measured_choice
from tests.engine_timings import fake_timings


def test_the_faster_precision_wins_only_by_a_clear_margin_and_within_tolerance() -> None:
    assert pick_precision({"fp32": 1.0, "bf16": 0.4, "bf16_max_rel_l2": 0.004}) == ("bf16", 2.5)
    assert pick_precision({"fp32": 1.0, "bf16": 1.47, "bf16_max_rel_l2": 0.004})[0] == "fp32"  # 0.68x
    assert pick_precision({"fp32": 1.0, "bf16": 0.95, "bf16_max_rel_l2": 0.004})[0] == "fp32"  # noise
    # fast but past the documented 2% (docs/precision.md): the numbers matter more
    assert pick_precision({"fp32": 1.0, "bf16": 0.4, "bf16_max_rel_l2": 0.05})[0] == "fp32"
    assert pick_engine({"torch": 1.0, "onnx": 0.49}) == ("onnx", pytest.approx(2.0408, abs=1e-3))
    assert pick_engine({"torch": 1.0, "onnx": 1.2})[0] == "torch"


def test_each_margin_decides_at_its_documented_value_exactly() -> None:
    # at the margin the faster one is taken, a hair under it is not (docs/precision.md: onnx
    # at 1.05x, bf16 at 1.10x and within 2% relative L2); >= against > is one character
    assert pick_engine({"torch": 1.05, "onnx": 1.0})[0] == "onnx"
    assert pick_engine({"torch": 1.0499, "onnx": 1.0})[0] == "torch"
    assert pick_precision({"fp32": 1.1, "bf16": 1.0, "bf16_max_rel_l2": 0.004})[0] == "bf16"
    assert pick_precision({"fp32": 1.0999, "bf16": 1.0, "bf16_max_rel_l2": 0.004})[0] == "fp32"
    assert pick_precision({"fp32": 2.0, "bf16": 1.0, "bf16_max_rel_l2": 0.02})[0] == "bf16"
    assert pick_precision({"fp32": 2.0, "bf16": 1.0, "bf16_max_rel_l2": 0.0201})[0] == "fp32"


def test_auto_follows_the_measurement_and_the_next_start_reuses_it(
        tiny_model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from layerbank.workers.encoder import Encoder

    calls = fake_timings(monkeypatch, {"torch": 1.0, "onnx": 0.5, "fp32": 0.5, "bf16": 0.2})
    enc = Encoder.load(tiny_model_dir, device="cpu", precision="auto", engine="auto", data_dir=tmp_path)
    assert calls == [("torch", "onnx"), ("fp32", "bf16")]
    assert enc.config.precision == "bf16" and enc.engine is None  # bf16 runs on torch
    assert enc.info["precision"] == "bf16" and enc.info["precision_modes"]["auto"] == "bf16"
    assert enc.info["precision_choice"]["measured_ratio"] == 2.5
    assert enc.info["precision_choice"]["reused"] is False
    assert enc.info["engine_choice"]["chosen"] == "onnx"
    assert enc.info["engine_choice"]["measured_ratio"] == 2.0
    assert enc.with_precision("auto") is enc  # a job asking for auto gets the measured mode
    stored = sorted(p.name.split("-")[0] for p in (tmp_path / "measured").iterdir())
    assert stored == ["engine", "precision"]

    # the next start: other timings would now say fp32, but nothing is measured again
    calls.clear()
    fake_timings(monkeypatch, {"torch": 1.0, "onnx": 2.0, "fp32": 0.2, "bf16": 1.0})
    again = Encoder.load(tiny_model_dir, device="cpu", precision="auto", engine="auto", data_dir=tmp_path)
    assert calls == []
    assert again.config.precision == "bf16"
    assert again.info["precision_choice"]["reused"] is True
    assert again.info["precision_choice"]["measured_ratio"] == 2.5


def test_slower_bf16_keeps_fp32_on_the_faster_engine(
        tiny_model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from layerbank.workers.encoder import Encoder
    from layerbank.workers.engines.choice import choices_line

    fake_timings(monkeypatch, {"torch": 1.0, "onnx": 0.5, "fp32": 0.5, "bf16": 0.735})
    enc = Encoder.load(tiny_model_dir, device="cpu", precision="auto", engine="auto", data_dir=tmp_path)
    assert enc.config.precision == "fp32" and enc.info["engine"] == "onnx"
    assert enc.info["precision_modes"]["auto"] == "fp32"
    assert choices_line(enc.info) == "engine onnx (onnx ran 2.00x torch), precision fp32 (bf16 ran 0.68x fp32)"


def test_an_unreadable_stored_decision_is_measured_again(tmp_path: Path) -> None:
    key = {"cpu": "test CPU", "torch": "x"}
    first = measured_choice(tmp_path, "precision", key, lambda: {"fp32": 1.0, "bf16": 0.5}, pick_precision)
    path = next((tmp_path / "measured").iterdir())
    assert json.loads(path.read_text())["payload"]["choice"] == "bf16" == first.choice
    path.write_text('{"kind": "precision", "cho')  # half a file
    again = measured_choice(tmp_path, "precision", key, lambda: {"fp32": 1.0, "bf16": 2.0}, pick_precision)
    assert again.choice == "fp32" and not again.reused
    # another CPU model is another decision
    other = measured_choice(tmp_path, "precision", {**key, "cpu": "other"},
                            lambda: {"fp32": 1.0, "bf16": 0.5}, pick_precision)
    assert other.choice == "bf16" and len(list((tmp_path / "measured").iterdir())) == 2


def test_the_calibration_batches_are_two_lengths_the_model_takes_one_row_of_each_padded(tiny_encoder) -> None:  # type: ignore[no-untyped-def]
    """What is timed (docs/precision.md): ~512 tokens at a short and a long length within the
    model's maximum (64 for the tiny model: 32 and 64), the last row of each shorter."""
    short, long = choice.sample_batches(tiny_encoder)
    assert (len(short.input_ids), len(long.input_ids)) == (16, 8)  # 512 // 32, 512 // 64
    for batch, length in ((short, 32), (long, 64)):
        *full, padded = batch.lengths
        # decoded word pieces tokenize again into as many or a few more; the model's 64 cut the rest
        assert all(length <= n <= min(length + 4, 64) for n in full), (length, batch.lengths)
        assert (length - 2) * 3 // 4 + 2 <= padded <= (length - 2) * 3 // 4 + 5 and padded < min(full)
    again = choice.sample_batches(tiny_encoder)
    assert again[0].input_ids == short.input_ids and again[1].input_ids == long.input_ids  # seeded
    assert choice.sample_batches(tiny_encoder, seed=1)[0].input_ids != short.input_ids


def test_a_decision_is_kept_per_model_length_and_thread_count(
        tiny_model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stored decision's key: another max length or thread count is another measurement."""
    import torch

    from layerbank.workers.encoder import Encoder

    calls = fake_timings(monkeypatch, {"fp32": 1.0, "bf16": 0.5})
    Encoder.load(tiny_model_dir, device="cpu", precision="auto", data_dir=tmp_path)
    Encoder.load(tiny_model_dir, device="cpu", precision="auto", data_dir=tmp_path)
    assert len(calls) == 1  # the same machine, model and settings: reused
    Encoder.load(tiny_model_dir, device="cpu", precision="auto", max_length=16, data_dir=tmp_path)
    assert len(calls) == 2
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        Encoder.load(tiny_model_dir, device="cpu", precision="auto", data_dir=tmp_path)
    finally:
        torch.set_num_threads(threads)
    assert len(calls) == 3 and len(list((tmp_path / "measured").iterdir())) == 3
    keys = [json.loads(p.read_text())["payload"]["key"] for p in (tmp_path / "measured").iterdir()]
    assert all(k["model"].startswith("local:") and k["torch"] == torch.__version__ and k["cpu"] for k in keys)
    assert sorted(k["max_length"] for k in keys) == ["16", "64", "64"]
    assert all(k["fp32_engine"] == "torch" for k in keys)

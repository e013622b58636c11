"""A start on the ONNX export an earlier start checked (workers/quick_start.py).

The tiny random BERT, a real export and ONNX Runtime session, real records on
disk. The second start must serve the rows torch gives without importing
transformers' modeling code, read the weights only when something needs
them, and take the usual path at any doubt about what it would start from.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from layerbank.workers.deferred_model import DeferredModel  # noqa: E402
from layerbank.workers.encoder import Encoder  # noqa: E402
from layerbank.workers.engines import onnx as onnx_engine  # noqa: E402
from layerbank.workers.engines.onnx import check_path, export_path, record_path  # noqa: E402

TEXTS = ["a short text", "another one, a little longer than the first", "x"]


def _load(model_dir: str, data: Path, **kw: Any) -> Any:
    return Encoder.load(model_dir, device="cpu", data_dir=data, **{"engine": "onnx", **kw})


def _rows(enc: Any) -> np.ndarray:
    return enc.encode(enc.tokenize(TEXTS)).pooled["mean"]


def _close(got: np.ndarray, want: np.ndarray, tol: float = 1e-4) -> bool:
    return float(np.abs(got - want).max() / np.abs(want).max()) < tol


@pytest.fixture
def checked(tiny_model_dir: str, tmp_path: Path) -> tuple[Path, Path]:
    """A data directory whose export a first start checked; the export's path."""
    data = tmp_path / "data"
    first = _load(tiny_model_dir, data)
    assert isinstance(first.model, torch_module())  # the first start reads the weights
    return data, export_path(data, first.fingerprint)


def torch_module() -> type:
    import torch

    return torch.nn.Module


def test_the_first_start_records_its_check_and_the_models_facts(tiny_model_dir: str,
                                                                checked: tuple[Path, Path]) -> None:
    _, path = checked
    doc = json.loads(check_path(path).read_text())
    payload = doc["payload"]
    exported = json.loads(record_path(path).read_text())["payload"]
    assert payload["file_sha256"] == exported["file_sha256"]
    assert payload["weights_sha256"] == exported["weights_sha256"]
    assert payload["worst_relative_difference"] <= 1e-4
    facts = payload["facts"]
    # the tiny model: 2 layers, 32 wide, 64 positions (tests/tiny_models.py)
    assert (facts["num_layers"], facts["n_hidden_states"], facts["hidden_size"]) == (2, 3, 32)
    assert facts["model_max_length"] == 64 and facts["architecture"] == "BertModel"
    assert facts["regimes_layout"]["n_layers"] == 2


def test_a_second_start_serves_torchs_rows_without_transformers_modeling_code(
        tiny_model_dir: str, checked: tuple[Path, Path]) -> None:
    data, _ = checked
    script = (
        "import json, sys\n"
        "from layerbank.workers.encoder import Encoder\n"
        f"enc = Encoder.load({tiny_model_dir!r}, device='cpu', engine='onnx', data_dir={str(data)!r})\n"
        f"rows = enc.encode(enc.tokenize({TEXTS!r})).pooled['mean']\n"
        "print(json.dumps({'model': type(enc.model).__name__, 'loaded': enc.model.loaded,\n"
        "    'modeling': sorted(m for m in sys.modules if m.startswith('transformers.models.bert.modeling')),\n"
        "    'info': {k: v for k, v in enc.info.items() if k != 'regimes_layout'}, 'rows': rows.tolist()}))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert (got["model"], got["loaded"], got["modeling"]) == ("DeferredModel", False, [])
    assert got["info"]["engine"] == "onnx" and got["info"]["started_from"] == "onnx check"
    torch_enc = Encoder.load(tiny_model_dir, device="cpu", engine="torch")
    for k in ("num_layers", "hidden_size", "n_params", "n_bias_params", "max_length", "architecture"):
        assert got["info"][k] == torch_enc.info[k], k
    assert _close(np.asarray(got["rows"], dtype=np.float32), _rows(torch_enc))


def test_the_weights_are_read_on_first_use_once(tiny_model_dir: str, checked: tuple[Path, Path]) -> None:
    data, _ = checked
    enc = _load(tiny_model_dir, data)
    assert isinstance(enc.model, DeferredModel) and not enc.model.loaded
    _rows(enc)  # fp32 rows: ONNX Runtime alone
    assert not enc.model.loaded
    bf16 = enc.with_precision("bf16")  # runs on torch: the weights now
    rows = _rows(bf16)
    assert enc.model.loaded and bf16.torch_model() is enc.torch_model()
    want = _rows(Encoder.load(tiny_model_dir, device="cpu", engine="torch", precision="bf16"))
    assert _close(rows, want, 1e-6)


def test_the_weights_read_later_are_refused_when_the_files_changed(tiny_model_dir: str, tmp_path: Path) -> None:
    import shutil

    model = Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))
    _load(str(model), tmp_path / "data")
    enc = _load(str(model), tmp_path / "data")
    assert isinstance(enc.model, DeferredModel)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "layer_norm_eps": 1e-5}))
    from layerbank.workers.model_source import ModelLoadError

    with pytest.raises(ModelLoadError, match="its files changed since this worker started on their ONNX export"):
        enc.torch_model()


def _flip_a_bit(p: Path) -> None:
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0x01
    p.write_bytes(bytes(b))


def _edit_a_digit(p: Path) -> None:
    """One hex digit of the recorded graph sha256 changed, the checksum left as it was."""
    text = p.read_text()
    i = text.index('"file_sha256": "') + len('"file_sha256": "')
    p.write_text(text[:i] + ("1" if text[i] == "0" else "0") + text[i + 1:])


def _resign(p: Path, **changes: Any) -> None:
    payload = {**json.loads(p.read_text())["payload"], **changes}
    p.write_text(json.dumps({"payload": payload, "sha256": onnx_engine._digest(payload)}))


@pytest.mark.parametrize("doubt, warning", [
    ("check record removed", None),
    ("check record edited", "fails its checksum"),
    ("check record of another onnxruntime", None),
    ("check record of other weights", "of another graph (weights_sha256 abababababababab..."),
    ("graph bit flipped", "fails its sha256 checksum"),
])
def test_any_doubt_takes_the_usual_path_and_records_the_check_again(
        tiny_model_dir: str, checked: tuple[Path, Path], caplog: pytest.LogCaptureFixture,
        doubt: str, warning: str | None) -> None:
    data, path = checked
    check = check_path(path)
    if doubt == "check record removed":
        check.unlink()
    elif doubt == "check record edited":
        _edit_a_digit(check)
    elif doubt == "check record of another onnxruntime":
        _resign(check, onnxruntime="0.0.1")
    elif doubt == "check record of other weights":
        _resign(check, weights_sha256="ab" * 32)
    else:
        _flip_a_bit(path)
    with caplog.at_level(logging.INFO, logger="layerbank"):
        enc = _load(tiny_model_dir, data)
    assert not isinstance(enc.model, DeferredModel), doubt  # the weights, read now
    assert enc.info["engine"] == "onnx" and "started_from" not in enc.info
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if warning is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and warning in warnings[0], warnings
    assert _close(_rows(enc), _rows(Encoder.load(tiny_model_dir, device="cpu", engine="torch")))
    # checked again against torch and recorded: the next start is quick again
    assert isinstance(_load(tiny_model_dir, data).model, DeferredModel)


@pytest.mark.parametrize("settings", [{"engine": "torch"}, {"precision": "bf16"}, {"engine": "auto"}])
def test_settings_or_decisions_that_lead_to_torch_read_the_weights(
        tiny_model_dir: str, checked: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch,
        settings: dict[str, str]) -> None:
    data, _ = checked
    if settings.get("engine") == "auto":  # measured here as torch the faster: stored, then read
        from tests.engine_timings import fake_timings

        fake_timings(monkeypatch, {"torch": 1.0, "onnx": 2.0})
        assert _load(tiny_model_dir, data, **settings).info["engine"] == "torch"
    enc = _load(tiny_model_dir, data, **settings)
    assert not isinstance(enc.model, DeferredModel)
    assert enc.info["engine"] == "torch"


def test_engine_auto_stored_as_onnx_starts_quickly_and_says_what_was_measured(
        tiny_model_dir: str, checked: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    data, _ = checked
    from tests.engine_timings import fake_timings

    fake_timings(monkeypatch, {"torch": 2.0, "onnx": 1.0, "fp32": 1.0, "bf16": 2.0})
    first = _load(tiny_model_dir, data, engine="auto", precision="auto")  # measures, stores
    assert first.info["engine"] == "onnx" and not isinstance(first.model, DeferredModel)
    enc = _load(tiny_model_dir, data, engine="auto", precision="auto")
    assert isinstance(enc.model, DeferredModel)
    assert enc.info["engine_choice"] == {**first.info["engine_choice"], "reused": True}
    assert enc.info["precision_choice"] == {**first.info["precision_choice"], "reused": True}
    assert enc.info["precision_modes"]["auto"] == "fp32"


def test_the_model_pool_counts_the_weights_once_they_are_read(tiny_model_dir: str,
                                                              checked: tuple[Path, Path]) -> None:
    from layerbank.workers.model_pool import ModelPool

    data, path = checked
    enc = _load(tiny_model_dir, data)
    pool = ModelPool(enc, [], load=lambda entry: None, budget_bytes=None)
    assert pool.used_bytes == path.stat().st_size  # ONNX Runtime's copy of the weights only
    model = enc.torch_model()
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    assert pool.used_bytes == 2 * weights  # both copies, as for an encoder loaded the usual way

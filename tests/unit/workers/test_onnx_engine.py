"""The ONNX Runtime engine gives the torch engine's rows, and its export is cached safely.

Tiny random BERT (tests/conftest.py); the bundled model is compared in
tests/integration/test_engines.py.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from layerbank.workers.engines.onnx import EngineMismatch, OnnxEngine, export_path  # noqa: E402

TEXTS = ["a short one", "a somewhat longer text with more words in it than the first",
         "third", "pad me please, I am of middling length"]


def _rows(enc, want_tokens: bool = False):  # type: ignore[no-untyped-def]
    return enc.encode(enc.tokenize(TEXTS, want_offsets=want_tokens), want_tokens=want_tokens)


def test_onnx_rows_are_within_1e_4_of_torch_fp32(tiny_encoder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    engine = OnnxEngine.open(tiny_encoder.model, tiny_encoder.fingerprint, tmp_path)
    onnx_enc = dataclasses.replace(tiny_encoder, engine=engine)
    want, got = _rows(tiny_encoder, True), _rows(onnx_enc, True)
    assert set(got.pooled) == set(want.pooled) == set(tiny_encoder.poolings)
    for name in want.pooled:
        w, g = want.pooled[name], got.pooled[name]
        assert g.shape == w.shape == (4, 3, 32)
        rel = np.abs(g - w).max() / np.abs(w).max()
        assert rel < 1e-4, (name, rel)
    assert want.tokens is not None and got.tokens is not None
    for a, b in zip(want.tokens, got.tokens):
        assert np.abs(a.states - b.states).max() / np.abs(a.states).max() < 1e-4
    np.testing.assert_array_equal(got.n_tokens, want.n_tokens)


def test_the_export_is_cached_and_reused(tiny_encoder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    first = OnnxEngine.open(tiny_encoder.model, tiny_encoder.fingerprint, tmp_path)
    path = export_path(tmp_path, tiny_encoder.fingerprint)
    assert first.path == path and path.stat().st_size > 10_000
    stamp = path.stat().st_mtime_ns
    again = OnnxEngine.open(tiny_encoder.model, tiny_encoder.fingerprint, tmp_path)
    assert again.path == path and path.stat().st_mtime_ns == stamp  # opened, not exported again
    # no temp file left behind: the export and its record (what it was made from, its sha256)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.name + ".json"]
    # another model (fingerprint) gets its own file
    assert export_path(tmp_path, "another-model") != path


def test_a_half_written_export_is_ignored(tiny_encoder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = export_path(tmp_path, tiny_encoder.fingerprint)
    path.parent.mkdir(parents=True)
    good = OnnxEngine.open(tiny_encoder.model, tiny_encoder.fingerprint, tmp_path / "good").path
    path.write_bytes(good.read_bytes()[: good.stat().st_size // 2])  # a crash mid-copy
    engine = OnnxEngine.open(tiny_encoder.model, tiny_encoder.fingerprint, tmp_path)
    assert path.stat().st_size == good.stat().st_size  # exported again, whole
    onnx_rows = _rows(dataclasses.replace(tiny_encoder, engine=engine)).pooled["mean"]
    assert np.abs(onnx_rows - _rows(tiny_encoder).pooled["mean"]).max() < 1e-4


def test_an_export_of_other_weights_is_exported_again_and_a_graph_that_differs_is_refused(
        tiny_encoder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    first = OnnxEngine.open(tiny_encoder.model, tiny_encoder.fingerprint, tmp_path)
    import torch

    torch.manual_seed(1)
    changed = type(tiny_encoder.model)(tiny_encoder.model.config).eval()  # fresh random weights
    # the same key, but the record says other weights: exported again from these
    again = OnnxEngine.open(changed, tiny_encoder.fingerprint, tmp_path)
    assert again.path == first.path and os.path.exists(export_path(tmp_path, tiny_encoder.fingerprint))
    onnx_rows = _rows(dataclasses.replace(tiny_encoder, model=changed, engine=again)).pooled["mean"]
    assert np.abs(onnx_rows - _rows(dataclasses.replace(tiny_encoder, model=changed)).pooled["mean"]).max() < 1e-4
    # a graph that gives other numbers than the weights it is checked against is refused
    with pytest.raises(EngineMismatch, match="differs from torch"):
        first.check_against(changed)


def test_engine_onnx_that_cannot_be_used_is_one_load_error_not_a_crash(
        tiny_model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--engine onnx`` asked for and refused: ModelLoadError, which the worker turns into one
    line and a stop (FATAL_EXIT), not an exception its supervisor restarts into again (issue 25 row 7)."""
    from layerbank.workers.encoder import Encoder, ModelLoadError

    def refuse(*args: object, **kwargs: object) -> OnnxEngine:
        raise EngineMismatch("ONNX export x.onnx differs from torch by 3.1e-01 relative (allowed 1e-04)")

    monkeypatch.setattr(OnnxEngine, "open", refuse)
    with pytest.raises(ModelLoadError, match=r"--engine onnx cannot be used for .*differs from torch"):
        Encoder.load(tiny_model_dir, device="cpu", engine="onnx", data_dir=tmp_path)
    auto = Encoder.load(tiny_model_dir, device="cpu", engine="auto", data_dir=tmp_path)
    assert auto.engine is None and auto.info["engine_choice"]["chosen"] == "torch"  # auto falls back


def _scaled_copy(model, factor: float):  # type: ignore[no-untyped-def]
    """The model with its last layer's output LayerNorm weight scaled: h_L moves by ~(factor - 1)."""
    import copy

    import torch

    other = copy.deepcopy(model)
    with torch.no_grad():
        other.encoder.layer[-1].output.LayerNorm.weight.mul_(factor)
    return other


def test_the_check_allows_1e_4_relative_and_refuses_more(tiny_encoder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """TOLERANCE is the documented promise (docs/decisions.md): a graph 2e-5 off is used, 5e-4 off is not."""
    engine = OnnxEngine.open(tiny_encoder.model, tiny_encoder.fingerprint, tmp_path)
    assert engine.check_against(tiny_encoder.model) < 1e-5  # what open checked
    near = engine.check_against(_scaled_copy(tiny_encoder.model, 1 + 2e-5))
    assert 1e-5 < near < 1e-4
    with pytest.raises(EngineMismatch) as e:
        engine.check_against(_scaled_copy(tiny_encoder.model, 1 + 5e-4))
    assert re.fullmatch(rf"ONNX export {re.escape(str(engine.path))} differs from torch by [45]\.\d{{2}}e-04 "
                        r"relative \(allowed 1e-04\)", str(e.value)), str(e.value)


def test_the_export_lives_under_engines_onnx_with_its_record(tiny_encoder, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Where docs/reliability.md says, so the start-up clean-up (cache/leftovers.py) finds its temp files."""
    import json

    import onnx

    engine = OnnxEngine.open(tiny_encoder.model, tiny_encoder.fingerprint, tmp_path)
    assert engine.path.parent == tmp_path / "engines" / "onnx"
    assert re.fullmatch(r"[0-9a-f]{20}\.onnx", engine.path.name)
    record = json.loads((engine.path.parent / (engine.path.name + ".json")).read_text())["payload"]
    graph = onnx.load(os.fspath(engine.path))
    assert record["opset"] == "17" and [o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")] == [17]
    assert record["model_fingerprint"] == tiny_encoder.fingerprint and record["file_bytes"] == engine.path.stat().st_size
    assert [i.name for i in graph.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in graph.graph.output] == [f"hidden_state_{i}" for i in range(3)]

"""What the cached ONNX export's record catches, in the words the WARNING line gives
(docs/reliability.md, "Derived files"), and the numeric check behind it.

One export of the tiny model per module; each test damages a copy.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from layerbank.workers.engines import onnx as onnx_engine  # noqa: E402
from layerbank.workers.engines.onnx import EngineMismatch, OnnxEngine, record_path  # noqa: E402


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: str) -> tuple[Any, Path]:
    from layerbank.workers.encoder import Encoder

    enc = Encoder.load(tiny_model_dir, device="cpu")
    engine = OnnxEngine.open(enc.model, enc.fingerprint, tmp_path_factory.mktemp("export"))
    return enc, engine.path


def _copy(exported: tuple[Any, Path], tmp_path: Path) -> tuple[Any, Path, dict[str, str]]:
    enc, path = exported
    dst = tmp_path / path.name
    shutil.copy(path, dst)
    shutil.copy(record_path(path), record_path(dst))
    return enc, dst, onnx_engine._source(enc.model, enc.fingerprint)


def _rewrite_record(path: Path, **changes: Any) -> None:
    """The record with ``changes`` and a checksum that matches them (a consistent record)."""
    doc = json.loads(record_path(path).read_text())
    payload = {**doc["payload"], **changes}
    record_path(path).write_text(json.dumps({"payload": payload, "sha256": onnx_engine._digest(payload)}))


def test_a_sound_export_has_no_problem(exported: tuple[Any, Path], tmp_path: Path) -> None:
    _, path, source = _copy(exported, tmp_path)
    assert onnx_engine._problem(path, source) is None


def test_each_damage_is_named_in_its_own_words(exported: tuple[Any, Path], tmp_path: Path) -> None:
    enc, path, source = _copy(exported, tmp_path)
    rec = record_path(path).name
    problem = onnx_engine._problem
    good_record = record_path(path).read_bytes()

    record_path(path).unlink()
    assert problem(path, source) == f"has no record {rec} of what it was exported from"
    record_path(path).write_bytes(b"\xff\xfe not utf-8")
    assert problem(path, source).startswith(f"has an unreadable record {rec} (")  # type: ignore[union-attr]
    record_path(path).write_text('{"payload": {"file_bytes": 1}')
    assert problem(path, source).startswith(f"has an unreadable record {rec} (")  # type: ignore[union-attr]
    # fields that match this model but a checksum that does not match them: edited by hand
    doc = json.loads(good_record)
    record_path(path).write_text(json.dumps({"payload": doc["payload"], "sha256": "0" * 64}))
    assert problem(path, source) == f"has a record {rec} that fails its checksum"
    record_path(path).write_text(json.dumps({"payload": ["not", "a", "dict"], "sha256": "0" * 64}))
    assert problem(path, source) == f"has a record {rec} that fails its checksum"

    record_path(path).write_bytes(good_record)
    _rewrite_record(path, weights_sha256="ab" * 32)
    assert problem(path, source) == (f"was exported from weights_sha256 {'ab' * 32!r}, "
                                     f"not this model's {source['weights_sha256']!r}")
    for key in ("model_fingerprint", "torch", "transformers", "opset"):
        record_path(path).write_bytes(good_record)
        _rewrite_record(path, **{key: "other"})
        assert problem(path, source) == f"was exported from {key} 'other', not this model's {source[key]!r}"

    record_path(path).write_bytes(good_record)
    size = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b"\0")
    assert problem(path, source) == f"is {size + 1} bytes, not the {size} it was written with"
    data = bytearray(path.read_bytes()[:-1])
    data[size // 2] ^= 0x01  # one bit, same size
    path.write_bytes(bytes(data))
    got = onnx_engine._file_sha256(path)
    written = json.loads(good_record)["payload"]["file_sha256"]
    assert problem(path, source) == f"fails its sha256 checksum ({got[:16]}..., written as {written[:16]}...)"
    path.unlink()
    assert problem(path, source).startswith("cannot be read ([Errno 2] ")  # type: ignore[union-attr]


def test_a_damaged_export_is_one_warning_of_the_engines_logger_and_exported_again(
        exported: tuple[Any, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    enc, _ = exported
    first = OnnxEngine.open(enc.model, enc.fingerprint, tmp_path)
    size = first.path.stat().st_size
    with open(first.path, "ab") as f:
        f.write(b"tail")
    with caplog.at_level(logging.INFO, logger="layerbank.engines"):
        again = OnnxEngine.open(enc.model, enc.fingerprint, tmp_path)
    warnings = [(r.name, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [("layerbank.engines", f"cached ONNX export {first.path} is {size + 4} bytes, not the "
                                              f"{size} it was written with; exporting again")]
    assert again.path.stat().st_size == size


@pytest.mark.parametrize("which", ["first", "last"])
def test_the_numeric_check_reaches_the_first_and_last_vocabulary_rows(
        exported: tuple[Any, Path], tmp_path: Path, which: str) -> None:
    """Behind the checksums: a graph whose record was made to match it (so only the numbers can
    tell) with one embedding row of other values is refused, at either end of the vocabulary."""
    import onnx
    import onnx.numpy_helper as nh

    enc, path, _ = _copy(exported, tmp_path)
    model = onnx.load(str(path))
    vocab = int(enc.model.config.vocab_size)
    [init] = [i for i in model.graph.initializer if list(i.dims) == [vocab, int(enc.model.config.hidden_size)]]
    table = nh.to_array(init).copy()
    # not a constant (LayerNorm removes one) and not a scale of row 0, [PAD], all zeros in BERT
    table[0 if which == "first" else vocab - 1] += np.linspace(-1, 1, table.shape[1], dtype=table.dtype)
    init.CopyFrom(nh.from_array(table, init.name))
    onnx.save(model, str(path))
    engine = OnnxEngine(onnx_engine._session(path, 1), path)
    with pytest.raises(EngineMismatch, match="differs from torch"):
        engine.check_against(enc.model)


def test_an_export_that_fails_raises_its_own_error_and_leaves_no_file(
        tiny_encoder: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    def fail(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("exporter failed before writing anything")

    monkeypatch.setattr(torch.onnx, "export", fail)
    with pytest.raises(RuntimeError, match="^exporter failed before writing anything$"):
        OnnxEngine.open(tiny_encoder.model, tiny_encoder.fingerprint, tmp_path)
    assert [p.name for p in (tmp_path / "engines" / "onnx").iterdir()] == []


def test_engine_onnx_is_named_in_the_encoders_info(tiny_model_dir: str, tmp_path: Path) -> None:
    from layerbank.workers.encoder import Encoder
    from layerbank.workers.engines.choice import choices_line

    enc = Encoder.load(tiny_model_dir, device="cpu", engine="onnx", data_dir=tmp_path)
    assert enc.info["engine"] == "onnx" and enc.info["engine_choice"] == {"chosen": "onnx", "reason": "asked for"}
    assert choices_line(enc.info) == "engine onnx, precision fp32"


def test_a_file_onnx_runtime_cannot_open_is_named_and_exported_again(
        exported: tuple[Any, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A record that matches the bytes (rewritten to), bytes that are no graph: the session fails."""
    enc, good = exported
    path = tmp_path / "engines" / "onnx" / good.name
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a graph at all" * 100)
    shutil.copy(record_path(good), record_path(path))
    _rewrite_record(path, file_sha256=onnx_engine._file_sha256(path), file_bytes=path.stat().st_size)
    with caplog.at_level(logging.INFO, logger="layerbank.engines"):
        engine = OnnxEngine.open(enc.model, enc.fingerprint, tmp_path)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "layerbank.engines"]
    assert lines[0][0] == "WARNING" and lines[0][1].startswith(f"cached ONNX export {path} cannot be opened (")
    assert lines[0][1].endswith("; exporting again")
    assert lines[1] == ("INFO", f"exporting {enc.fingerprint} to ONNX (once; cached at {path})")
    assert engine.check_against(enc.model) < 1e-4


def test_a_graph_of_another_shape_or_vocabulary_is_refused_in_words(exported: tuple[Any, Path]) -> None:
    import torch
    from transformers import BertModel

    enc, path = exported
    engine = OnnxEngine(onnx_engine._session(path, 1), path)
    cfg = enc.model.config
    torch.manual_seed(0)
    wider = BertModel(type(cfg)(**{**cfg.to_dict(), "hidden_size": 48, "intermediate_size": 40})).eval()
    with pytest.raises(EngineMismatch, match=f"^ONNX export {path} gives other shapes than torch$"):
        engine.check_against(wider)
    bigger = BertModel(type(cfg)(**{**cfg.to_dict(), "vocab_size": cfg.vocab_size + 500})).eval()
    with pytest.raises(EngineMismatch, match=f"^ONNX export {path} cannot run this model's inputs \\("):
        engine.check_against(bigger)  # its last ids are past the graph's embedding table

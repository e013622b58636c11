"""Every file the store derives is verified before it is trusted (issue 25, item 1).

One test per row of issue 25's table that damaged a derived file: the
cached ONNX export (a flipped bit in one embedding row, another model's
export), the measured engine and precision decisions (a value of the wrong
type, a choice that is not one), a big request's texts file (random bytes),
and an export's temporary file left by a killed process. Each damages the
file as the adversarial run did and checks what a user sees: the numbers,
the log line naming the file, the job's error.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from layerbank.workers.engines.onnx import OnnxEngine, export_path
from tests.tiny_models import save_tiny_bert


def _mean_rows(enc, texts: list[str]) -> np.ndarray:  # type: ignore[no-untyped-def]
    return enc.encode(enc.tokenize(texts)).pooled["mean"]


def _flip_bit_in_row(path: Path, model, token_id: int) -> None:  # type: ignore[no-untyped-def]
    """Flip one exponent bit of the first value of ``token_id``'s word-embedding row, in place."""
    row = model.embeddings.word_embeddings.weight[token_id].detach().numpy().astype("<f4").tobytes()
    data = bytearray(path.read_bytes())
    at = data.find(row)
    assert at > 0 and data.find(row, at + 1) == -1, "the row's bytes are in the file once"
    data[at + 3] ^= 0x40  # the float's exponent: 0.02 becomes ~1e37-ish, or the other way
    path.write_bytes(bytes(data))


def test_row1_a_flipped_bit_in_one_embedding_row_of_the_export_is_found_and_exported_again(
        tiny_encoder, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    token_id = tiny_encoder.tokenizer.convert_tokens_to_ids("film")
    assert token_id > 100  # far past the ids the old check ran (1-8)
    first = OnnxEngine.open(tiny_encoder.model, tiny_encoder.fingerprint, tmp_path)
    _flip_bit_in_row(first.path, tiny_encoder.model, token_id)
    with caplog.at_level(logging.WARNING, logger="layerbank.engines"):
        engine = OnnxEngine.open(tiny_encoder.model, tiny_encoder.fingerprint, tmp_path)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and str(first.path) in warned[0] and "sha256" in warned[0], warned
    texts = ["a good film", "the film was long"]
    want = _mean_rows(tiny_encoder, texts)
    got = _mean_rows(dataclasses.replace(tiny_encoder, engine=engine), texts)
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-4


def test_row7_another_models_valid_export_in_the_cache_is_found_and_rebuilt(
        tiny_encoder, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    from layerbank.workers.encoder import Encoder

    other_dir = save_tiny_bert(tmp_path / "other", seed=3, hidden=48, layers=2)
    other = Encoder.load(other_dir, device="cpu")
    theirs = OnnxEngine.open(other.model, other.fingerprint, tmp_path / "theirs").path
    ours = export_path(tmp_path / "data", tiny_encoder.fingerprint)
    ours.parent.mkdir(parents=True)
    ours.write_bytes(theirs.read_bytes())  # a valid graph, of other weights and another width
    with caplog.at_level(logging.WARNING, logger="layerbank.engines"):
        engine = OnnxEngine.open(tiny_encoder.model, tiny_encoder.fingerprint, tmp_path / "data")
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and str(ours) in warned[0], warned
    texts = ["another model's graph", "is not ours"]
    want = _mean_rows(tiny_encoder, texts)
    got = _mean_rows(dataclasses.replace(tiny_encoder, engine=engine), texts)
    assert got.shape == want.shape and np.abs(got - want).max() / np.abs(want).max() < 1e-4


def _measured_file(data_dir: Path, kind: str) -> Path:
    [path] = (data_dir / "measured").glob(f"{kind}-*.json")
    return path


def _edit_payload(path: Path, **changes: object) -> None:
    """Change fields of a measured decision as a person with an editor would (checksum left as is)."""
    doc = json.loads(path.read_text())
    payload = doc.get("payload", doc)  # enveloped, or the older bare form
    payload.update(changes)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("changes", [{"ratio": "fast"}, {"choice": "nonsense"}, {"choice": "fp16"}],
                         ids=["row7-ratio-fast", "row8-choice-nonsense", "row8-choice-fp16"])
def test_rows7_8_a_damaged_measured_decision_is_named_and_measured_again(
        changes: dict[str, object], tiny_model_dir: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    from layerbank.workers.encoder import Encoder

    first = Encoder.load(tiny_model_dir, device="cpu", precision="auto", data_dir=tmp_path)
    path = _measured_file(tmp_path, "precision")
    _edit_payload(path, **changes)
    with caplog.at_level(logging.WARNING, logger="layerbank"):
        again = Encoder.load(tiny_model_dir, device="cpu", precision="auto", data_dir=tmp_path)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and str(path) in r.getMessage()]
    assert len(warned) == 1 and "measuring again" in warned[0], [r.getMessage() for r in caplog.records]
    assert again.config.precision in ("fp32", "bf16") and first.config.precision in ("fp32", "bf16")
    assert again.info["precision_choice"]["reused"] is False  # measured again, and stored again
    stored = json.loads(path.read_text())["payload"]
    assert stored["choice"] in ("fp32", "bf16") and isinstance(stored["ratio"], float)


def test_row9_a_request_texts_file_of_random_bytes_fails_its_job_naming_the_file(store, tiny_encoder) -> None:  # type: ignore[no-untyped-def]
    from layerbank.cache import request_texts
    from layerbank.workers.worker import Worker, WorkerOptions

    worker = Worker(store, tiny_encoder, WorkerOptions())
    texts = ["x" * 600_000, "y" * 600_000]  # over INLINE_MAX_CHARS: the texts go to a file
    part = request_texts.to_payload(store.root, "job-row9", texts)
    assert "texts_file" in part
    (store.root / "requests" / "job-row9.json").write_bytes(os.urandom(4096))
    job_id = worker.queue.submit("encode", {**part, "model": None}, job_id="job-row9")
    job = worker.queue.claim(worker.id, ["encode"], 30.0)
    assert job is not None and job.id == job_id
    worker.run_job(job)
    done = worker.queue.get(job_id)
    assert done is not None and done.state == "failed"
    assert "requests/job-row9.json" in (done.error or "") and "damaged" in (done.error or "")
    assert "UnicodeDecodeError" not in (done.error or "")


def test_row14_an_export_temp_file_of_a_killed_process_is_cleaned_like_shard_leftovers(store) -> None:  # type: ignore[no-untyped-def]
    import time

    from layerbank.cache.jobs import JobQueue
    from layerbank.cache.leftovers import clean_leftovers
    from layerbank.workers.engines.onnx import temp_name

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    onnx_dir = store.root / "engines" / "onnx"
    onnx_dir.mkdir(parents=True)
    left = onnx_dir / temp_name(onnx_dir / "0123456789abcdef0123.onnx", pid=dead.pid)
    left.write_bytes(b"half an export")
    mine = onnx_dir / temp_name(onnx_dir / "fedcba98765432100123.onnx")  # this live process's
    mine.write_bytes(b"being written")
    older = onnx_dir / "0123456789abcdef0123.onnxk2j3l4.tmp"  # the name before pids were in it
    older.write_bytes(b"half an export")
    final = onnx_dir / "0123456789abcdef0123.onnx"
    final.write_bytes(b"a finished export")
    past = time.time() - 3600
    for p in (left, mine, older, final):
        os.utime(p, (past, past))
    removed = clean_leftovers(store, JobQueue(store.catalog), started=time.time())
    assert not left.exists() and not older.exists()
    assert mine.exists() and final.exists()
    assert removed["engine_temp_files"] == 2

"""Both engines on the bundled model: the same rows, and auto says what it measured.

Real weights (all-MiniLM-L6-v2), real SST-2 sentences, a real ONNX export and
ONNX Runtime session; the second test runs a real ``layerbank serve`` with
``--engine auto`` (export, timing, stored decision) and restarts it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from .conftest import ServerProcess, sst_sentences

pytest.importorskip("onnxruntime")

TOLERANCE = 1e-4  # relative to the largest value of each layer: docs/decisions.md


@pytest.fixture(scope="module")
def torch_encoder() -> Any:
    from layerbank.workers.encoder import Encoder

    return Encoder.load(None, device="cpu", engine="torch")


def _pooled(enc: Any, texts: list[str]) -> dict[str, np.ndarray]:
    out = [enc.encode(enc.tokenize(texts[i:i + 16])) for i in range(0, len(texts), 16)]
    return {name: np.concatenate([o.pooled[name] for o in out]) for name in enc.poolings}


def test_onnx_rows_of_the_bundled_model_are_within_1e_4_of_torch(torch_encoder: Any, tmp_path: Path) -> None:
    from layerbank.workers.engines.onnx import OnnxEngine

    texts, _ = sst_sentences(48, offset=4800)
    onnx_enc = dataclasses.replace(torch_encoder, engine=OnnxEngine.open(
        torch_encoder.model, torch_encoder.fingerprint, tmp_path))
    want, got = _pooled(torch_encoder, texts), _pooled(onnx_enc, texts)
    for name in ("mean", "cls", "max"):
        assert got[name].shape == want[name].shape == (48, 7, 384)
        for layer in range(7):
            w, g = want[name][:, layer], got[name][:, layer]
            rel = float(np.abs(g - w).max() / np.abs(w).max())
            assert rel < TOLERANCE, (name, layer, rel)


def test_a_server_on_engine_auto_reports_its_measurement_and_serves_torch_rows(
        torch_encoder: Any, tmp_path: Path) -> None:
    texts, _ = sst_sentences(16, offset=4850)
    server = ServerProcess(tmp_path / "data", {"engine": "auto"}).start()
    try:
        model = server.get("/info").json()["model"]
        choice = model["engine_choice"]
        assert model["engine"] == choice["chosen"] == ("onnx" if choice["measured_ratio"] >= 1.05 else "torch")
        assert choice["reused"] is False and choice["figures"]["torch"] > 0 and choice["figures"]["onnx"] > 0
        assert "engine" not in model["extraction_config"]  # rows of either engine share keys
        assert len(list((tmp_path / "data" / "measured").glob("engine-*.json"))) == 1
        assert len(list((tmp_path / "data" / "engines" / "onnx").glob("*.onnx"))) == 1
        r = server.post("/v1/features", json={"texts": texts, "view": "layer:-1", "pooling": "mean"})
        assert r.status_code == 200, r.text
        served = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
        want = _pooled(torch_encoder, texts)["mean"][:, -1]
        # stored as float16: within its rounding (about 1e-3 relative) of torch's float32 rows
        worst = np.abs(served - want).max(axis=1) / np.abs(want).max()
        assert float(worst.max()) < 2e-3, (choice, worst.round(4).tolist())

        server.restart()  # the next start reads the stored decision instead of timing again
        again = server.get("/info").json()["model"]["engine_choice"]
        assert again["reused"] is True
        assert again["measured_ratio"] == choice["measured_ratio"]
        assert "engine " + model["engine"] in server.log()
    finally:
        server.stop()


def test_a_restarted_server_serves_on_its_checked_export_before_reading_the_weights(
        torch_encoder: Any, tmp_path: Path) -> None:
    first_texts, _ = sst_sentences(8, offset=4870)
    texts, _ = sst_sentences(16, offset=4878)
    server = ServerProcess(tmp_path / "data", {"engine": "onnx"}).start()
    try:
        assert "started_from" not in server.get("/info").json()["model"]  # the first start: torch checks
        r = server.post("/v1/features", json={"texts": first_texts, "view": "layer:-1"})
        assert r.status_code == 200, r.text
        server.restart()
        model = server.get("/info").json()["model"]
        assert (model["engine"], model.get("started_from")) == ("onnx", "onnx check")
        assert "started on its checked ONNX export" in server.log()
        assert "reading the torch weights" not in server.log()
        # texts never seen: computed by the worker that has not read the weights
        r = server.post("/v1/features", json={"texts": texts, "view": "layer:-1", "pooling": "mean"})
        assert r.status_code == 200, r.text
        served = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
        want = _pooled(torch_encoder, texts)["mean"][:, -1]
        worst = np.abs(served - want).max(axis=1) / np.abs(want).max()
        assert float(worst.max()) < 2e-3, worst.round(4).tolist()  # float16 storage's rounding
        # bf16 rows need the torch weights: read now, once, and served
        r = server.post("/v1/features", json={"texts": texts[:4], "view": "layer:-1", "precision": "bf16"})
        assert r.status_code == 200, r.text
        assert server.log().count("reading the torch weights") == 1
    finally:
        server.stop()

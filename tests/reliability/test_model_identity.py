"""A model's identity follows its files (issue 25, item 2; rows 2 and 10 of its table).

Row 2: a local model's ``model.safetensors`` overwritten in place (same
shape, other weights) while the worker runs. Loaded weights used to be a
view of the file (safetensors maps it), so the new weights computed rows
that were stored under the old fingerprint. Now a loaded model owns its
weights, and the worker confirms the files' fingerprint at every job: rows
of the new weights are stored under the new fingerprint only.

Row 10: a served model whose files were truncated when the worker started
(so located with the truncated files' fingerprint), then restored. Loading
it gave an encoder of the restored fingerprint while the worker went on
describing the truncated one, so the API answered 503 "is loading; retry
shortly" forever. Now the pool describes what it loaded.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from layerbank.cache.store import FeatureStore
from layerbank.workers.encoder import Encoder
from layerbank.workers.model_pool import ModelChanged, ModelPool, ServedModel
from layerbank.workers.model_source import locate_model
from layerbank.workers.worker import Worker, WorkerOptions
from tests.tiny_models import save_tiny_bert


@pytest.fixture(scope="module")
def two_weights(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two tiny models of the same shape and other weights (so their weight files are the same size)."""
    a = Path(save_tiny_bert(tmp_path_factory.mktemp("weights_a"), seed=21, hidden=32, layers=2))
    b = Path(save_tiny_bert(tmp_path_factory.mktemp("weights_b"), seed=22, hidden=32, layers=2))
    assert (a / "model.safetensors").stat().st_size == (b / "model.safetensors").stat().st_size
    return a, b


def _overwrite_in_place(target: Path, source: Path) -> None:
    """Write ``source``'s bytes over ``target`` through the same inode, as ``cat b > a`` does."""
    data = source.read_bytes()
    with open(target, "r+b") as f:
        f.write(data)
        f.truncate()


def _encode(worker: Worker, texts: list[str], model: str | None = None) -> None:
    job_id = worker.queue.submit("encode", {"texts": texts, "model": model})
    job = worker.queue.claim(worker.id, ["encode"], 30.0)
    assert job is not None and job.id == job_id
    worker.run_job(job)
    done = worker.queue.get(job_id)
    assert done is not None and done.state == "succeeded", done


def _stored(store: FeatureStore, enc: Encoder, fingerprint: str, texts: list[str]) -> Any:
    keys = [FeatureStore.key(fingerprint, enc.config, t) for t in texts]
    return store.read_pooled(keys, "mean")


def _close(got: np.ndarray, want: np.ndarray) -> bool:
    return bool(np.abs(got - want).max() <= 2e-3 * np.abs(want).max())  # stored as float16


def _worker(store: FeatureStore, model_dir: Path, reload: bool) -> Worker:
    enc = Encoder.load(os.fspath(model_dir), device="cpu")
    pool = ModelPool(enc, load=(lambda e: Encoder.load(e.spec, device="cpu")) if reload else None,
                     on_load=lambda e: store.catalog.register_model(e.fingerprint, e.name,
                                                                    {**e.info, "config": e.config.canonical()}))
    return Worker(store, enc, WorkerOptions(), models=pool)


def test_row2_weights_overwritten_in_place_are_stored_under_their_own_fingerprint(
        two_weights: tuple[Path, Path], tmp_path: Path, store: FeatureStore) -> None:
    a, b = two_weights
    served = Path(shutil.copytree(a, tmp_path / "served"))
    worker = _worker(store, served, reload=True)
    fp_a = worker.encoder.fingerprint
    want_a = Encoder.load(os.fspath(a), device="cpu")
    want_b = Encoder.load(os.fspath(b), device="cpu")
    texts = ["a text before the change", "another one"]
    _encode(worker, texts[:1])
    _overwrite_in_place(served / "model.safetensors", b / "model.safetensors")
    _encode(worker, texts[1:])
    fp_b = worker.encoder.fingerprint
    assert fp_b == want_b.fingerprint != fp_a  # the worker noticed, and serves the files as they are now
    before, after = _stored(store, want_a, fp_a, texts), _stored(store, want_b, fp_b, texts)
    assert before.found.tolist() == [True, False]  # nothing of the new weights under the old fingerprint
    assert after.found.tolist() == [False, True]
    assert _close(before.data[0], want_a.encode(want_a.tokenize(texts[:1])).pooled["mean"][0])
    assert _close(after.data[1], want_b.encode(want_b.tokenize(texts[1:])).pooled["mean"][0])
    assert store.catalog.model_info(fp_b) is not None  # registered: the API can make its keys
    with pytest.raises(ModelChanged, match=f"{fp_a}.*{fp_b}"):  # a request made for the old weights
        worker.models.get(fp_a)


def test_row2_without_a_loader_the_loaded_weights_stay_the_ones_fingerprinted(
        two_weights: tuple[Path, Path], tmp_path: Path, store: FeatureStore) -> None:
    a, b = two_weights
    served = Path(shutil.copytree(a, tmp_path / "served"))
    worker = _worker(store, served, reload=False)
    fp_a = worker.encoder.fingerprint
    _overwrite_in_place(served / "model.safetensors", b / "model.safetensors")
    _encode(worker, ["computed after the file changed"])
    want_a = Encoder.load(os.fspath(a), device="cpu")
    got = _stored(store, want_a, fp_a, ["computed after the file changed"])
    assert got.found.all()
    assert _close(got.data[0], want_a.encode(want_a.tokenize(["computed after the file changed"])).pooled["mean"][0])


def test_row10_a_model_restored_after_truncation_is_described_as_loaded(
        two_weights: tuple[Path, Path], tmp_path: Path, tiny_encoder: Encoder) -> None:
    a, _ = two_weights
    served = Path(shutil.copytree(a, tmp_path / "served"))
    weights = served / "model.safetensors"
    whole = weights.read_bytes()
    with open(weights, "r+b") as f:  # truncated while the worker (re)starts: located as they are
        f.truncate(len(whole) // 3)
    registered: list[str] = []
    pool = ModelPool(tiny_encoder, [ServedModel(locate_model(os.fspath(served)), os.fspath(served))],
                     load=lambda e: Encoder.load(e.spec, device="cpu"),
                     on_load=lambda e: registered.append(e.fingerprint))
    weights.write_bytes(whole)  # restored
    enc = pool.get(os.fspath(served))
    [entry] = [d for d in pool.describe() if not d["default"]]
    assert registered == [enc.fingerprint]
    # what the API reads: the fingerprint it will find registered in the catalog, loaded
    assert entry["fingerprint"] == enc.fingerprint and entry["registered"] and entry["loaded"]
    assert pool.get(enc.fingerprint) is enc and pool.loads == 1


def test_row10_over_http_a_restored_model_answers_without_a_restart(
        two_weights: tuple[Path, Path], tmp_path: Path, tiny_model_dir: str) -> None:
    """The run of issue 25: served with its weights truncated, then restored; the same request
    answered 503 "is loading; retry shortly" until a restart. Now it answers 200."""
    import threading
    import time

    from fastapi.testclient import TestClient

    from layerbank.app.api.main import create_app
    from layerbank.app.api.settings import Settings
    from layerbank.app.cli.worker import served_models

    a, _ = two_weights
    served = Path(shutil.copytree(a, tmp_path / "served"))
    weights = served / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 3])  # truncated when the server starts
    settings = Settings(data_dir=tmp_path / "data", model=[tiny_model_dir, os.fspath(served)], device="cpu",
                        batch_window_ms=2.0, heartbeat_seconds=0.5)
    store = FeatureStore(settings.data_dir)
    enc = Encoder.load(tiny_model_dir, device="cpu")
    store.catalog.register_model(enc.fingerprint, enc.name, {**enc.info, "config": enc.config.canonical()})
    worker = Worker(store, enc, WorkerOptions(heartbeat_seconds=0.5), models=served_models(settings, enc, store))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    body = {"texts": ["a quiet film"], "model": os.fspath(served), "view": "layer:-1"}
    try:
        with TestClient(create_app(settings), base_url="http://localhost",
                        headers={"Origin": "http://localhost"}) as client:
            deadline = time.monotonic() + 10
            while client.get("/ready").status_code != 200:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            damaged = client.post("/v1/features", json=body)
            assert damaged.status_code == 503, damaged.text  # its files cannot be loaded now
            weights.write_bytes(whole)  # restored
            answers = []
            for _ in range(5):  # a retry or two while the worker's liveness row catches up
                r = client.post("/v1/features", json=body)
                answers.append((r.status_code, r.json().get("error")))
                if r.status_code == 200:
                    break
                time.sleep(0.6)
            assert answers[-1][0] == 200, answers
            want = Encoder.load(os.fspath(a), device="cpu")
            assert r.json()["dim"] == 32 and r.json()["data"][0]["cached"] is False
            np.testing.assert_allclose(r.json()["data"][0]["embedding"],
                                       want.encode(want.tokenize(body["texts"])).pooled["mean"][0, -1],
                                       rtol=2e-3, atol=2e-3)
    finally:
        worker.stop()
        thread.join(10)
        store.close()

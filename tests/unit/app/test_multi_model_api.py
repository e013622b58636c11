"""Several encoders behind one API (app/api/served_models.py): a request names
its model, the first request for a model loads it, /info lists them, and a
row of one model never answers a request for another."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.tiny_models import save_tiny_bert


@pytest.fixture(scope="module")
def other_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return save_tiny_bert(tmp_path_factory.mktemp("other-bert"), seed=7, hidden=48, layers=3)


@pytest.fixture
def serve_models(tmp_path: Path, tiny_model_dir: str) -> Iterator[Callable[[list[str]], Any]]:
    """``serve_models(others)``: the app and a worker thread serving the tiny model (the
    default) and ``others``; (client, worker)."""
    from fastapi.testclient import TestClient

    from layerbank.app.api.main import create_app
    from layerbank.app.api.settings import Settings
    from layerbank.app.cli.worker import served_models
    from layerbank.cache.store import FeatureStore
    from layerbank.workers.encoder import Encoder
    from layerbank.workers.worker import Worker, WorkerOptions

    stops: list[Callable[[], None]] = []

    def make(others: list[str]) -> Any:
        settings = Settings(data_dir=tmp_path / "data", model=[tiny_model_dir, *others], device="cpu",
                            batch_window_ms=2.0, heartbeat_seconds=0.5)
        store = FeatureStore(settings.data_dir)
        enc = Encoder.load(tiny_model_dir, device="cpu")
        store.catalog.register_model(enc.fingerprint, enc.name, {**enc.info, "config": enc.config.canonical()})
        worker = Worker(store, enc, WorkerOptions(heartbeat_seconds=0.5),
                        models=served_models(settings, enc, store))
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        client = TestClient(create_app(settings), base_url="http://localhost",
                            headers={"Origin": "http://localhost"})
        client.__enter__()

        def stop() -> None:
            client.__exit__(None, None, None)
            worker.stop()
            thread.join(10)
            store.close()
        stops.append(stop)
        deadline = time.monotonic() + 10
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return client, worker

    yield make
    for stop in stops:
        stop()


@pytest.fixture
def two_models(serve_models: Callable[[list[str]], Any], other_dir: str) -> Any:
    return serve_models([other_dir])


def test_info_lists_every_served_model_and_loads_the_others_on_first_use(two_models: Any,
                                                                           other_dir: str) -> None:
    client, worker = two_models
    models = client.get("/info").json()["models"]
    assert [m["default"] for m in models] == [True, False]
    assert models[0]["hidden_size"] == 32 and models[1]["path"] == other_dir
    assert models[1]["loaded"] is False and "hidden_size" not in models[1]  # not loaded yet
    assert worker.models.loads == 0
    r = client.post("/v1/features", json={"texts": ["a quiet film"], "model": other_dir, "view": "layer:-1"})
    assert r.status_code == 200, r.text
    assert r.json()["dim"] == 48 and worker.models.loads == 1
    second = client.get("/info").json()["models"][1]
    assert second["loaded"] is True and second["layers"] == 3 and second["hidden_size"] == 48
    assert second["fingerprint"] == worker.models.get(other_dir).fingerprint


def test_each_model_answers_with_its_own_rows(two_models: Any, other_dir: str, tiny_model_dir: str) -> None:
    from layerbank.workers.encoder import Encoder

    client, _ = two_models
    text = "the same text for both models"
    got = {}
    for name in (tiny_model_dir, other_dir, tiny_model_dir, other_dir):
        r = client.post("/v1/features", json={"texts": [text], "model": name, "view": "layer:-1",
                                              "pooling": "mean"})
        assert r.status_code == 200, r.text
        item = r.json()["data"][0]
        if name in got:
            assert item["cached"] is True  # its own row, stored by the first request
        else:
            assert item["cached"] is False, "a row of the other model must not answer"
        got[name] = np.asarray(item["embedding"], dtype=np.float32)
    for name, vec in got.items():
        enc = Encoder.load(name, device="cpu")
        alone = enc.encode(enc.tokenize([text])).pooled["mean"][0, -1]
        np.testing.assert_allclose(vec, alone, rtol=2e-3, atol=2e-3)  # stored as float16
    assert got[tiny_model_dir].shape == (32,) and got[other_dir].shape == (48,)


def test_a_model_not_served_is_a_422_naming_those_that_are(two_models: Any, other_dir: str) -> None:
    client, _ = two_models
    r = client.post("/v1/features", json={"texts": ["x"], "model": "bert-large"})
    assert r.status_code == 422
    body = r.json()
    assert body["type"] == "validation" and set(body) >= {"error", "type"}
    assert body["error"].startswith("model 'bert-large' is not served here; this server serves ")
    assert other_dir in body["error"] and "the default" in body["error"]


def test_a_dataset_names_its_model_and_is_extracted_by_it(two_models: Any, other_dir: str) -> None:
    client, _ = two_models
    r = client.post("/v1/datasets", json={"name": "other", "texts": ["one text", "two texts"],
                                          "labels": ["a", "b"], "model": other_dir})
    assert r.status_code == 202, r.text
    ds = r.json()
    assert ds["model"] == other_dir
    deadline = time.monotonic() + 30
    while (job := client.get(f"/v1/jobs/{ds['job_id']}").json())["state"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert job["state"] == "succeeded", job
    r = client.post("/v1/features", json={"texts": ["one text"], "model": other_dir})
    assert r.json()["data"][0]["cached"] is True  # the dataset stored it, for this model
    r = client.post("/v1/features", json={"texts": ["one text"]})
    assert r.json()["data"][0]["cached"] is False  # the default model had never seen it


def test_model_given_twice_serves_both_the_first_by_default(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from layerbank.app.api.settings import Settings
    from layerbank.app.cli.common import settings_from
    from layerbank.app.cli.main import build_parser
    from layerbank.app.cli.worker import settings_env

    monkeypatch.delenv("LAYERBANK_MODEL", raising=False)
    monkeypatch.delenv("LAYERBANK_MODELS", raising=False)
    other = str(tmp_path / "my-bert")
    s = settings_from(build_parser().parse_args(["serve", "--model", "embedded", "--model", other]))
    assert s.model is None and s.served_models == [None, other]
    # the worker process gets the same list through its environment
    env = settings_env(s)
    assert env["LAYERBANK_MODELS"] == f"embedded,{other}" and "LAYERBANK_MODEL" not in env
    monkeypatch.setenv("LAYERBANK_MODELS", env["LAYERBANK_MODELS"])
    assert Settings().served_models == [None, other]
    assert Settings(model=other).served_models == [other, None]  # named on its own: the default
    monkeypatch.delenv("LAYERBANK_MODELS")
    # one model: as before, no list
    one = settings_from(build_parser().parse_args(["serve", "--model", other]))
    assert (one.model, one.models, one.served_models) == (other, "", [other])
    assert Settings(models=f"{other},embedded").model == other  # the first is the default


def test_a_served_model_whose_files_are_broken_is_a_503_naming_it(serve_models: Callable[[list[str]], Any],
                                                                  tmp_path: Path) -> None:
    broken = tmp_path / "broken-bert"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    client, worker = serve_models([str(broken)])
    r = client.post("/v1/features", json={"texts": ["a text"], "model": "broken-bert"})
    assert r.status_code == 503, r.text
    body = r.json()
    assert body["type"] == "not_ready"
    assert body["error"].startswith(f"model {str(broken)!r} is served but could not be loaded: cannot load model")
    assert worker.models.loads == 0
    assert client.post("/v1/features", json={"texts": ["a text"]}).status_code == 200  # the default still serves

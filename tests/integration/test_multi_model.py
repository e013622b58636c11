"""Several encoders in one real server: the bundled model (the default) and a
tiny random BERT, one ``layerbank serve`` process. The same SST-2 dataset is
extracted and probed with each; each model's features equal what that model
alone computes, and no row of one answers a request for the other.

Texts: SST-2 dev phrases at offsets 4700-4769 (conftest.sst_sentences).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.integration.conftest import ServerProcess, sst_sentences, write_tsv
from tests.tiny_models import save_tiny_bert

pytestmark = pytest.mark.integration


def _features(s: ServerProcess, texts: list[str], model: str | None) -> tuple[np.ndarray, list[bool]]:
    body: dict[str, Any] = {"texts": texts, "view": "layer:-1", "pooling": "mean"}
    if model is not None:
        body["model"] = model
    r = s.post("/v1/features", json=body)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    return np.asarray([d["embedding"] for d in data], dtype=np.float32), [d["cached"] for d in data]


def _alone(model: str | None, texts: list[str]) -> np.ndarray:
    """What the model computes by itself, in this process: last layer, mean pooling."""
    from layerbank.workers.encoder import Encoder

    enc = Encoder.load(model, device="cpu", engine="torch")
    return enc.encode(enc.tokenize(texts)).pooled["mean"][:, -1]


def test_two_models_one_server_probe_the_same_dataset_and_keep_their_rows_apart(
        server_factory: Callable[..., ServerProcess], tmp_path: Path) -> None:
    tiny = save_tiny_bert(tmp_path / "tiny-bert", seed=3, hidden=32, layers=2)
    s = server_factory(models=f"embedded,{tiny}", heartbeat_seconds=1)
    info = s.get("/info").json()["models"]
    assert [(m["default"], m["loaded"]) for m in info] == [(True, True), (False, False)]
    assert info[0]["hidden_size"] == 384 and info[1]["path"] == tiny  # the tiny one: loaded on first use

    texts, labels = sst_sentences(70, 4700)
    probes, datasets = {}, {}
    for model in (None, tiny):
        if model is None:
            r = s.post("/v1/datasets", json={"name": "sst2-default", "texts": texts, "labels": labels})
            assert r.status_code == 202, r.text
            ds = r.json()
        else:  # an upload (a TSV file) through the Python client, naming the model
            path = write_tsv(tmp_path / "sst2.tsv", texts, labels)
            ds = s.client().upload_dataset("sst2-tiny", path=path, text_column="sentence",
                                           label_column="label", model=tiny)
        assert ds["model"] == (tiny if model else "all-MiniLM-L6-v2 (embedded)")
        assert s.wait_job(ds["job_id"])["state"] == "succeeded"
        datasets[model] = ds
        r = s.post("/v1/probes", json={"dataset": ds["id"], "views": ["layer:-1"], "poolings": ["mean"],
                                       "cv": 3})
        assert r.status_code == 202, r.text
        job = s.wait_job(r.json()["id"])
        assert job["state"] == "succeeded", job["error"]
        probes[model] = s.get(f"/v1/probes/{r.json()['id']}").json()["result"]

    info = s.get("/info").json()["models"]
    assert info[1]["loaded"] is True and info[1]["layers"] == 2 and info[1]["hidden_size"] == 32
    assert info[0]["fingerprint"] != info[1]["fingerprint"]
    # one probe per model on the same dataset, side by side: each read its own model's features
    assert probes[None]["model"]["fingerprint"] == info[0]["fingerprint"]
    assert probes[tiny]["model"]["fingerprint"] == info[1]["fingerprint"]
    assert (probes[None]["model"]["num_layers"], probes[tiny]["model"]["num_layers"]) == (6, 2)
    assert probes[None]["task"]["n_examples"] == probes[tiny]["task"]["n_examples"] == 70
    # a real encoder separates SST-2 better than random weights
    assert probes[None]["best"]["accuracy"] > probes[tiny]["best"]["accuracy"]

    # every dataset text is stored once per model, and each model answers with its own numbers
    some = texts[:4]
    mini, mini_cached = _features(s, some, None)
    rand, rand_cached = _features(s, some, tiny)
    assert all(mini_cached) and all(rand_cached)
    assert mini.shape == (4, 384) and rand.shape == (4, 32)
    np.testing.assert_allclose(mini, _alone(None, some), rtol=5e-3, atol=2e-3)  # stored as float16
    np.testing.assert_allclose(rand, _alone(tiny, some), rtol=5e-3, atol=2e-3)

    # a new text: stored for one model, it is still a miss for the other, then a hit for each
    fresh = ["a text neither model has seen before, asked of both"]
    assert _features(s, fresh, tiny)[1] == [False]
    assert _features(s, fresh, "default")[1] == [False], "the tiny model's row answered the default"
    assert _features(s, fresh, None)[1] == [True] and _features(s, fresh, tiny)[1] == [True]

    # a head fitted on the tiny model's dataset predicts from the tiny model's features
    r = s.post("/v1/heads", json={"dataset": datasets[tiny]["id"], "view": "layer:-1", "pooling": "mean"})
    assert r.status_code == 202, r.text
    head = r.json()
    assert s.wait_job(head["job_id"])["state"] == "succeeded"
    r = s.post(f"/v1/heads/{head['id']}/predict", json={"texts": some + fresh})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == tiny and [d["cached"] for d in r.json()["data"]] == [True] * 5

    r = s.post("/v1/features", json={"texts": ["x"], "model": "bert-large-uncased"})
    assert r.status_code == 422 and r.json()["type"] == "validation"
    assert r.json()["error"].startswith("model 'bert-large-uncased' is not served here") and tiny in r.json()["error"]
    r = s.post("/v1/datasets", json={"name": "x", "texts": ["x"], "model": "bert-large-uncased"})
    assert r.status_code == 422 and r.json()["type"] == "validation"

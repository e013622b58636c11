"""Over HTTP: the poolings a server stores are a setting; texts cached before a
pooling was added still answer the others from the store, and the new one
is a miss that is recomputed (never a 500); a pooling the server does not
store is refused with 422 in the one error shape."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from layerbank.cache.store import FeatureStore
from layerbank.workers.encoder import Encoder
from layerbank.workers.extract import extract

TEXTS = ["cached before max was stored", "a second text", "and a third one here"]


def _rows(body: dict) -> np.ndarray:
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float32)


def _old_data_dir(root: Path, model_dir: str, poolings: str) -> None:
    """A data directory written by a server set to ``poolings``."""
    store = FeatureStore(root)
    enc = Encoder.load(model_dir, device="cpu", poolings=poolings)
    store.catalog.register_model(enc.fingerprint, enc.name, {**enc.info, "config": enc.config.canonical()})
    assert extract(TEXTS, store, enc, job_id="old").texts_encoded == len(TEXTS)
    store.close()


def test_texts_cached_before_a_pooling_was_added_answer_and_the_new_one_is_recomputed(
        tiny_api_factory, tiny_model_dir: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "old"
    _old_data_dir(root, tiny_model_dir, "mean,cls")
    api = tiny_api_factory(data_dir=root, poolings="mean,cls,max")
    c, enc = api.client, api.worker.encoder
    assert c.get("/info").json()["poolings"] == ["mean", "cls", "max"]

    mean = c.post("/v1/features", json={"texts": TEXTS, "view": "layer:-1", "pooling": "mean"})
    assert mean.status_code == 200, mean.text
    assert [d["cached"] for d in mean.json()["data"]] == [True] * 3
    assert enc.calls == 0  # answered from the store

    fresh = c.post("/v1/features", json={"texts": TEXTS, "view": "layer:-1", "pooling": "max"})
    assert fresh.status_code == 200, fresh.text
    body = fresh.json()
    assert [d["cached"] for d in body["data"]] == [False] * 3
    assert body["usage"]["tokens_computed"] == sum(d["n_tokens"] for d in body["data"])
    assert enc.calls >= 1
    direct = enc.encode(enc.tokenize(TEXTS)).pooled["max"][:, -1]
    np.testing.assert_allclose(_rows(body), direct, rtol=2e-3, atol=2e-3)  # float16 storage

    calls = enc.calls
    for pooling in ("max", "mean", "cls"):
        again = c.post("/v1/features", json={"texts": TEXTS, "view": "layer:-1", "pooling": pooling}).json()
        assert [d["cached"] for d in again["data"]] == [True] * 3, pooling
    assert enc.calls == calls
    # the re-encoded rows hold the same numbers the old shard held
    np.testing.assert_array_equal(_rows(again), _rows(c.post("/v1/features", json={
        "texts": TEXTS, "view": "layer:-1", "pooling": "cls"}).json()))
    np.testing.assert_array_equal(_rows(c.post("/v1/features", json={
        "texts": TEXTS, "view": "layer:-1", "pooling": "mean"}).json()), _rows(mean.json()))


def test_a_pooling_the_server_does_not_store_is_a_422(tiny_api_factory) -> None:  # type: ignore[no-untyped-def]
    api = tiny_api_factory(poolings="mean")
    r = api.client.post("/v1/features", json={"texts": ["a text"], "pooling": "max"})
    assert r.status_code == 422
    assert r.json() == {"error": "pooling 'max' is not stored by this server; it stores mean (setting "
                                 "poolings, --poolings / LAYERBANK_POOLINGS)", "type": "validation",
                        "field": "pooling"}
    assert api.client.post("/v1/features", json={"texts": ["a text"], "pooling": "avg"}).status_code == 422


def test_probes_and_heads_on_a_pooling_the_server_does_not_store_are_422(tiny_api_factory) -> None:  # type: ignore[no-untyped-def]
    import time

    c = tiny_api_factory(poolings="mean,cls").client
    texts = [f"{w} text number {i}" for i in range(6) for w in ("good", "bad")]
    r = c.post("/v1/datasets", json={"name": "d", "texts": texts, "labels": ["g", "b"] * 6})
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 60
    while c.get(f"/v1/jobs/{r.json()['job_id']}").json()["state"] != "succeeded":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    ds = r.json()["id"]
    probe = c.post("/v1/probes", json={"dataset": ds, "views": ["layer:1"], "poolings": ["mean", "max"], "cv": 2})
    assert (probe.status_code, probe.json()) == (422, {
        "error": "poolings: 'max' is not stored by this server; it stores mean, cls (setting poolings, "
                 "--poolings / LAYERBANK_POOLINGS)", "type": "validation", "field": "poolings"})
    head = c.post("/v1/heads", json={"dataset": ds, "view": "layer:1", "pooling": "max"})
    assert head.status_code == 422 and head.json()["field"] == "pooling", head.text
    assert "'max' is not stored by this server" in head.json()["error"]


def test_a_probe_job_on_texts_stored_before_its_pooling_says_to_upload_again(tmp_path: Path) -> None:
    import pytest

    from layerbank.app.api.probe_jobs.jobs import _read_states
    from layerbank.app.api.probe_jobs.requests import JobInputError
    from layerbank.cache.keys import ExtractionConfig
    from layerbank.cache.shard import ShardContents

    store = FeatureStore(tmp_path / "d")
    keys = [f"{i:064x}" for i in range(3)]
    store.write("old-00000", ShardContents(keys[:2], np.full(2, 4), np.zeros(2, bool), {"mean": np.ones((2, 3, 4))}),
                model="local:m", config=ExtractionConfig(max_length=8))
    assert _read_states(store, keys[:2], "mean", "dataset").shape == (2, 3, 4)
    with pytest.raises(JobInputError, match=r"^2 of the dataset's texts were stored before pooling 'max' was set; "
                                            "upload the dataset again to compute it for them$"):
        _read_states(store, keys[:2], "max", "dataset")
    with pytest.raises(JobInputError, match="1 of the dataset's 3 texts are no longer stored"):
        _read_states(store, keys, "mean", "dataset")
    store.close()

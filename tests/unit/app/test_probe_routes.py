"""Probes and heads over HTTP, on the tiny encoder (worker in a thread).

The probe service runs its jobs in a thread pool here (the process pool is
exercised by tests/integration/test_probe_http.py); everything else is the
real path: dataset upload, extraction, job table, result, files on disk.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from layerbank.app.probes.advice import head_bytes
from layerbank.app.probes.heads import load_head
from layerbank.app.probes.sweep import fit_head, run_probe
from layerbank.cache.keys import text_key

POS = ["a good film", "a great play", "good and warm", "a lovely story", "great fun", "a fine good show"]
NEG = ["a bad film", "a dull play", "bad and cold", "an awful story", "dull work", "a poor bad show"]


@pytest.fixture
def api(tiny_api_factory):  # type: ignore[no-untyped-def]
    api = tiny_api_factory()
    # threads, not processes: a spawned child would import sklearn afresh for every test
    api.client.app.state.probe_service.executor_factory = lambda: ThreadPoolExecutor(1)
    return api


def _wait(c, job_id: str, timeout: float = 60) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while (job := c.get(f"/v1/jobs/{job_id}").json())["state"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.02)
    return job  # type: ignore[no-any-return]


def _dataset(c, texts: list[str], labels: list[Any] | None, name: str = "d") -> dict:  # type: ignore[no-untyped-def]
    body: dict[str, Any] = {"name": name, "texts": texts}
    if labels is not None:
        body["labels"] = labels
    r = c.post("/v1/datasets", json=body)
    assert r.status_code == 202, r.text
    assert _wait(c, r.json()["job_id"])["state"] == "succeeded"
    return r.json()  # type: ignore[no-any-return]


def _labelled(n_per_class: int = 10) -> tuple[list[str], list[str]]:
    texts, labels = [], []
    for i in range(n_per_class):
        texts += [f"{POS[i % len(POS)]} number {i}", f"{NEG[i % len(NEG)]} number {i}"]
        labels += ["pos", "neg"]
    return texts, labels


def _states(api, texts: list[str], pooling: str) -> np.ndarray:  # type: ignore[no-untyped-def]
    from layerbank.cache.store import FeatureStore

    m = api.client.app.state.layerbank.model
    store = FeatureStore(api.data_dir)
    try:
        res = store.read_pooled([text_key(m.fingerprint, m.config, t) for t in texts], pooling)
        assert res.found.all()
        return res.data
    finally:
        store.close()


def test_probe_job_is_the_engine_on_stored_features(api) -> None:  # type: ignore[no-untyped-def]
    c = api.client
    texts, labels = _labelled(10)
    ds = _dataset(c, texts, labels)
    req = {"dataset": ds["id"], "views": ["each_layer", "mean_all"], "poolings": ["mean", "cls"],
           "cv": 3, "seed": 1, "train_sizes": [6]}
    r = c.post("/v1/probes", json=req)
    assert r.status_code == 202, r.text
    probe = r.json()
    assert probe["id"] == probe["job_id"] and probe["state"] in ("queued", "running", "succeeded")
    job = _wait(c, probe["id"])
    assert job["state"] == "succeeded", job["error"]
    assert job["kind"] == "probe" and job["progress"]["done"] == job["progress"]["total"] > 0
    got = c.get(f"/v1/probes/{probe['id']}").json()["result"]

    expected = run_probe(lambda p: _states(api, texts, p), labels, views=["each_layer", "mean_all"],
                         poolings=["mean", "cls"], cv=3, seed=1, train_sizes=[6])
    assert [(x["view"], x["pooling"]) for x in got["results"]] == \
        [(x["view"], x["pooling"]) for x in expected["results"]]
    assert len(got["results"]) == 2 * (3 + 1)  # tiny model: h_0..h_2, plus mean_all
    for a, b in zip(got["results"], expected["results"]):
        assert a["accuracy"]["folds"] == b["accuracy"]["folds"]
    assert got["best"] == expected["best"]
    assert got["control_task"]["best"] == expected["control_task"]["best"]
    assert [p["train_size"] for p in got["learning_curve"]["points"]] == [6, 13]  # 20 rows, 3 folds
    rec = got["recommendation"]
    assert f"accuracy {got['best']['accuracy']:.3f}" in rec["text"] and "Storage:" in rec["text"]
    assert rec["numbers"]["full_finetune_bytes"] == got["model"]["n_params"] * 4
    assert got["dataset"]["id"] == ds["id"] and got["task"]["name"] == "sentence_classification"

    listed = c.get("/v1/probes").json()["data"]
    assert [p["id"] for p in listed] == [probe["id"]]
    for path in ("plot.png", "learning_curve.png"):
        png = c.get(f"/v1/probes/{probe['id']}/{path}")
        assert png.status_code == 200 and png.headers["content-type"] == "image/png"
        assert png.content[:8] == b"\x89PNG\r\n\x1a\n" and len(png.content) > 10_000


def test_probe_bad_input_is_a_clear_4xx(api) -> None:  # type: ignore[no-untyped-def]
    c = api.client
    texts, labels = _labelled(3)
    ok = _dataset(c, texts, labels, "ok")
    one = _dataset(c, texts, ["pos"] * len(texts), "one class")
    missing = _dataset(c, texts, labels[:-2] + [None, ""], "missing")
    unlabelled = _dataset(c, texts, None, "unlabelled")

    def post(**body: Any) -> tuple[int, dict]:
        r = c.post("/v1/probes", json=body)
        return r.status_code, r.json()

    assert post(dataset="ds_nope") == (404, {"error": "no dataset 'ds_nope'", "type": "not_found",
                                             "field": "dataset"})
    code, body = post(dataset=one["id"])
    assert code == 422 and "all 6 labels are the same class 'pos'" in body["error"]
    code, body = post(dataset=ok["id"], cv=5)
    assert code == 422 and "fewer examples than the 5 cross-validation folds" in body["error"]
    assert "'neg': 3, 'pos': 3" in body["error"]
    code, body = post(dataset=missing["id"], cv=2)
    assert code == 422 and "2 of 6 labels are missing" in body["error"] and "index 4" in body["error"]
    code, body = post(dataset=unlabelled["id"], cv=2)
    assert code == 422 and "has no labels" in body["error"]
    code, body = post(dataset=ok["id"], cv=2, views=["layer:7"])
    assert code == 422 and body["field"] == "views" and "layer 7 does not exist" in body["error"]
    code, body = post(dataset=ok["id"], cv=2, views=["layer:banana"])
    assert code == 422 and body["field"] == "views"
    code, body = post(dataset=ok["id"], cv=2, head="forest")
    assert code == 422 and body["field"] == "head" and "unknown head 'forest'" in body["error"]
    code, body = post(dataset=ok["id"], cv=2, word_mode="mean")
    assert code == 422 and body["field"] == "word_mode"
    code, body = post(dataset=ok["id"], cv=1)
    assert code == 422 and body["field"] == "cv"
    code, body = post(dataset=ok["id"], task="token_classification")
    assert code == 422 and "holds texts, not words and tags" in body["error"]
    assert c.get("/v1/probes/nope").status_code == 404

    api.worker.stop()  # nothing extracts any more: the next dataset stays queued
    r = c.post("/v1/datasets", json={"name": "late", "texts": texts, "labels": labels})
    late = r.json()
    code, body = post(dataset=late["id"], cv=2)
    assert code == 409 and body["job_id"] == late["job_id"] and body["job_state"] == "queued"
    assert late["job_id"] in body["error"] and "not extracted yet" in body["error"]
    r = c.post("/v1/heads", json={"dataset": late["id"], "view": "layer:1"})
    assert r.status_code == 409 and r.json()["job_id"] == late["job_id"]


def test_head_fits_saves_without_pickle_and_predicts(api) -> None:  # type: ignore[no-untyped-def]
    c = api.client
    texts, labels = _labelled(8)
    ds = _dataset(c, texts, labels)
    r = c.post("/v1/heads", json={"dataset": ds["id"], "view": "layers:1,2", "pooling": "mean",
                                  "name": "sentiment"})
    assert r.status_code == 202, r.text
    head = r.json()
    assert head["id"].startswith("hd_") and head["size_bytes"] is None
    assert _wait(c, head["job_id"])["state"] == "succeeded"
    got = c.get(f"/v1/heads/{head['id']}").json()
    directory = api.data_dir / "heads" / head["id"]
    on_disk = {p.name: p.stat().st_size for p in directory.iterdir()}
    assert on_disk == got["files"] and set(on_disk) == {"arrays.npz", "head.json"}
    assert got["size_bytes"] == sum(on_disk.values())
    assert got["state"] == "succeeded" and got["classes"] == ["neg", "pos"] and got["n_examples"] == 16
    # the head's size is its fitted arrays (advice.head_bytes, what the advice estimates), not its files
    saved = load_head(directory)
    assert got["storage"]["frozen_head_bytes"] == head_bytes({a: getattr(saved, a) for a in saved._arrays})
    assert got["storage"]["frozen_head_bytes"] < got["size_bytes"] < got["storage"]["full_finetune_bytes"]
    with np.load(directory / "arrays.npz", allow_pickle=False) as npz:  # raises if pickle were needed
        assert all(npz[k].dtype != object for k in npz.files)
    assert json.loads((directory / "head.json").read_text())["metadata"]["view"] == "layers:1,2"

    new = ["a good warm film never seen", "a dull cold play never seen"]
    r = c.post(f"/v1/heads/{head['id']}/predict", json={"texts": [texts[0], *new]})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [d["cached"] for d in out["data"]] == [True, False, False]
    assert out["usage"]["cache_hits"] == 1 and out["classes"] == ["neg", "pos"]
    # the same head fitted here on the stored features, and the saved one, agree
    states = _states(api, texts, "mean")
    local = fit_head(states, labels, "layers:1,2")
    from layerbank.cache.views import parse_view

    x = parse_view("layers:1,2").apply(_states(api, [texts[0], *new], "mean"))
    expected = local.predict_proba(x.reshape(len(x), -1))
    assert np.allclose([d["probabilities"] for d in out["data"]], expected, atol=1e-9)
    assert np.allclose(load_head(directory).predict_proba(x.reshape(len(x), -1)), expected, atol=1e-12)
    assert [d["label"] for d in out["data"]] == [["neg", "pos"][int(i)] for i in expected.argmax(1)]

    assert [h["id"] for h in c.get("/v1/heads").json()["data"]] == [head["id"]]
    assert c.delete(f"/v1/heads/{head['id']}").json() == {"id": head["id"], "deleted": True}
    assert not directory.exists()
    assert c.get(f"/v1/heads/{head['id']}").status_code == 404
    assert c.post(f"/v1/heads/{head['id']}/predict", json={"texts": ["x"]}).status_code == 404


def test_head_from_probe_and_bad_head_requests(api) -> None:  # type: ignore[no-untyped-def]
    c = api.client
    texts, labels = _labelled(6)
    ds = _dataset(c, texts, labels)
    probe = c.post("/v1/probes", json={"dataset": ds["id"], "views": ["each_layer", "scalar_mix"],
                                       "poolings": ["mean"], "cv": 2, "control_task": False,
                                       "learning_curve": False}).json()
    assert _wait(c, probe["id"])["state"] == "succeeded"
    best = c.get(f"/v1/probes/{probe['id']}").json()["result"]["best"]
    assert c.get(f"/v1/probes/{probe['id']}/learning_curve.png").status_code == 404
    r = c.post("/v1/heads", json={"probe": probe["id"]})
    assert r.status_code == 202, r.text
    head = r.json()
    assert (head["view"], head["pooling"], head["dataset"]) == (best["view"], best["pooling"], ds["id"])
    assert head["from_probe"]["accuracy"] == best["accuracy"]
    assert _wait(c, head["job_id"])["state"] == "succeeded"

    mix = c.post("/v1/heads", json={"dataset": ds["id"], "head": "scalar_mix"}).json()
    assert mix["view"] == "scalar_mix" and _wait(c, mix["job_id"])["state"] == "succeeded"
    out = c.post(f"/v1/heads/{mix['id']}/predict", json={"texts": texts[:3]}).json()
    assert all(abs(sum(d["probabilities"]) - 1) < 1e-9 for d in out["data"])

    def code_field(body: dict) -> tuple[int, str | None]:
        r = c.post("/v1/heads", json=body)
        return r.status_code, r.json().get("field")

    assert code_field({"dataset": ds["id"]}) == (422, "view")
    assert code_field({"dataset": ds["id"], "view": "layer:9"}) == (422, "view")
    assert code_field({"dataset": ds["id"], "view": "layer:1", "head": "tree"}) == (422, "head")
    assert code_field({"dataset": "ds_missing", "view": "layer:1"}) == (404, "dataset")
    assert code_field({"probe": "nope"}) == (404, "probe")


def test_token_probe_over_http(api) -> None:  # type: ignore[no-untyped-def]
    c = api.client
    conll_train = "".join(
        f"{p} B-PER\nmet O\n{q} B-LOC\ntoday O\n\n" for p, q in
        [("Ann", "Paris"), ("Bob", "Rome"), ("Cid", "Oslo"), ("Dan", "Lima"), ("Eve", "Kyiv"), ("Fay", "Bonn")])
    conll_valid = "Gus B-PER\nmet O\nBern B-LOC\ntoday O\n\nHal B-PER\nmet O\nNice B-LOC\ntoday O\n"
    ids = []
    for name, text in (("train.conll", conll_train), ("valid.conll", conll_valid)):
        r = c.post("/v1/datasets", files={"file": (name, text.encode())}, data={"format": "conll"})
        assert r.status_code == 202 and r.json()["task"] == "token", r.text
        assert _wait(c, r.json()["job_id"])["state"] == "succeeded"
        ids.append(r.json()["id"])
    r = c.post("/v1/probes", json={"task": "token_classification", "train": ids[0], "valid": ids[1],
                                   "views": ["each_layer", "mean_all"]})
    assert r.status_code == 202, r.text
    probe = r.json()
    job = _wait(c, probe["id"])
    assert job["state"] == "succeeded"
    # progress: two reads, then one step per fit (4 views x tagger, control head, MDL)
    assert job["progress"]["done"] == job["progress"]["total"] == 2 + 4 * 3
    result = c.get(f"/v1/probes/{probe['id']}").json()["result"]
    assert [row["view"] for row in result["rows"]] == ["layer:0", "layer:1", "layer:2", "mean_all"]
    assert result["metric"] == "f1" and result["n_words"] == {"train": 24, "valid": 8}
    assert result["tags"] == ["B-LOC", "B-PER", "O"] and result["split"]["valid"] == ids[1]
    assert all(0 <= row["f1"] <= 1 and row["selectivity"] is not None for row in result["rows"])
    png = c.get(f"/v1/probes/{probe['id']}/plot.png")
    assert png.status_code == 200 and png.content[:4] == b"\x89PNG"
    assert c.get(f"/v1/probes/{probe['id']}/learning_curve.png").status_code == 404

    split = c.post("/v1/probes", json={"task": "token", "dataset": ids[0], "valid_fraction": 0.5,
                                       "views": ["layer:-1"], "control_task": False}).json()
    assert _wait(c, split["id"])["state"] == "succeeded"
    res = c.get(f"/v1/probes/{split['id']}").json()["result"]
    assert res["n_sentences"] == {"train": 3, "valid": 3} and res["rows"][0]["control_accuracy"] is None
    r = c.post("/v1/probes", json={"task": "token", "dataset": ids[0], "cv": 3})
    assert r.status_code == 422 and r.json()["field"] == "cv"
    r = c.post("/v1/probes", json={"task": "token", "train": ids[0], "valid": ids[1], "views": ["layer:5"]})
    assert r.status_code == 422 and r.json()["field"] == "views"


def test_a_cancelled_probe_job_stops_and_is_marked_cancelled(api) -> None:  # type: ignore[no-untyped-def]
    from layerbank.app.api.probe_jobs.jobs import run_job
    from layerbank.cache.jobs import JobQueue
    from layerbank.cache.store import FeatureStore

    c = api.client
    texts, labels = _labelled(4)
    ds = _dataset(c, texts, labels)
    store = FeatureStore(api.data_dir)
    try:
        queue = JobQueue(store.catalog)
        job_id = queue.submit("probe", {"task": "sentence_classification", "dataset_id": ds["id"],
                                        "views": ["each_layer"], "poolings": ["mean"], "head": "logistic",
                                        "cv": 2, "seed": 0, "control_task": True, "learning_curve": False,
                                        "train_sizes": [4]})
        # claimed by a runner of our own (not the app's dispatcher), then cancelled while "running"
        assert queue.claim("test-runner", ["probe"], lease_s=30).id == job_id  # type: ignore[union-attr]
        assert queue.cancel(job_id).cancel_requested  # type: ignore[union-attr]
        assert run_job(str(api.data_dir), job_id, "test-runner", heartbeat_s=60) == "cancelled"
        job = queue.get(job_id)
        assert job is not None and job.state == "cancelled" and job.result is None
    finally:
        store.close()


def test_a_job_whose_dataset_vanished_fails_with_the_reason(api) -> None:  # type: ignore[no-untyped-def]
    from layerbank.app.api.probe_jobs.jobs import run_job
    from layerbank.cache.jobs import JobQueue
    from layerbank.cache.store import FeatureStore

    c = api.client
    texts, labels = _labelled(3)
    ds = _dataset(c, texts, labels)
    assert c.delete(f"/v1/datasets/{ds['id']}").status_code == 200
    store = FeatureStore(api.data_dir)
    try:
        queue = JobQueue(store.catalog)
        job_id = queue.submit("probe", {"task": "sentence_classification", "dataset_id": ds["id"],
                                        "views": ["layer:1"], "poolings": ["mean"], "head": "logistic",
                                        "cv": 2, "seed": 0, "control_task": False, "learning_curve": False,
                                        "train_sizes": [4]})
        assert queue.claim("test-runner", ["probe"], lease_s=30).id == job_id  # type: ignore[union-attr]
        assert run_job(str(api.data_dir), job_id, "test-runner", heartbeat_s=60) == "failed"
        job = queue.get(job_id)
        assert job is not None and job.error == f"dataset {ds['id']} was deleted before the job ran"
    finally:
        store.close()

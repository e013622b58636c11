"""Datasets and jobs over HTTP with an in-thread worker on the tiny encoder."""

from __future__ import annotations

import io
import json
import time

import numpy as np

from layerbank.cache.jobs import JobQueue
from layerbank.cache.store import FeatureStore


def _wait(c, job_id: str, states=("succeeded", "failed", "cancelled"), timeout: float = 30) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while (job := c.get(f"/v1/jobs/{job_id}").json())["state"] not in states:
        assert time.monotonic() < deadline, job
        time.sleep(0.01)
    return job  # type: ignore[no-any-return]


def test_json_dataset_extracts_and_streams_npy(tiny_api) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api.client
    texts = [f"dataset text number {i}" for i in range(10)]
    r = c.post("/v1/datasets", json={"name": "ten", "texts": texts, "labels": [i % 2 for i in range(10)]})
    assert r.status_code == 202, r.text
    ds = r.json()
    assert ds["id"].startswith("ds_") and ds["n_items"] == 10 and ds["labels"] == [0, 1]  # ints stay ints
    job = _wait(c, ds["job_id"])
    assert job["state"] == "succeeded" and job["attempts"] == 1
    assert job["progress"]["done"] == job["progress"]["total"] == 10
    assert job["result"]["texts_encoded"] == 10
    npy = c.get(f"/v1/datasets/{ds['id']}/features", params={"view": "layers:0,2", "pooling": "max"})
    assert npy.status_code == 200 and npy.headers["content-type"] == "application/x-npy"
    assert npy.headers["content-disposition"] == f'attachment; filename="{ds["id"]}.npy"'
    x = np.load(io.BytesIO(npy.content))
    assert x.shape == (10, 64) and x.dtype == np.float32
    feats = c.post("/v1/features", json={"texts": texts, "view": "layers:0,2", "pooling": "max"}).json()
    assert feats["usage"]["cache_hits"] == 10
    np.testing.assert_array_equal(np.array([d["embedding"] for d in feats["data"]], np.float32), x)
    bad = c.get(f"/v1/datasets/{ds['id']}/features", params={"format": "csv"})
    assert bad.status_code == 422
    assert c.get(f"/v1/datasets/{ds['id']}/features", params={"view": "layer:7"}).status_code == 422


def test_upload_formats_and_the_events_stream(tiny_api) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api.client
    jsonl = "".join(json.dumps({"text": f"line {i} of jsonl", "y": "ab"[i % 2]}) + "\n" for i in range(6))
    r = c.post("/v1/datasets", files={"file": ("../../etc/passwd.jsonl", jsonl.encode())},
               data={"label_column": "y"})
    assert r.status_code == 202, r.text
    ds = r.json()
    assert ds["name"] == "passwd" and ds["source"] == "passwd.jsonl"  # a name, never a path
    with c.stream("GET", f"/v1/jobs/{ds['job_id']}/events") as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in s.iter_lines() if line]
    names = [line.split(": ", 1)[1] for line in lines if line.startswith("event:")]
    data = [json.loads(line.split(": ", 1)[1]) for line in lines if line.startswith("data:")]
    assert names[-1] == "done" and data[-1]["state"] == "succeeded" and len(names) == len(data)
    csv_body = "id,text\n1,\"a, quoted text\"\n2,\n3,plain\n"
    r = c.post("/v1/datasets", files={"file": ("x.csv", csv_body.encode())}, data={"name": "csv"})
    assert r.status_code == 202 and r.json()["n_items"] == 2 and r.json()["skipped_empty"] == 1
    conll = "EU B-ORG 0\nrejects O 0\n\nPeter B-PER 0\n"
    r = c.post("/v1/datasets", files={"file": ("ner.conll", conll.encode())})
    assert r.status_code == 202 and r.json()["task"] == "token" and r.json()["n_items"] == 2
    job = _wait(c, r.json()["job_id"])
    assert job["state"] == "succeeded"
    names = {d["name"] for d in c.get("/v1/datasets").json()["data"]}
    assert names == {"passwd", "csv", "ner"}


def test_delete_keeps_shared_features_and_cancels_pending_work(tiny_api) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api.client
    tiny_api.worker.stop()  # no worker from here on: jobs stay queued
    time.sleep(0.1)
    ds = c.post("/v1/datasets", json={"name": "pending", "texts": ["never encoded"]}).json()
    assert c.get(f"/v1/datasets/{ds['id']}/features").status_code == 409
    assert c.delete(f"/v1/datasets/{ds['id']}").json() == {"id": ds["id"], "deleted": True}
    assert c.get(f"/v1/jobs/{ds['job_id']}").json()["state"] == "cancelled"
    assert c.get(f"/v1/datasets/{ds['id']}").status_code == 404


def test_cancel_queued_and_running_jobs(tiny_api) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api.client
    tiny_api.worker.stop()
    time.sleep(0.1)
    ds = c.post("/v1/datasets", json={"name": "q", "texts": ["queued text"]}).json()
    r = c.delete(f"/v1/jobs/{ds['job_id']}")
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert c.delete(f"/v1/jobs/{ds['job_id']}").status_code == 409
    # a running job: claimed by a "worker" that is this test, cancelled, stopped at its heartbeat
    store = FeatureStore(tiny_api.data_dir)
    q = JobQueue(store.catalog)
    job_id = q.submit("extract", {"dataset_id": "none"})
    assert q.claim("test-owner", ["extract"], 30).id == job_id  # type: ignore[union-attr]
    r = c.delete(f"/v1/jobs/{job_id}")
    assert r.status_code == 202 and r.json()["state"] == "running" and r.json()["cancel_requested"]
    assert q.heartbeat(job_id, "test-owner", 30) is False
    store.close()


def test_overloaded_dataset_queue(tiny_api_factory) -> None:  # type: ignore[no-untyped-def]
    api = tiny_api_factory(max_queue_depth=2)
    api.worker.stop()
    time.sleep(0.1)
    for i in range(2):
        assert api.client.post("/v1/datasets", json={"name": f"d{i}", "texts": ["t"]}).status_code == 202
    r = api.client.post("/v1/datasets", json={"name": "d3", "texts": ["t"]})
    assert r.status_code == 429 and r.json()["limit"] == "max_queue_depth"
    assert r.headers["retry-after"] == "10"

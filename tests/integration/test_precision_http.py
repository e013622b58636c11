"""Precision per request and per dataset (issue 9) against a real server.

The shared server runs the bundled model on the CPU at its default, fp32. A
request or a dataset may ask for another mode; the API makes that mode's
keys from the table the worker published (``precision_modes`` in /info), the
worker computes at that mode, and rows of one mode never answer a request
for another. Texts: SST-2 dev phrases from offset 3000 (conftest).
"""

from __future__ import annotations

import io

import numpy as np

from tests.integration.conftest import ServerProcess, sst_sentences

# docs/precision.md, "Tolerance": per stored vector, |bf16 - fp32| / |fp32|
BF16_MAX_RELATIVE = 0.02


def features(server: ServerProcess, texts: list[str], **extra: object) -> dict:
    r = server.post("/v1/features", json={"texts": texts, "view": "layer:-1", "pooling": "mean", **extra})
    assert r.status_code == 200, r.text
    return r.json()


def rows(body: dict) -> np.ndarray:
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float32)


def cached(body: dict) -> list[bool]:
    return [d["cached"] for d in body["data"]]


def test_bf16_and_fp32_requests_are_two_cache_entries(layerbank_server: ServerProcess) -> None:
    s = layerbank_server
    texts, _ = sst_sentences(6, 3000)
    info = s.get("/info").json()
    assert info["precision"] == "fp32"  # the CPU default
    modes = info["model"]["precision_modes"]
    assert modes["fp32"] == "fp32" and modes["bf16"] == "bf16"

    fp32 = features(s, texts)
    assert fp32["precision"] == "fp32" and cached(fp32) == [False] * 6
    bf16 = features(s, texts, precision="bf16")
    # the fp32 rows of the same texts are stored, and must not answer
    assert bf16["precision"] == "bf16" and cached(bf16) == [False] * 6
    a, b = rows(fp32), rows(bf16)
    rel = np.linalg.norm(b - a, axis=1) / np.linalg.norm(a, axis=1)
    assert rel.max() < BF16_MAX_RELATIVE, rel
    assert (rel > 0).all(), "bf16 rows equal to fp32 ones: the request was not computed in bf16"

    again = features(s, texts, precision="bf16")
    assert cached(again) == [True] * 6 and np.array_equal(rows(again), b)
    explicit = features(s, texts, precision="fp32")
    assert explicit["precision"] == "fp32" and cached(explicit) == [True] * 6
    assert np.array_equal(rows(explicit), a)
    # auto and default are resolved by the worker's table, then share that mode's rows
    auto = features(s, texts, precision="auto")
    assert auto["precision"] == modes["auto"] and cached(auto) == [True] * 6
    assert np.array_equal(rows(auto), {"fp32": a, "bf16": b}[modes["auto"]])
    default = features(s, texts, precision="default")
    assert default["precision"] == "fp32" and np.array_equal(rows(default), a)

    emb = s.post("/v1/embeddings", json={"input": texts, "precision": "bf16", "view": "layer:-1",
                                         "pooling": "mean", "normalize": False})
    assert emb.status_code == 200, emb.text
    assert np.array_equal(np.array([d["embedding"] for d in emb.json()["data"]], np.float32), b)


def test_a_mode_the_device_lacks_or_an_unknown_mode_is_a_422(layerbank_server: ServerProcess) -> None:
    s = layerbank_server
    texts, _ = sst_sentences(1, 3010)
    assert s.get("/info").json()["model"]["precision_modes"]["fp16"] is None  # a CPU worker
    r = s.post("/v1/features", json={"texts": texts, "precision": "fp16"})
    assert r.status_code == 422, r.text
    assert r.json() == {"error": "precision fp16 is not available on the worker's device (cpu); "
                                 "fp16 needs CUDA, use bf16 or fp32",
                        "type": "validation", "field": "precision"}
    r = s.post("/v1/features", json={"texts": texts, "precision": "half"})
    assert r.status_code == 422 and r.json()["field"] == "precision", r.text
    r = s.post("/v1/datasets", json={"name": "fp16", "texts": texts, "precision": "fp16"})
    assert r.status_code == 422 and r.json()["field"] == "precision", r.text


def test_a_dataset_is_extracted_at_its_own_precision(layerbank_server: ServerProcess) -> None:
    s = layerbank_server
    texts, labels = sst_sentences(20, 3020)
    lb = s.client()
    ds = s.post("/v1/datasets", json={"name": "bf16 set", "texts": texts, "labels": labels,
                                      "precision": "bf16"})
    assert ds.status_code == 202, ds.text
    assert ds.json()["precision"] == "bf16"
    job = lb.wait(ds.json(), timeout=120)
    assert job["state"] == "succeeded" and job["result"]["texts_encoded"] == 20, job
    npy = s.get(f"/v1/datasets/{ds.json()['id']}/features", params={"view": "layer:-1", "pooling": "mean"})
    assert npy.status_code == 200, npy.text
    x = np.load(io.BytesIO(npy.content))
    # the request path at bf16 finds every row the dataset stored, and the same numbers
    bf16 = features(s, texts, precision="bf16")
    assert cached(bf16) == [True] * 20 and np.array_equal(x, rows(bf16))
    # the Python client asks the same way
    x_client, meta = lb.features(texts, "layer:-1", "mean", precision="bf16", return_info=True)
    assert meta["precision"] == "bf16" and np.array_equal(x_client, x)
    fp32 = features(s, texts)  # ... while fp32 rows of these texts did not exist yet
    assert cached(fp32) == [False] * 20

    # an upload names its precision as a form field
    tsv = "".join(f"{t}\t{y}\n" for t, y in zip(texts, labels)).encode()
    up = s.post("/v1/datasets", files={"file": ("set.tsv", tsv)},
                data={"no_header": "true", "precision": "bf16"})
    assert up.status_code == 202, up.text
    job = lb.wait(up.json(), timeout=120)
    assert up.json()["precision"] == "bf16" and job["result"]["cache_hits"] == 20, job

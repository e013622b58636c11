"""/v1/features and /v1/embeddings through the whole path (app + in-thread worker,
tiny random encoder: 3 hidden states of width 32)."""

from __future__ import annotations

import base64
import threading

import numpy as np

from layerbank.cache.keys import text_key
from layerbank.cache.store import FeatureStore
from layerbank.cache.views import parse_view


def _rows(body: dict) -> np.ndarray:
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float32)


def test_misses_are_encoded_once_then_served_from_the_store(tiny_api) -> None:  # type: ignore[no-untyped-def]
    c, enc = tiny_api.client, tiny_api.worker.encoder
    texts = ["the first text", "a second one", "the first text"]
    r = c.post("/v1/features", json={"texts": texts, "view": "layer:-1", "pooling": "cls"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["dim"], body["shape"], body["view"], body["pooling"]) == (32, [32], "layer:-1", "cls")
    assert [d["cached"] for d in body["data"]] == [False, False, False]
    x = _rows(body)
    np.testing.assert_array_equal(x[0], x[2])  # a repeated text is one key
    assert enc.calls >= 1
    assert body["usage"]["tokens_computed"] == sum(d["n_tokens"] for d in body["data"][:2])

    direct = enc.encode(enc.tokenize(texts[:2])).pooled["cls"][:, 2]
    np.testing.assert_allclose(x[:2], direct, rtol=2e-3, atol=2e-3)  # float16 storage

    calls = enc.calls
    again = c.post("/v1/features", json={"texts": texts, "view": "layer:-1", "pooling": "cls"}).json()
    assert enc.calls == calls
    assert [d["cached"] for d in again["data"]] == [True, True, True]
    assert again["usage"] == {"texts": 3, "cache_hits": 3, "tokens_computed": 0}
    np.testing.assert_array_equal(_rows(again), x)

    store = FeatureStore(tiny_api.data_dir)
    res = store.read_view([text_key(enc.fingerprint, enc.config, t) for t in texts],
                          parse_view("layer:-1"), "cls", 3)
    np.testing.assert_array_equal(res.data, x)
    store.close()


def test_cached_requests_never_reach_the_worker(tiny_api) -> None:  # type: ignore[no-untyped-def]
    c, enc = tiny_api.client, tiny_api.worker.encoder
    c.post("/v1/features", json={"texts": ["stored once"]})
    calls = enc.calls
    for view in ("layer:0", "layers:0,2", "mean_all", "all_layers"):
        r = c.post("/v1/features", json={"texts": ["stored once"], "view": view})
        assert r.status_code == 200 and r.json()["data"][0]["cached"]
    assert enc.calls == calls


def test_base64_dtypes_and_all_layers(tiny_api) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api.client
    texts = ["one text", "two texts"]
    full = c.post("/v1/features", json={"texts": texts, "view": "all_layers"}).json()
    assert full["shape"] == [3, 32]
    x = _rows(full)
    b16 = c.post("/v1/features", json={"texts": texts, "view": "all_layers", "format": "base64"}).json()
    assert b16["dtype"] == "float16"
    got = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f2") for d in b16["data"]])
    np.testing.assert_array_equal(got.reshape(2, 3, 32).astype(np.float32), x)
    b32 = c.post("/v1/features", json={"texts": texts, "view": "weighted:0.5,0.25,0.25",
                                       "format": "base64"}).json()
    assert b32["dtype"] == "float32"
    w = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in b32["data"]])
    np.testing.assert_allclose(w, 0.5 * x[:, 0] + 0.25 * x[:, 1] + 0.25 * x[:, 2], rtol=1e-6, atol=1e-6)
    asked = c.post("/v1/features", json={"texts": texts, "view": "mean_all", "format": "base64",
                                         "dtype": "float16"}).json()
    assert asked["dtype"] == "float16" and len(base64.b64decode(asked["data"][0]["embedding"])) == 64


def test_concurrent_misses_share_one_job(tiny_api_factory) -> None:  # type: ignore[no-untyped-def]
    api = tiny_api_factory(batch_window_ms=200.0)  # a wide window: all arrive within it
    n = 6
    out: list = [None] * n
    barrier = threading.Barrier(n)

    def send(i: int) -> None:
        barrier.wait()
        out[i] = api.client.post("/v1/features", json={"texts": [f"concurrent text {i}"]})

    threads = [threading.Thread(target=send, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status_code for r in out] == [200] * n
    jobs = [j for j in api.client.get("/v1/jobs").json()["data"] if j["kind"] == "encode"]
    assert len(jobs) == 1 and jobs[0]["result"]["texts_encoded"] == n


def test_openai_embeddings_shape(tiny_api) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api.client
    r = c.post("/v1/embeddings", json={"input": "a text", "model": "whatever-the-path-is"})
    assert r.status_code == 422
    # OpenAI's error shape on this route only: the SDK shows error.message
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", "model", "validation")
    assert err["message"].startswith("model 'whatever-the-path-is' is not served here")
    assert "send model= one of 'default'" in err["message"]
    assert c.post("/v1/features", json={"texts": ["a"], "model": "nope"}).json()["type"] == "validation"
    name = c.get("/info").json()["model"]["name"]
    r = c.post("/v1/embeddings", json={"input": ["a text", "b text"], "model": name,
                                       "encoding_format": "base64"})
    body = r.json()
    assert body["object"] == "list" and [d["object"] for d in body["data"]] == ["embedding"] * 2
    vec = np.frombuffer(base64.b64decode(body["data"][1]["embedding"]), "<f4")
    feats = _rows(c.post("/v1/features", json={"texts": ["b text"]}).json())
    np.testing.assert_array_equal(vec, feats[0])
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0


def test_openai_route_errors_before_the_route_runs_are_in_openai_shape(tiny_api) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api.client
    # pydantic's validation (no input), an unknown method, a body that is not JSON
    missing = c.post("/v1/embeddings", json={"model": "default"})
    assert missing.status_code == 422
    assert missing.json() == {"error": {"message": "input: Field required", "type": "invalid_request_error",
                                        "param": "input", "code": "validation"}}
    wrong_method = c.get("/v1/embeddings")
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["message"].endswith("allowed: POST")
    not_json = c.post("/v1/embeddings", content=b"\xff", headers={"content-type": "application/json"})
    assert not_json.status_code == 422 and "not valid JSON" in not_json.json()["error"]["message"]

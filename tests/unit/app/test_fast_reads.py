"""Cached reads answered before routing (app/api/fast_reads.py): the same bytes as the
route's own answer, the stored float32 numbers exactly, and every guard still in front."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest

from layerbank.app.api.deps import ApiKeyGuard
from layerbank.app.api.fast_reads import CachedReads
from layerbank.cache.keys import text_key
from layerbank.cache.views import parse_view

TEXTS = ["a cached text", "another cached text, a little longer", "a third"]
FEATURES = [{}, {"view": "layer:-1"}, {"view": "layers:0,2", "pooling": "cls"},
            {"view": "mean_all"}, {"view": "weighted:0.2,0.3,0.5"}, {"view": "all_layers", "format": "base64"},
            {"view": "all_layers"}, {"view": "layer:1", "format": "base64", "dtype": "float32"},
            {"view": "layer:1", "format": "base64"}]
EMBEDDINGS = [{}, {"normalize": True}, {"normalize": False}, {"encoding_format": "base64"}, {"view": "layer:1", "pooling": "cls"}]


def _layer(api: Any, kind: type) -> Any:
    app = api.client.app.middleware_stack
    while not isinstance(app, kind):
        app = app.app
    return app


def _front(api: Any) -> CachedReads:
    return _layer(api, CachedReads)  # type: ignore[no-any-return]


def _both(api: Any, path: str, body: dict[str, Any]) -> tuple[bytes, bytes]:
    """(the route's answer, the fast path's), checking that the fast path gave the second."""
    front = _front(api)
    front.enabled = False
    slow = api.client.post(path, json=body)
    front.enabled = True
    answered = []
    real = front.answers[path]
    front.answers[path] = lambda state, raw: answered.append(out := real(state, raw)) or out
    try:
        fast = api.client.post(path, json=body)
    finally:
        front.answers[path] = real
    assert slow.status_code == fast.status_code == 200, (slow.text, fast.text)
    assert answered and answered[0] is not None, "the fast path did not answer"
    return slow.content, fast.content


@pytest.mark.parametrize("storage", ["float16", "int8"])
def test_fast_answers_are_the_route_s_bytes_and_the_stored_numbers(tiny_api_factory, storage: str) -> None:  # type: ignore[no-untyped-def]
    api = tiny_api_factory(storage_dtype=storage, poolings="mean,cls")
    assert api.client.post("/v1/features", json={"texts": TEXTS}).status_code == 200  # stored
    state = api.client.app.state.layerbank
    m = state.model
    for extra in FEATURES:
        slow, fast = _both(api, "/v1/features", {"texts": TEXTS, **extra})
        assert fast == slow, extra
        body = json.loads(fast)
        assert json.dumps(body, separators=(",", ":")).encode() == fast  # json.dumps's own text
        view = parse_view(body["view"])
        keys = [text_key(m.fingerprint, m.config, t) for t in TEXTS]
        want = state.store.read_view(keys, view, body["pooling"], m.n_hidden_states).data
        if body["format"] == "base64":
            dtype = "<f2" if body["dtype"] == "float16" else "<f4"
            got = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype) for d in body["data"]])
            got = got.astype(np.float32).reshape(want.shape)
        else:
            raw = np.array([d["embedding"] for d in body["data"]], dtype=np.float64)
            got = raw.astype(np.float32)
            np.testing.assert_array_equal(got.astype(np.float64), raw)  # float32 values, exactly
        np.testing.assert_array_equal(got, want)
        assert all(d["cached"] for d in body["data"]) and body["usage"]["cache_hits"] == len(TEXTS)
    for extra in EMBEDDINGS:
        slow, fast = _both(api, "/v1/embeddings", {"input": TEXTS, "model": "default", **extra})
        assert fast == slow, extra
    slow, fast = _both(api, "/v1/embeddings", {"input": TEXTS[0]})
    assert fast == slow
    assert len(state.rows) >= len(TEXTS)


def test_guards_errors_and_metrics_stay_in_front_of_the_fast_path(tiny_api_factory) -> None:  # type: ignore[no-untyped-def]
    api = tiny_api_factory(max_body_bytes=2000, max_chars_per_text=50)
    _layer(api, ApiKeyGuard).key = b"k"  # set once ready: the fixture's /ready polls carry no key
    key = {"Authorization": "Bearer k"}
    c = api.client
    assert c.post("/v1/features", json={"texts": TEXTS}, headers=key).status_code == 200
    assert c.post("/v1/features", json={"texts": TEXTS}, headers=key).json()["usage"]["cache_hits"] == 3
    r = c.post("/v1/features", json={"texts": TEXTS})
    assert r.status_code == 401 and r.json()["type"] == "unauthorized"
    r = c.post("/v1/embeddings", json={"input": TEXTS}, headers={"Authorization": "Bearer x"})
    assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
    r = c.post("/v1/features", json={"texts": TEXTS, "view": "layer:9"}, headers=key)
    assert r.status_code == 422 and r.json()["field"] == "view"
    r = c.post("/v1/features", content=json.dumps({"texts": TEXTS}), headers={**key, "content-type": "text/plain"})
    assert r.status_code == 415
    r = c.post("/v1/features", json={"texts": TEXTS + ["x" * 60]}, headers=key)
    assert r.status_code == 413 and r.json()["limit"] == "max_chars_per_text"
    r = c.post("/v1/features", json={"texts": TEXTS * 40}, headers=key)
    assert r.status_code == 413 and r.json()["limit"] == "max_body_bytes"
    r = c.post("/v1/embeddings", json={"input": TEXTS, "dimensions": 7}, headers=key)
    assert r.status_code == 422 and r.json()["error"]["param"] == "dimensions"
    metrics = c.get("/metrics", headers=key).text
    assert 'route="/v1/features",status="200"' in metrics and 'route="unmatched",status="200"' not in metrics


def test_a_keyless_server_refuses_cross_site_cached_reads(tiny_api) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api.client
    assert c.post("/v1/features", json={"texts": TEXTS}).status_code == 200
    assert c.post("/v1/features", json={"texts": TEXTS}).json()["usage"]["cache_hits"] == 3
    r = c.post("/v1/features", json={"texts": TEXTS}, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and r.json()["type"] == "forbidden"
    r = c.post("/v1/embeddings", json={"input": TEXTS}, headers={"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    r = c.post("/v1/features", json={"texts": TEXTS}, headers={"Host": "evil.example"})
    assert r.status_code == 403

"""One error shape everywhere, the status table, the API key, and no torch in the app."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _err(r, status: int, type_: str) -> dict:  # type: ignore[no-untyped-def]
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == type_ and isinstance(body["error"], str) and body["error"]
    assert set(body) <= {"error", "type", "field", "limit"}
    return body  # type: ignore[no-any-return]


def test_not_ready_until_a_worker_registers_a_model(tiny_api_factory) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api_factory(worker=False).client
    assert c.get("/health").json() == {"status": "ok"}
    r = c.get("/ready")
    assert r.status_code == 503 and r.json()["checks"] == {"catalog": True, "worker": False,
                                                            "model": False}
    assert r.json()["type"] == "not_ready" and "no live worker" in r.json()["error"]
    body = _err(c.post("/v1/features", json={"texts": ["a"]}), 503, "not_ready")
    assert "still loading" in body["error"]
    _err(c.post("/v1/datasets", json={"name": "d", "texts": ["a"]}), 503, "not_ready")
    info = c.get("/info").json()
    assert info["ready"] is False and info["model"] is None and info["defaults"]["view"] == "layer:-2"


def test_framework_errors_come_out_in_the_same_shape(tiny_api_factory) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api_factory(worker=False, max_body_bytes=2048).client
    assert "allowed: POST" in _err(c.get("/v1/features"), 405, "method_not_allowed")["error"]
    assert c.get("/v1/features").headers["allow"] == "POST"
    _err(c.get("/nowhere"), 404, "not_found")
    _err(c.put("/v1/jobs/x"), 405, "method_not_allowed")
    bad = _err(c.post("/v1/features", content=b"{nope", headers={"content-type": "application/json"}),
               422, "validation")
    assert bad["field"] == "body" and "not valid JSON" in bad["error"]
    _err(c.post("/v1/features", content=b"texts=a",
                headers={"content-type": "application/x-www-form-urlencoded"}), 415, "unsupported_media_type")
    _err(c.post("/v1/features", content=b'{"texts": ["a"]}'), 415, "unsupported_media_type")
    many = _err(c.post("/v1/features", json={"texts": ["x" * 3000]}), 413, "too_large")
    assert many["limit"] == "max_body_bytes" and "2,048 bytes" in many["error"]
    chunked = _err(c.post("/v1/features", content=iter([b"{" + b" " * 1500, b" " * 1500 + b"}"]),
                          headers={"content-type": "application/json"}), 413, "too_large")
    assert chunked["limit"] == "max_body_bytes"
    v = _err(c.post("/v1/features", json={"texts": "not a list"}), 422, "validation")
    assert v["field"] == "texts" and v["error"].startswith("texts: ")
    _err(c.get("/v1/jobs", params={"limit": 0}), 422, "validation")
    _err(c.get("/v1/jobs", params={"state": "exploded"}), 422, "validation")
    _err(c.get("/v1/jobs/abc"), 404, "not_found")
    _err(c.delete("/v1/datasets/abc"), 404, "not_found")


def test_limits_name_the_setting(tiny_api_factory) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api_factory(max_texts_per_request=3, max_chars_per_text=10).client
    r = _err(c.post("/v1/features", json={"texts": ["a", "b", "c", "d"]}), 413, "too_large")
    assert r["limit"] == "max_texts_per_request"
    assert r["error"] == "4 texts in one request; the limit is max_texts_per_request (3)"
    r = _err(c.post("/v1/features", json={"texts": ["short", "far too long a text"]}), 413, "too_large")
    assert r["error"] == "texts.1 has 19 characters; the limit is max_chars_per_text (10)"
    r = _err(c.post("/v1/features", json={"texts": ["a"], "view": "layer:3"}), 422, "validation")
    assert r["error"].startswith("layer 3 does not exist; this model has hidden states 0..2")
    assert r["field"] == "view"
    r = _err(c.post("/v1/features", json={"texts": ["a"], "view": "weighted:1,2"}), 422, "validation")
    assert "needs 3 weights" in r["error"]


@pytest.mark.parametrize("path", ["/ready", "/info", "/metrics", "/v1/datasets", "/v1/jobs/x",
                                  "/openapi.json"])
def test_api_key_guards_every_route_but_health(tiny_api_factory, path: str) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api_factory(worker=False, api_key="s3cret").client
    assert c.get("/health").status_code == 200
    r = _err(c.get(path), 401, "unauthorized")
    assert r["error"].startswith("missing or wrong API key")
    assert c.get(path).headers["www-authenticate"] == "Bearer"
    _err(c.get(path, headers={"Authorization": "Bearer wrong"}), 401, "unauthorized")
    _err(c.get(path, headers={"Authorization": "Basic s3cret"}), 401, "unauthorized")
    ok = c.get(path, headers={"Authorization": "Bearer s3cret"})
    # past the guard, the route's own answer (no worker: /ready 503; no job x: 404), never a 5xx
    want = {"/ready": 503, "/v1/jobs/x": 404}.get(path, 200)
    assert ok.status_code == want, (path, ok.status_code, ok.text)


def test_the_app_never_imports_torch() -> None:
    code = ("import sys, layerbank.app.api.main, layerbank.app.client, layerbank.app.cli.main, layerbank.app.cli.serve, layerbank.app.cli.worker\n"
            "from layerbank.app.api.settings import Settings\n"
            "layerbank.app.api.main.create_app(Settings(data_dir=sys.argv[1]))\n"
            "layerbank.app.cli.main.build_parser()\n"
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'transformers')))\n"
            "assert not bad, bad\n")
    r = subprocess.run([sys.executable, "-c", code, "/tmp/layerbank-no-torch"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_openapi_documents_the_error_shape(tiny_api_factory) -> None:  # type: ignore[no-untyped-def]
    spec = tiny_api_factory(worker=False).client.get("/openapi.json").json()
    feats = spec["paths"]["/v1/features"]["post"]["responses"]
    assert feats["422"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    upload = spec["paths"]["/v1/datasets"]["post"]["requestBody"]["content"]
    assert set(upload) == {"application/json", "multipart/form-data"}
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    # the Host/Origin guard answers before routing: every operation documents its 403
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            assert "403" in op["responses"], (method, path)
    shape = spec["paths"]["/v1/embeddings"]["post"]["responses"]["403"]["content"]["application/json"]
    assert shape["schema"]["$ref"].endswith("/OpenAIErrorResponse")  # OpenAI's shape there


def test_views_are_held_to_the_grammar_the_schema_states(tiny_api) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api.client
    import re

    spec = c.get("/openapi.json").json()
    pattern = spec["components"]["schemas"]["FeaturesRequest"]["properties"]["view"]["anyOf"][0]["pattern"]
    model = spec["components"]["schemas"]["FeaturesRequest"]["properties"]["model"]["anyOf"][0]["enum"]
    assert tiny_api.worker.encoder.fingerprint in model
    for view, ok in [("layer:-3", True), ("layers:0,2", True), ("weighted:1,0.5,.25", True),
                     ("layer:3", False), (" layer:-1", False), ("layer:01", False), ("", False),
                     ("weighted:1_0,1,1", False), ("concat_last_4", False)]:
        r = c.post("/v1/features", json={"texts": ["grammar"], "view": view})
        assert (r.status_code == 200) is ok, (view, r.text)
        assert bool(re.fullmatch(pattern, view)) is ok, view
        if not ok:
            assert r.json()["field"] == "view"
    assert c.post("/v1/features", json={"texts": ["grammar"], "model": ""}).status_code == 422

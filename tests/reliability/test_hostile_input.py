"""Hostile and malformed input against a real server: each gets a 4xx with a
clear message in the one error shape, and the server keeps answering.

The server (``rel_server``) has small limits: 64 texts per request, 2,000
characters per text, a 16 MiB body, 5,000 texts per dataset.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.conftest import ServerProcess

from .conftest import phrases

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

JSON = {"content-type": "application/json"}
NEST = 100_000  # far past Python's recursion limit


def _chunks(n: int, size: int) -> Iterator[bytes]:
    yield b'{"texts": ["'
    for _ in range(n):
        yield b"a" * size
    yield b'"]}'


def _upload(name: str, data: bytes, **form: str) -> dict[str, Any]:
    return {"files": {"file": (name, data, "application/octet-stream")}, "data": form}


# (case, method, path, request kwargs, status, type, words the message must hold)
CASES: list[tuple[str, str, str, dict[str, Any], int, str, str]] = [
    ("body over the limit (Content-Length)", "POST", "/v1/features",
     {"content": b'{"texts": ["' + b"a" * (17 << 20) + b'"]}', "headers": JSON},
     413, "too_large", "request body exceeds max_body_bytes (16,777,216 bytes)"),
    ("body over the limit (chunked, no length)", "POST", "/v1/features",
     {"content": _chunks(200, 100_000), "headers": JSON},
     413, "too_large", "request body exceeds max_body_bytes"),
    ("a huge text", "POST", "/v1/features", {"json": {"texts": ["word " * 100_000]}},
     413, "too_large", "texts.0 has 500,000 characters; the limit is max_chars_per_text (2,000)"),
    ("a huge text, OpenAI route", "POST", "/v1/embeddings", {"json": {"input": "x" * 5000}},
     413, "too_large", "input.0 has 5,000 characters"),
    ("a huge text in a dataset", "POST", "/v1/datasets",
     {"json": {"name": "big", "texts": ["ok text", "y" * 3000]}},
     413, "too_large", "texts.1 has 3,000 characters"),
    ("invalid UTF-8 in the JSON body", "POST", "/v1/features",
     {"content": b'{"texts": ["caf\xe9 au lait"]}', "headers": JSON},
     422, "validation", "the body is not valid JSON: it is not UTF-8 (byte 16 cannot be decoded)"),
    ("invalid UTF-8 in a dataset body", "POST", "/v1/datasets",
     {"content": b'{"name": "x", "texts": ["\xff\xfe"]}', "headers": JSON},
     422, "validation", "the body is not valid JSON"),
    ("a lone surrogate in a text", "POST", "/v1/features",
     {"content": b'{"texts": ["ok", "bad \\udc80"]}', "headers": JSON},
     422, "validation", "texts.1 is not valid Unicode (it holds a lone surrogate)"),
    ("a lone surrogate in a label", "POST", "/v1/datasets",
     {"content": b'{"name": "x", "texts": ["a b c"], "labels": ["\\ud800"]}', "headers": JSON},
     422, "validation", "labels.0 is not valid Unicode"),
    ("a lone surrogate in an uploaded label", "POST", "/v1/datasets",
     _upload("x.jsonl", b'{"text": "a b c", "label": "\\ud800"}\n', label_column="label"),
     422, "validation", "labels.0 is not valid Unicode"),
    ("invalid UTF-8 in an uploaded CSV", "POST", "/v1/datasets",
     _upload("x.csv", b"text,label\nfine,1\nbro\xffken,0\n"),
     422, "validation", "file: line 3 is not valid UTF-8"),
    ("invalid UTF-8 in an uploaded CoNLL file", "POST", "/v1/datasets",
     _upload("x.conll", b"EU B-ORG\nrej\xe9cts O\n"),
     422, "validation", "line 2: not UTF-8"),
    ("NaN weight", "POST", "/v1/features", {"json": {"texts": ["a b"], "view": "weighted:nan,1,1"}},
     422, "validation", "weights must be finite numbers, got nan"),
    ("infinite weight", "POST", "/v1/features",
     {"json": {"texts": ["a b"], "view": "weighted:1,-inf,1"}},
     422, "validation", "weights must be finite numbers, got -inf"),
    ("weights that overflow float32", "POST", "/v1/features",
     {"json": {"texts": ["a b"], "view": "weighted:1e99,1,1"}},
     422, "validation", "these weights make values too large for float32"),
    ("weights that overflow float32, OpenAI route", "POST", "/v1/embeddings",
     {"json": {"input": ["a b"], "view": "weighted:3e38,3e38,3e38"}},
     422, "validation", "too large for float32"),
    ("a NaN literal where a view goes", "POST", "/v1/features",
     {"content": b'{"texts": ["a b"], "view": NaN}', "headers": JSON},
     422, "validation", "view: Input should be a valid string"),
    ("a view that names a layer 100,000 times", "POST", "/v1/features",
     {"json": {"texts": ["a b"], "view": "layers:" + ",".join(["0"] * 100_000)}},
     422, "validation", "100,000 layers; a view names at most 256"),
    ("deeply nested JSON", "POST", "/v1/features",
     {"content": b"[" * NEST + b"]" * NEST, "headers": JSON},
     422, "validation", "the body is not valid JSON: it is nested too deeply"),
    ("deeply nested JSON inside a field", "POST", "/v1/embeddings",
     {"content": b'{"input": ' + b"[" * NEST + b"]" * NEST + b"}", "headers": JSON},
     422, "validation", "nested too deeply"),
    ("deeply nested JSON to datasets", "POST", "/v1/datasets",
     {"content": b'{"name": "x", "texts": ' + b"[" * NEST + b"]" * NEST + b"}", "headers": JSON},
     422, "validation", "nested too deeply"),
    ("deeply nested JSONL upload", "POST", "/v1/datasets",
     _upload("x.jsonl", b"[" * NEST + b"]" * NEST + b"\n"),
     422, "validation", "line 1 is not valid JSON: it is nested too deeply"),
    ("deeply nested JSON word-set upload", "POST", "/v1/datasets",
     _upload("x.json", b"[" * NEST + b"]" * NEST, task="token", format="words_json"),
     422, "validation", "nested too deeply"),
    ("texts that are not strings", "POST", "/v1/features", {"json": {"texts": [1, {"a": 2}]}},
     422, "validation", "texts.0: Input should be a valid string"),
    ("not JSON at all", "POST", "/v1/features", {"content": b"\x00\x01\x02", "headers": JSON},
     422, "validation", "the body is not valid JSON"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_gets_a_clear_4xx(rel_server: ServerProcess, case: tuple) -> None:
    _, method, path, kwargs, status, type_, words = case
    if "content" in kwargs and not isinstance(kwargs["content"], bytes):
        kwargs = {**kwargs, "content": _chunks(200, 100_000)}  # a generator runs only once
    r = rel_server.request(method, path, **kwargs)
    assert r.status_code == status, r.text[:500]
    body = r.json()
    if path == "/v1/embeddings":  # OpenAI's error shape there, our type as its code
        body = {"type": body["error"]["code"], "error": body["error"]["message"]}
    assert body["type"] == type_
    assert words in body["error"], body["error"][:500]
    assert len(r.content) < 4096  # the message names the problem; it does not echo the input
    assert rel_server.get("/health").status_code == 200


def test_millions_of_tiny_texts_are_refused_and_the_server_stays_responsive(
        rel_server: ServerProcess) -> None:
    body = json.dumps({"texts": ["a"] * 2_000_000}).encode()  # 10 MB, under the body limit
    ds_body = json.dumps({"name": "many", "texts": ["a"] * 2_000_000}).encode()
    health: list[float] = []
    stop = threading.Event()

    def ping() -> None:
        with httpx.Client(base_url=rel_server.url, timeout=30) as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                assert c.get("/health").status_code == 200
                health.append(time.perf_counter() - t0)
                time.sleep(0.05)

    pinger = threading.Thread(target=ping)
    pinger.start()
    try:
        t0 = time.perf_counter()
        r = rel_server.post("/v1/features", content=body, headers=JSON)
        features_s = time.perf_counter() - t0
        r2 = rel_server.post("/v1/datasets", content=ds_body, headers=JSON)
    finally:
        stop.set()
        pinger.join(30)
    assert r.status_code == 413 and r.json()["limit"] == "max_texts_per_request", r.text[:300]
    assert r.json()["error"] == ("2,000,000 texts in one request; the limit is max_texts_per_request "
                                 "(64)")
    assert r2.status_code == 413 and r2.json()["limit"] == "max_dataset_texts", r2.text[:300]
    assert features_s < 30
    # /health kept answering; the slowest answer waited at most for one parse of the body
    assert len(health) >= 1 and max(health) < 15, health
    # and afterwards the server works normally
    texts = phrases(3, 0)
    r = rel_server.post("/v1/features", json={"texts": texts})
    assert r.status_code == 200 and len(r.json()["data"]) == 3

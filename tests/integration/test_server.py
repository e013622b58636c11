"""A real ``layerbank serve`` (bundled model, one shared server) driven over HTTP:
features against the store and a direct encoder run, cache hits, micro-batching,
overload, datasets with progress events, cancellation, and the error table."""

from __future__ import annotations

import base64
import importlib.metadata
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from layerbank.cache.keys import text_key
from layerbank.cache.store import FeatureStore
from layerbank.cache.views import parse_view

from .conftest import ROOT, SHARED_SETTINGS, ServerProcess, sst_sentences, write_tsv

pytestmark = pytest.mark.integration


def _model(server: ServerProcess) -> tuple[str, str]:
    info = server.get("/info").json()["model"]
    return info["fingerprint"], info["extraction_config"]


def _store_rows(server: ServerProcess, texts: list[str], view: str, pooling: str = "mean") -> np.ndarray:
    fp, cfg = _model(server)
    store = FeatureStore(server.data_dir)
    try:
        res = store.read_view([text_key(fp, cfg, t) for t in texts], parse_view(view), pooling, 7)
        assert res.found.all()
        return res.data
    finally:
        store.close()


def test_health_ready_info(layerbank_server: ServerProcess) -> None:
    s = layerbank_server
    assert s.get("/health").json() == {"status": "ok"}
    ready = s.get("/ready")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"catalog": True, "worker": True, "model": True}
    info = s.get("/info").json()
    assert (info["layers"], info["n_hidden_states"], info["hidden_size"]) == (6, 7, 384)
    assert (info["dtype"], info["precision"]) == ("float16", "fp32")
    assert info["defaults"]["view"] == "layer:-2" and info["defaults"]["pooling"] == "mean"
    assert "second-to-last" in info["defaults"]["description"]
    assert info["limits"]["max_texts_per_request"] == SHARED_SETTINGS["max_texts_per_request"]
    assert info["poolings"] == ["mean", "cls", "max"]
    assert info["version"] == importlib.metadata.version("layerbank") == "0.2.0"


def test_features_equal_store_and_direct_encoder_then_hit_the_cache(layerbank_server: ServerProcess) -> None:
    s = layerbank_server
    texts, _ = sst_sentences(12, 0)
    first = s.post("/v1/features", json={"texts": texts})
    assert first.status_code == 200, first.text
    body = first.json()
    assert (body["view"], body["pooling"], body["dim"], body["shape"]) == ("layer:-2", "mean", 384, [384])
    assert [d["index"] for d in body["data"]] == list(range(12))
    assert not any(d["cached"] for d in body["data"])
    x = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    n_tokens = [d["n_tokens"] for d in body["data"]]
    assert body["usage"] == {"texts": 12, "cache_hits": 0, "tokens_computed": sum(n_tokens)}

    # what the store holds, read directly: the very same numbers
    np.testing.assert_array_equal(x, _store_rows(s, texts, "layer:-2"))

    # an independent encoder run in this process: equal at float16 storage precision
    import torch

    from layerbank.workers.encoder import Encoder

    torch.set_num_threads(1)
    enc = Encoder.load(device="cpu")
    tok = enc.tokenize(texts)
    direct = enc.encode(tok).pooled["mean"][:, 5]
    assert tok.lengths == n_tokens
    np.testing.assert_allclose(x, direct, rtol=2e-3, atol=2e-3)
    assert np.abs(x - direct).max() > 0  # stored as float16: not bit-equal to float32

    hits_before = s.metric("layerbank_cache_hits_total")
    second = s.post("/v1/features", json={"texts": texts}).json()
    assert all(d["cached"] for d in second["data"])
    assert second["usage"] == {"texts": 12, "cache_hits": 12, "tokens_computed": 0}
    np.testing.assert_array_equal(np.array([d["embedding"] for d in second["data"]], np.float32), x)
    assert s.metric("layerbank_cache_hits_total") - hits_before == 12


def test_all_layers_base64_and_computed_views(layerbank_server: ServerProcess) -> None:
    s = layerbank_server
    texts, _ = sst_sentences(3, 20)
    js = s.post("/v1/features", json={"texts": texts, "view": "all_layers"}).json()
    assert js["shape"] == [7, 384] and js["dim"] == 384
    full = np.array([d["embedding"] for d in js["data"]], dtype=np.float32)
    assert full.shape == (3, 7, 384)
    b64 = s.post("/v1/features", json={"texts": texts, "view": "all_layers", "format": "base64"}).json()
    assert (b64["format"], b64["dtype"]) == ("base64", "float16")  # stored rows: lossless
    dec = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f2") for d in b64["data"]])
    np.testing.assert_array_equal(dec.reshape(3, 7, 384).astype(np.float32), full)
    summed = s.post("/v1/features", json={"texts": texts, "view": "sum_last_4", "pooling": "mean",
                                          "format": "base64"}).json()
    assert summed["dtype"] == "float32"  # a computed view is not a float16 row
    got = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in summed["data"]])
    np.testing.assert_allclose(got, full[:, 3:].sum(axis=1), rtol=1e-6, atol=1e-6)
    # the client decodes the same numbers
    np.testing.assert_array_equal(s.client().features(texts, view="all_layers"), full)


def _concurrently(fn, n: int) -> list:  # type: ignore[no-untyped-def]
    out: list = [None] * n
    go = threading.Barrier(n)

    def run(i: int) -> None:
        go.wait()
        out[i] = fn(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_concurrent_misses_share_encoder_jobs(layerbank_server: ServerProcess) -> None:
    s = layerbank_server
    texts, _ = sst_sentences(4, 30)
    jobs_before = {j["id"] for j in s.get("/v1/jobs", params={"limit": 1000}).json()["data"]}
    batches_before = s.metric("layerbank_encode_batches_total")
    with httpx.Client(base_url=s.url, timeout=60) as c:
        rs = _concurrently(lambda i: c.post("/v1/features", json={"texts": [texts[i]]}), 4)
    assert [r.status_code for r in rs] == [200] * 4
    new = [j for j in s.get("/v1/jobs", params={"limit": 1000}).json()["data"]
           if j["id"] not in jobs_before and j["kind"] == "encode"]
    batches = s.metric("layerbank_encode_batches_total") - batches_before
    assert len(new) == batches and 1 <= batches < 4  # at least two requests shared a job
    assert sum(j["result"]["texts_encoded"] for j in new) == 4


def test_overload_is_429_naming_the_limit(layerbank_server: ServerProcess) -> None:
    s = layerbank_server
    texts, _ = sst_sentences(5, 40)
    worker = s.worker_pid()
    depth = SHARED_SETTINGS["max_queue_depth"]
    os.kill(worker, signal.SIGSTOP)  # the worker stalls: misses pile up
    try:
        with httpx.Client(base_url=s.url, timeout=60) as c:
            results: list = []
            threads = [threading.Thread(target=lambda t=t: results.append(
                c.post("/v1/features", json={"texts": [t]}))) for t in texts[:depth]]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 20
            while s.metric("layerbank_queue_depth", 'queue="requests_waiting_for_misses"') < depth:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            over = c.post("/v1/features", json={"texts": [texts[depth]]})
            assert over.status_code == 429
            assert over.json()["type"] == "overloaded" and over.json()["limit"] == "max_queue_depth"
            assert f"max_queue_depth={depth}" in over.json()["error"]
            assert over.headers["retry-after"] == "1"
            os.kill(worker, signal.SIGCONT)
            for t in threads:
                t.join()
    finally:
        os.kill(worker, signal.SIGCONT)
    assert [r.status_code for r in results] == [200] * depth


def test_dataset_upload_runs_with_progress_events(layerbank_server: ServerProcess, tmp_path: Path) -> None:
    s = layerbank_server
    texts, labels = sst_sentences(150, 100)
    lb = s.client()
    ds = lb.upload_dataset(path=write_tsv(tmp_path / "sst.tsv", texts, labels), label_column="label")
    assert (ds["name"], ds["n_items"], ds["task"], ds["labels"]) == ("sst", 150, "sentence", ["0", "1"])
    assert ds["job"]["state"] in ("queued", "running")
    events = list(lb.events(ds))
    assert events[-1][0] == "done" and [e for e, _ in events[:-1]] == ["progress"] * (len(events) - 1)
    done = [j["progress"].get("done", 0) for _, j in events]
    assert done == sorted(done) and len(events) >= 2
    final = events[-1][1]
    assert final["state"] == "succeeded"
    assert final["progress"]["done"] == final["progress"]["total"] == 150
    assert final["progress"]["tokens_per_second"] > 0 and final["progress"]["eta_seconds"] == 0
    assert final["result"]["texts_encoded"] == 150 and final["result"]["cache_hits"] == 0

    x = lb.dataset_features(ds["id"], view="layer:-2")
    assert x.shape == (150, 384) and x.dtype == np.float32
    np.testing.assert_array_equal(x, _store_rows(s, texts, "layer:-2"))
    sample = s.post("/v1/features", json={"texts": texts[:64]}).json()
    assert all(d["cached"] for d in sample["data"])
    np.testing.assert_array_equal(np.array([d["embedding"] for d in sample["data"]], np.float32), x[:64])
    r = s.get(f"/v1/datasets/{ds['id']}/features", params={"view": "all_layers", "pooling": "cls"})
    assert r.headers["content-type"] == "application/x-npy"
    assert int(r.headers["content-length"]) == len(r.content)

    assert ds["id"] in [d["id"] for d in lb.datasets()]
    assert s.delete(f"/v1/datasets/{ds['id']}").json() == {"id": ds["id"], "deleted": True}
    assert s.get(f"/v1/datasets/{ds['id']}").status_code == 404
    again = s.post("/v1/features", json={"texts": texts[64:128]}).json()  # features stay cached
    assert again["usage"]["cache_hits"] == 64


def test_word_dataset_stores_token_states(layerbank_server: ServerProcess) -> None:
    s = layerbank_server
    words = [["EU", "rejects", "German", "call"], ["Peter", "Blackburn", "of", "Brussels"]]
    tags = [["B-ORG", "O", "B-MISC", "O"], ["B-PER", "I-PER", "O", "B-LOC"]]
    bad = s.post("/v1/datasets", json={"name": "ner", "words": words, "tags": [tags[0], ["O"]]})
    assert bad.status_code == 422 and bad.json()["error"] == "tags.1 has 1 tags for 4 words"
    ds = s.post("/v1/datasets", json={"name": "ner", "words": words, "tags": tags}).json()
    assert ds["task"] == "token" and ds["n_items"] == 2
    s.client().wait(ds, timeout=60)
    fp, cfg = _model(s)
    store = FeatureStore(s.data_dir)
    try:
        rows = store.read_tokens(text_key(fp, cfg, "EU rejects German call"))
        assert rows is not None and rows.states.shape[1:] == (7, 384)
        assert rows.char_spans.tolist()[1] == [0, 2]  # "eu" after [CLS]
    finally:
        store.close()


def test_cancel_a_dataset_job(layerbank_server: ServerProcess) -> None:
    s = layerbank_server
    texts, _ = sst_sentences(300, 300)
    ds = s.post("/v1/datasets", json={"name": "big", "texts": texts}).json()
    r = s.delete(f"/v1/jobs/{ds['job_id']}")
    assert r.status_code in (200, 202) and r.json()["cancel_requested"]
    deadline = time.monotonic() + 60
    while (job := s.get(f"/v1/jobs/{ds['job_id']}").json())["state"] != "cancelled":
        assert job["state"] in ("queued", "running") and time.monotonic() < deadline
        time.sleep(0.1)
    assert job["progress"].get("done", 0) < 300
    conflict = s.get(f"/v1/datasets/{ds['id']}/features")
    assert conflict.status_code == 409 and "cancelled" in conflict.json()["error"]
    again = s.delete(f"/v1/jobs/{ds['job_id']}")
    assert again.status_code == 409 and again.json()["error"].endswith("already cancelled; nothing to cancel")


ERRORS = [
    # (method, path, kwargs, status, type, a piece of the message)
    ("POST", "/v1/features", {"json": {"texts": ["a"], "view": "layer:9"}}, 422, "validation",
     "layer 9 does not exist; this model has hidden states 0..6"),
    ("POST", "/v1/features", {"json": {"texts": ["a"], "view": "layer:x"}}, 422, "validation",
     "layer numbers must be integers"),
    ("POST", "/v1/features", {"json": {"texts": ["a"], "pooling": "median"}}, 422, "validation",
     "pooling: Input should be 'mean', 'cls', 'max' or 'last_token'"),
    ("POST", "/v1/features", {"json": {"view": "layer:-1"}}, 422, "validation", "texts: Field required"),
    ("POST", "/v1/features", {"json": {"texts": []}}, 422, "validation", "texts: List should have at least 1"),
    ("POST", "/v1/features", {"json": {"texts": ["ok", " "]}}, 422, "validation", "texts.1 is empty"),
    ("POST", "/v1/features", {"json": {"texts": ["a"], "colour": 1}}, 422, "validation", "colour: Extra inputs"),
    ("POST", "/v1/features", {"json": {"texts": ["a"], "model": "bert-large"}}, 422, "validation",
     "model 'bert-large' is not served here"),
    ("POST", "/v1/features", {"content": b'{"texts": ["a"', "headers": {"content-type": "application/json"}},
     422, "validation", "the body is not valid JSON"),
    ("POST", "/v1/features", {"content": b"a text", "headers": {"content-type": "text/plain"}}, 415,
     "unsupported_media_type", "send the body as JSON"),
    ("POST", "/v1/features", {"json": {"texts": ["a"] * 65}}, 413, "too_large",
     "65 texts in one request; the limit is max_texts_per_request (64)"),
    ("POST", "/v1/features", {"json": {"texts": ["a" * 2001]}}, 413, "too_large",
     "texts.0 has 2,001 characters; the limit is max_chars_per_text (2,000)"),
    ("POST", "/v1/features", {"json": {"texts": ["a " * 140_000]}}, 413, "too_large", "max_body_bytes"),
    ("POST", "/v1/features", {"content": [b"x" * 65536] * 5,  # streamed, no length; a list: each pass reads it
                              "headers": {"content-type": "application/json"}}, 413, "too_large",
     "request body exceeds max_body_bytes (262,144 bytes)"),
    ("GET", "/v1/features", {}, 405, "method_not_allowed", "allowed: POST"),
    ("GET", "/v2/nothing", {}, 404, "not_found", "no route /v2/nothing"),
    ("GET", "/v1/jobs/0123456789abcdef", {}, 404, "not_found", "no job '0123456789abcdef'"),
    ("DELETE", "/v1/jobs/nope", {}, 404, "not_found", "no job 'nope'"),
    ("GET", "/v1/jobs/nope/events", {}, 404, "not_found", "no job 'nope'"),
    ("GET", "/v1/datasets/ds_000000000000", {}, 404, "not_found", "no dataset 'ds_000000000000'"),
    ("GET", "/v1/datasets/..%2F..%2Fetc/features", {}, 404, "not_found", "no "),
    ("DELETE", "/v1/datasets/nope", {}, 404, "not_found", "no dataset 'nope'"),
    ("POST", "/v1/datasets", {"json": {"name": "x", "texts": ["a"], "labels": ["1", "2"]}}, 422,
     "validation", "labels has 2 items, texts has 1"),
    ("POST", "/v1/datasets", {"files": {"file": ("a.tsv", b"sentence\tlabel\nfine\t1\n")},
                              "data": {"label_column": "stars"}}, 422, "validation",
     "no label column 'stars'"),
    ("POST", "/v1/datasets", {"files": {"file": ("a.xlsx", b"PK")}}, 422, "validation",
     "cannot tell the format of 'a.xlsx'"),
    ("POST", "/v1/datasets", {"content": b"texts", "headers": {"content-type": "text/csv"}}, 415,
     "unsupported_media_type", "send JSON or a multipart/form-data upload"),
]


@pytest.mark.parametrize("method,path,kw,status,type_,message", ERRORS,
                         ids=[f"{e[3]}-{e[5][:30]}" for e in ERRORS])
def test_error_statuses_and_messages(layerbank_server: ServerProcess, method: str, path: str, kw: dict,
                                     status: int, type_: str, message: str) -> None:
    r = layerbank_server.request(method, path, **kw)
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) <= {"error", "type", "field", "limit"} and body["type"] == type_
    assert message in body["error"]


def test_the_openai_route_answers_errors_in_openai_shape(layerbank_server: ServerProcess) -> None:
    r = layerbank_server.post("/v1/embeddings", json={"input": [], "model": "x"})
    assert r.status_code == 422
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == "validation" and err["param"].startswith("input")  # "input.str": the union's arm
    assert err["message"].startswith("input") and err["type"] == "invalid_request_error"


@pytest.mark.sqlite_only  # the data directory's lock; on a PostgreSQL catalog a second server is a replica
def test_a_second_server_on_the_same_directory_is_refused(layerbank_server: ServerProcess) -> None:
    r = subprocess.run([sys.executable, "-m", "layerbank.app.cli.main", "serve", "--data-dir",
                        str(layerbank_server.data_dir), "--port", "0"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    assert f"is in use by pid {layerbank_server.proc.pid}" in r.stderr  # type: ignore[union-attr]


def test_a_public_host_needs_an_api_key(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "layerbank.app.cli.main", "serve", "--data-dir", str(tmp_path),
                        "--host", "0.0.0.0", "--port", "0"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env={k: v for k, v in os.environ.items() if not k.startswith("LAYERBANK_")})
    assert r.returncode == 2
    assert "refusing to listen on 0.0.0.0 without an API key" in r.stderr
    assert not (tmp_path / "layerbank.lock").exists()  # refused before touching the directory

"""Failure paths the audit of issue 16 found unguarded: each test here failed when the
line it guards was broken on purpose (docs/reliability.md lists which)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from layerbank.cache.catalog import Catalog
from layerbank.cache.shard import ShardContents, write_shard


def test_a_500_never_shows_the_traceback_or_the_exception(tiny_api, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    state = tiny_api.client.app.state.layerbank

    def boom() -> None:
        raise RuntimeError("secret-detail-4f2a in /srv/private/path.py")

    monkeypatch.setattr(state.datasets, "list", boom)
    c = TestClient(tiny_api.client.app, base_url="http://localhost", raise_server_exceptions=False)
    r = c.get("/v1/datasets")
    assert r.status_code == 500
    assert r.json() == {"error": "internal error; the server log has the details", "type": "internal"}
    assert "secret" not in r.text and "Traceback" not in r.text and "RuntimeError" not in r.text


def test_a_shard_is_fsynced_before_its_rename_and_its_directory_after(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    synced: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    renamed: list[str] = []
    real_replace = os.replace

    def replace(a, b) -> None:  # type: ignore[no-untyped-def]
        renamed.append(os.fspath(b))
        synced.append("<rename>")
        real_replace(a, b)

    monkeypatch.setattr(os, "fsync", spy)
    monkeypatch.setattr(os, "replace", replace)
    c = ShardContents(["0" * 64], np.ones(1), np.zeros(1), {"mean": np.ones((1, 2, 4), np.float32)})
    write_shard(tmp_path / "s.h5", c, "float16")
    assert synced == [str(tmp_path / "s.h5.tmp"), "<rename>", str(tmp_path)], synced
    assert renamed == [str(tmp_path / "s.h5")]


@pytest.mark.sqlite_only  # the SQLite file's pragmas
def test_the_catalog_runs_wal_with_synchronous_normal(tmp_path: Path) -> None:
    cat = Catalog(tmp_path / "catalog.sqlite")
    db = cat.conn()
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL (docs/reliability.md)
    cat.close()
    # a second process opening it finds WAL too (it is a property of the file)
    raw = sqlite3.connect(tmp_path / "catalog.sqlite")
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    raw.close()


def test_embeddings_usage_counts_cached_and_new_texts(tiny_api, tiny_encoder) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api.client
    cached = ["the first text is cached", "so is the second one here"]
    assert c.post("/v1/embeddings", json={"input": cached}).status_code == 200
    mixed = [cached[0], "a new text, never seen before", cached[1]]
    r = c.post("/v1/embeddings", json={"input": mixed})
    assert r.status_code == 200, r.text
    want = sum(len(ids) for ids in tiny_encoder.tokenize(mixed).input_ids)
    assert r.json()["usage"] == {"prompt_tokens": want, "total_tokens": want}
    one = c.post("/v1/embeddings", json={"input": cached[:1]}).json()["usage"]["prompt_tokens"]
    assert one == len(tiny_encoder.tokenize(cached[:1]).input_ids[0])  # all cached: still counted


def test_embeddings_dimensions_and_token_ids(tiny_api) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api.client
    plain = c.post("/v1/embeddings", json={"input": "width check"}).json()["data"][0]["embedding"]
    same = c.post("/v1/embeddings", json={"input": "width check", "dimensions": len(plain)})
    assert same.status_code == 200 and same.json()["data"][0]["embedding"] == plain
    r = c.post("/v1/embeddings", json={"input": "width check", "dimensions": len(plain) - 1})
    assert r.status_code == 422 and r.json()["error"]["param"] == "dimensions"
    assert f"this view gives {len(plain)}-dimensional vectors" in r.json()["error"]["message"]
    for ids in ([101, 2023, 102], [[101, 2023, 102]]):  # OpenAI's token-id input: not taken here
        r = c.post("/v1/embeddings", json={"input": ids})
        assert r.status_code == 422, (ids, r.text)
        assert r.json()["error"]["code"] == "validation"


DOCUMENTED_METRICS = [  # docs/api.md, "Operations"
    "layerbank_request_seconds", "layerbank_cache_hits_total", "layerbank_cache_misses_total",
    "layerbank_tokens_computed_total", "layerbank_texts_extracted_total", "layerbank_tokens_extracted_total",
    "layerbank_queue_depth", "layerbank_jobs", "layerbank_quarantined_shards_total",
    "layerbank_encode_batch_texts_total", "layerbank_encode_batches_total", "layerbank_store_keys",
    "layerbank_row_cache_rows", "layerbank_worker_restarts_total", "layerbank_workers_live"]


def test_every_documented_metric_series_is_exported(tiny_api) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api.client
    assert c.post("/v1/features", json={"texts": ["count me", "and me"]}).status_code == 200
    text = c.get("/metrics").text
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    names = {n.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum") for n in names}
    missing = [m for m in DOCUMENTED_METRICS if m not in names]
    assert not missing, (missing, sorted(names))
    hits = [line for line in text.splitlines() if line.startswith("layerbank_cache_misses_total")]
    assert hits and float(hits[0].rsplit(" ", 1)[1]) >= 2  # the two misses above were counted


def test_a_request_the_encoder_never_answers_is_a_504(tiny_api) -> None:  # type: ignore[no-untyped-def]
    tiny_api.worker.stop()  # its liveness record stays fresh for a while: the server still looks ready
    state = tiny_api.client.app.state.layerbank
    state.batcher.timeout_s = 0.5
    r = tiny_api.client.post("/v1/features", json={"texts": ["nobody will encode this"]})
    assert r.status_code == 504, r.text
    body = r.json()
    assert body["type"] == "timeout" and body["error"].startswith("the encoder did not answer within"), body

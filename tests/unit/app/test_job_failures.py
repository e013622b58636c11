"""Errors translated once: a failed job's stored type picks the HTTP status (507 for a
full disk), and domain input errors answer 422 naming their field.

The disk is made full for the data directory only (``shutil.disk_usage`` reports
1 KiB free there); the worker, its shard writer's room check, the runner and
the app are the real ones.
"""

from __future__ import annotations

import shutil
import time
from collections import namedtuple
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from layerbank.app.api.errors import install_error_handlers, job_failure
from layerbank.app.probes.wordsets import WordSetError
from layerbank.cache import space
from layerbank.cache.catalog import Catalog
from layerbank.cache.errors import InputError
from layerbank.cache.jobs import JobQueue
from layerbank.cache.views import parse_view

_Usage = namedtuple("_Usage", "total used free")


def _full_disk_under(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = shutil.disk_usage

    def usage(path: Any) -> Any:
        if Path(path).resolve().is_relative_to(root.resolve()):
            return _Usage(10 * 2**20, 10 * 2**20 - 1024, 1024)
        return real(path)

    monkeypatch.setattr(space.shutil, "disk_usage", usage)


def test_a_disk_full_job_answers_507_from_its_stored_type(tiny_api, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    c, data_dir = tiny_api.client, Path(tiny_api.settings.data_dir)
    _full_disk_under(data_dir, monkeypatch)
    r = c.post("/v1/features", json={"texts": ["a text that needs a shard", "and another"]})
    assert r.status_code == 507, r.text
    body = r.json()
    assert body["type"] == "insufficient_storage"
    assert body["error"].startswith("extraction failed: no space left on device while writing shard ")
    assert "free some space and run the job again" in body["error"]
    jobs = c.get("/v1/jobs", params={"state": "failed"}).json()["data"]
    assert [(j["kind"], j["error_type"]) for j in jobs] == [("encode", "storage")]
    assert jobs[0]["error"].startswith("ShardWriteError: no space left on device")

    monkeypatch.undo()  # room again: the same request succeeds
    r = c.post("/v1/features", json={"texts": ["a text that needs a shard", "and another"]})
    assert r.status_code == 200, r.text


def test_the_status_follows_the_stored_type_not_the_message(tmp_path: Path) -> None:
    q = JobQueue(Catalog(tmp_path / "catalog.sqlite"))
    kinds = {"words": ("ShardWriteError: looks like a full disk", "internal"),
             "type": ("no room for shard j-00000.h5", "storage"),
             "input": ("dataset d1 was deleted before it was extracted", "input")}
    answers = {}
    for name, (error, error_type) in kinds.items():
        jid = q.submit("encode", {})
        q.claim("w", ["encode"], lease_s=30)
        q.fail(jid, "w", error, error_type)
        job = q.get(jid)
        assert job is not None
        e = job_failure(job.error or "", job.error_type)
        answers[name] = (e.status, e.type, e.message)
    assert answers == {
        "words": (500, "extraction_failed", "extraction failed: ShardWriteError: looks like a full disk"),
        "type": (507, "insufficient_storage", "extraction failed: no room for shard j-00000.h5"),
        "input": (422, "validation", "extraction failed: dataset d1 was deleted before it was extracted")}


def _app_raising(exc: Exception) -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom() -> None:
        raise exc

    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize("exc, field, error", [
    (InputError("tags.3 has 4 tags for 5 words", field="tags.3"), "tags.3", "tags.3 has 4 tags for 5 words"),
    (WordSetError("no tab", line=7, source="train.tsv", field="file"), "file", "train.tsv, line 7: no tab"),
])
def test_domain_input_errors_are_422_naming_their_field(exc: Exception, field: str, error: str) -> None:
    r = _app_raising(exc).get("/boom")
    assert r.status_code == 422
    assert r.json() == {"error": error, "type": "validation", "field": field}


def test_a_view_error_names_the_view_field_without_a_route_saying_so() -> None:
    try:
        parse_view("layer:banana")
    except InputError as e:
        r = _app_raising(e).get("/boom")
    assert r.status_code == 422
    body = r.json()
    assert (body["type"], body["field"]) == ("validation", "view") and "banana" in body["error"]


def test_an_unknown_head_is_422_on_head_from_the_engine_itself(tiny_api) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api.client
    texts = [f"text number {i}" for i in range(8)]
    ds = c.post("/v1/datasets", json={"name": "d", "texts": texts, "labels": ["a", "b"] * 4}).json()
    deadline = time.monotonic() + 60
    while c.get(f"/v1/jobs/{ds['job_id']}").json()["state"] != "succeeded":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    r = c.post("/v1/heads", json={"dataset": ds["id"], "head": "forest", "view": "layer:-1"})
    assert r.status_code == 422, r.text
    body = r.json()
    assert (body["type"], body["field"]) == ("validation", "head")
    assert body["error"].startswith("unknown head 'forest'; choose one of logistic")

"""Probe and head jobs have the same back-pressure as extractions: with
``max_queue_depth`` of them queued, a new one is a 429 naming the limit, with
Retry-After, and nothing is queued (docs/reliability.md, "Overload is a 429")."""

from __future__ import annotations

from .test_probe_routes import _dataset, _labelled, api  # noqa: F401  (the fixture)


def test_a_full_probe_queue_is_a_429(api, monkeypatch) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    c = api.client
    texts, labels = _labelled(3)
    ds = _dataset(c, texts, labels, "bp")
    service = c.app.state.probe_service
    limit = api.settings.max_queue_depth
    real = service.queue.queued
    # as if `limit` probe/head jobs were waiting (the pool here runs them at once)
    monkeypatch.setattr(service.queue, "queued", lambda kinds=None: limit if kinds else real(kinds))
    before = len(c.get("/v1/jobs").json()["data"])
    for path, body in [("/v1/probes", {"dataset": ds["id"], "cv": 2}),
                       ("/v1/heads", {"dataset": ds["id"], "view": "layer:-1"})]:
        r = c.post(path, json=body)
        assert r.status_code == 429, (path, r.text)
        assert r.json() == {"error": f"overloaded: {limit} probe and head jobs are already queued "
                                     "(max_queue_depth); retry when one has started",
                            "type": "overloaded", "limit": "max_queue_depth"}
        assert r.headers["retry-after"] == "5"
    assert len(c.get("/v1/jobs").json()["data"]) == before  # nothing queued
    monkeypatch.setattr(service.queue, "queued", real)
    assert c.post("/v1/probes", json={"dataset": ds["id"], "cv": 2}).status_code == 202

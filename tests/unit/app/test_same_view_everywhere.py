"""One view, one verdict: every route that takes a view refuses a bad one with the same
422 before anything is queued (the report: a probe with ``weighted:1e99`` was accepted
with 202 and failed later, while /v1/features refused it)."""

from __future__ import annotations

from typing import Any

import pytest

from .test_probe_routes import _dataset, _labelled, api  # noqa: F401  (the fixture)

BAD_VIEWS = [("weighted:1e99,1,1", "these weights make values too large for float32"),
             ("weighted:1,nan,1", "weights must be finite numbers, got nan"),
             ("layer:7", "layer 7 does not exist"),
             ("layers:", "expected comma-separated layer numbers")]


@pytest.mark.parametrize("view,says", BAD_VIEWS)
def test_features_probes_and_heads_refuse_the_same_view(api, view: str, says: str) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    c = api.client
    texts, labels = _labelled(3)
    ds = _dataset(c, texts, labels, "views")
    jobs_before = len(c.get("/v1/jobs").json()["data"])
    answers: dict[str, Any] = {
        "features": c.post("/v1/features", json={"texts": texts[:1], "view": view}),
        "embeddings": c.post("/v1/embeddings", json={"input": texts[:1], "view": view}),
        "dataset matrix": c.get(f"/v1/datasets/{ds['id']}/features", params={"view": view}),
        "probe": c.post("/v1/probes", json={"dataset": ds["id"], "cv": 2, "views": [view]}),
        "head": c.post("/v1/heads", json={"dataset": ds["id"], "view": view}),
    }
    for route, r in answers.items():
        assert r.status_code == 422, (route, r.status_code, r.text)
        body = r.json()
        message = body["error"]["message"] if route == "embeddings" else body["error"]
        assert says in message, (route, body)
    assert len(c.get("/v1/jobs").json()["data"]) == jobs_before  # nothing queued to fail later

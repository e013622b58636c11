"""The lab's pages and the read-only dataset stats route, on the tiny encoder.

The pages themselves are driven in a real browser by tests/integration/test_lab.py;
here: which paths get the page shell, that it loads nothing from another host,
that it is reachable without the API key while the data it shows is not, and
the numbers of ``GET /v1/datasets/{id}/stats``.
"""

from __future__ import annotations

import re
import time
from importlib import resources
from typing import Any

import pytest

from layerbank.app.api.routes.dataset_stats import token_histogram


def _wait(c: Any, job_id: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while (job := c.get(f"/v1/jobs/{job_id}").json())["state"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.01)
    return job


@pytest.mark.parametrize("path", ["/", "/lab", "/lab/datasets/new", "/lab/datasets/ds_0", "/lab/probes/x",
                                  "/lab/heads/hd_1", "/lab/regimes/r", "/lab/compare"])
def test_every_lab_page_gets_the_shell_with_a_same_origin_policy(tiny_api: Any, path: str) -> None:
    r = tiny_api.client.get(path)
    assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
    assert '<script type="module" src="/lab/static/lab.js">' in r.text
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert r.headers["x-frame-options"] == "DENY"


def test_unknown_lab_paths_and_other_methods_fall_through_to_the_api_errors(tiny_api: Any) -> None:
    c = tiny_api.client
    for path in ("/lab/static/nope.js", "/lab/secrets", "/lab/probes/a/b/c", "/lab/static/../main.py"):
        r = c.get(path)
        assert r.status_code == 404 and r.json()["type"] == "not_found", path
    r = c.post("/", json={})
    assert r.status_code in (404, 405) and set(r.json()) >= {"error", "type"}


def test_static_files_carry_their_types_and_name_no_other_host(tiny_api: Any) -> None:
    c = tiny_api.client
    assert c.get("/lab/static/lab.js").headers["content-type"] == "text/javascript; charset=utf-8"
    assert c.get("/lab/static/lab.css").headers["content-type"] == "text/css; charset=utf-8"
    assert c.head("/lab/static/charts.js").content == b""
    root = resources.files("layerbank.app.api.lab") / "static"
    for f in root.iterdir():
        text = f.read_text(encoding="utf-8")
        # the only absolute URL allowed is the SVG namespace name (an identifier, never fetched)
        urls = set(re.findall(r"https?://[^\s\"'`)]+", text)) - {"http://www.w3.org/2000/svg"}
        assert not urls, (f.name, urls)


def test_the_probe_form_lists_the_heads_info_names_not_a_copy(tiny_api: Any) -> None:
    from layerbank.app.probes.head_names import PROBE_HEADS

    assert tiny_api.client.get("/info").json()["heads"] == list(PROBE_HEADS)
    page = (resources.files("layerbank.app.api.lab") / "static" / "dataset.js").read_text(encoding="utf-8")
    assert "info.heads" in page
    # no head name as a string literal: a new head reaches the form through /info alone
    quoted = [h for h in PROBE_HEADS if f'"{h}"' in page or f"'{h}'" in page]
    assert not quoted, quoted


def test_with_a_key_the_page_loads_but_its_data_needs_the_key(tiny_api_factory: Any) -> None:
    api = tiny_api_factory(worker=False, api_key="s3cret")  # no worker: /ready would need the key
    c = api.client
    assert c.get("/").status_code == 200 and c.get("/lab/static/api.js").status_code == 200
    for path in ("/info", "/v1/datasets", "/v1/probes", "/lab/static/nope.js"):
        assert c.get(path).status_code == 401, path
    assert c.get("/v1/datasets", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_dataset_stats_counts_labels_and_token_lengths(tiny_api: Any) -> None:
    c = tiny_api.client
    texts = ["short one", "a somewhat longer text with more words in it", "three words here", "x"]
    ds = c.post("/v1/datasets", json={"name": "four", "texts": texts, "labels": ["b", "a", "b", "b"]}).json()
    early = c.get(f"/v1/datasets/{ds['id']}/stats")
    assert early.status_code in (200, 409)  # 409 while the job runs (the tiny worker may be done already)
    if early.status_code == 409:
        assert early.json()["type"] == "conflict" and early.json()["job_id"] == ds["job_id"]
    assert _wait(c, ds["job_id"])["state"] == "succeeded"
    st = c.get(f"/v1/datasets/{ds['id']}/stats").json()
    assert st["n_items"] == 4 and st["labels"] == {"a": 1, "b": 3}
    feats = c.post("/v1/features", json={"texts": texts}).json()["data"]
    n = [d["n_tokens"] for d in feats]
    t = st["tokens"]
    assert t["stored"] == 4 and (t["min"], t["max"]) == (min(n), max(n))
    assert t["mean"] == pytest.approx(sum(n) / 4) and t["truncated"] == 0 and t["truncated_share"] == 0.0
    assert sum(t["histogram"]["counts"]) == 4 and t["max_length"] >= 2
    assert c.get("/v1/datasets/ds_nope/stats").status_code == 404


def test_token_histogram_bins_every_count_and_the_truncated_share() -> None:
    t = token_histogram([3, 10, 10, 128, 128], [False, False, False, True, True], 128)
    edges, counts = t["histogram"]["edges"], t["histogram"]["counts"]
    assert sum(counts) == 5 and edges[0] == 0 and edges[-1] > 128 and len(counts) <= 20
    assert t["truncated"] == 2 and t["truncated_share"] == 0.4 and t["median"] == 10.0
    assert token_histogram([], [], 512)["stored"] == 0


def test_dataset_features_as_parquet_hold_the_npy_rows_and_the_texts(tiny_api: Any) -> None:
    import io

    import numpy as np
    import pyarrow.parquet as pq

    c = tiny_api.client
    texts = ["parquet row one", "parquet row two", "and a third"]
    ds = c.post("/v1/datasets", json={"name": "pq", "texts": texts}).json()
    assert _wait(c, ds["job_id"])["state"] == "succeeded"
    q = {"view": "layers:0,2", "pooling": "max"}
    r = c.get(f"/v1/datasets/{ds['id']}/features", params={**q, "format": "parquet"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/vnd.apache.parquet"
    assert r.headers["content-disposition"] == f'attachment; filename="{ds["id"]}.parquet"'
    table = pq.read_table(io.BytesIO(r.content))
    x = np.load(io.BytesIO(c.get(f"/v1/datasets/{ds['id']}/features", params=q).content))
    assert table["text"].to_pylist() == texts
    np.testing.assert_array_equal(np.array(table["features"].to_pylist(), np.float32), x)
    assert table.schema.metadata[b"view"] == b"layers:0,2" and x.shape == (3, 64)
    assert c.get(f"/v1/datasets/{ds['id']}/features", params={"format": "csv"}).status_code == 422

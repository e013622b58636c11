"""A kept head through a real server (bundled model): fitted in the pool,
saved as arrays + JSON (no pickle), predicting the same probabilities as the
same head fitted here, and the same again after the server restarts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from layerbank.app.probes.sweep import fit_head
from tests.integration.conftest import SHARED_SETTINGS, ServerProcess, sst_sentences

pytestmark = pytest.mark.integration


def test_head_predicts_like_the_same_head_fitted_here_before_and_after_restart(
        server_factory: Callable[..., ServerProcess]) -> None:
    s = server_factory(**SHARED_SETTINGS)
    texts, labels = sst_sentences(160, 2000)
    ds = s.post("/v1/datasets", json={"name": "sst2-head", "texts": texts, "labels": labels}).json()
    assert s.wait_job(ds["job_id"])["state"] == "succeeded"
    r = s.post("/v1/heads", json={"dataset": ds["id"], "view": "layer:4", "pooling": "mean",
                                  "name": "sentiment"})
    assert r.status_code == 202, r.text
    head = r.json()
    assert s.wait_job(head["job_id"])["state"] == "succeeded"

    got = s.get(f"/v1/heads/{head['id']}").json()
    directory = s.data_dir / "heads" / head["id"]
    on_disk = {p.name: p.stat().st_size for p in directory.iterdir()}
    assert set(on_disk) == {"arrays.npz", "head.json"} and got["files"] == on_disk
    assert got["size_bytes"] == sum(on_disk.values()) and got["state"] == "succeeded"
    assert got["storage"]["full_finetune_bytes"] // got["size_bytes"] > 1000  # 22.7M floats vs ~7k
    with np.load(directory / "arrays.npz", allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    assert arrays["coef_"].shape == (1, 384) and list(arrays["classes_"]) == ["0", "1"]
    doc = json.loads((directory / "head.json").read_text())
    assert doc["format"] == "layerbank-head/1" and doc["metadata"]["view"] == "layer:4"

    new = sst_sentences(6, 2160)[0]
    asked = texts[:4] + new
    before = s.post(f"/v1/heads/{head['id']}/predict", json={"texts": asked})
    assert before.status_code == 200, before.text
    out = before.json()
    assert [d["cached"] for d in out["data"]] == [True] * 4 + [False] * 6
    assert out["usage"]["cache_hits"] == 4 and out["usage"]["tokens_computed"] > 0

    # the same head fitted here, on the server's own stored features, gives the same numbers
    c = s.client()
    states = c.dataset_features(ds["id"], view="all_layers", pooling="mean")
    with threadpool_limits(limits=1):  # as in the pool process: same arithmetic, same lbfgs path
        local = fit_head(states, labels, "layer:4")
    x = c.features(asked, view="layer:4", pooling="mean")
    expected = local.predict_proba(x)
    assert np.allclose([d["probabilities"] for d in out["data"]], expected, atol=1e-9, rtol=0)
    assert [d["label"] for d in out["data"]] == [["0", "1"][int(i)] for i in expected.argmax(1)]
    # logistic maths by hand from the saved arrays: numpy alone reads the head
    z = ((x - arrays["mean_"]) / arrays["scale_"]) @ arrays["coef_"].T + arrays["intercept_"]
    assert np.allclose(1 / (1 + np.exp(-z[:, 0])), expected[:, 1], atol=1e-12)

    s.restart()
    after = s.post(f"/v1/heads/{head['id']}/predict", json={"texts": asked})
    assert after.status_code == 200, after.text
    assert [d["probabilities"] for d in after.json()["data"]] == [d["probabilities"] for d in out["data"]]
    assert all(d["cached"] for d in after.json()["data"])
    assert [h["id"] for h in s.get("/v1/heads").json()["data"]] == [head["id"]]
    assert s.get(f"/v1/heads/{head['id']}").json()["size_bytes"] == got["size_bytes"]

    assert s.delete(f"/v1/heads/{head['id']}").status_code == 200
    assert not Path(directory).exists()
    r = s.post(f"/v1/heads/{head['id']}/predict", json={"texts": ["anything"]})
    assert r.status_code == 404 and r.json()["type"] == "not_found"

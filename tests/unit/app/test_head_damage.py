"""A saved head whose files are damaged is named as damaged, never a 500 (issue 25, row 6).

``arrays.npz`` or ``head.json`` damaged, weights of the wrong shape, NaN
weights: predict answers 409 naming the head and the damage, ``GET
/v1/heads/{id}`` says ``state: "damaged"`` with the reason, and a head with
non-finite weights is refused when it is saved and when it is loaded.
"""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from layerbank.app.probes.head_files import HeadDamaged
from layerbank.app.probes.heads import load_head, make_head, save_head

POS = ["a good film", "a great play", "good and warm", "a lovely story"]
NEG = ["a bad film", "a dull play", "bad and cold", "an awful story"]


def _wait(c, job_id: str, timeout: float = 60) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while (job := c.get(f"/v1/jobs/{job_id}").json())["state"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.02)
    return job  # type: ignore[no-any-return]


def _rewrite_npz(path: Path, **changes: Any) -> None:
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays.update(changes)
    np.savez(path, **arrays)


def test_a_damaged_head_is_a_409_naming_it_and_get_says_damaged(tiny_api_factory) -> None:  # type: ignore[no-untyped-def]
    api = tiny_api_factory()
    api.client.app.state.probe_service.executor_factory = lambda: ThreadPoolExecutor(1)
    c = api.client
    texts = [f"{t} number {i}" for i in range(6) for t in (POS[i % 4], NEG[i % 4])]
    labels = ["pos", "neg"] * 6
    r = c.post("/v1/datasets", json={"name": "d", "texts": texts, "labels": labels})
    assert r.status_code == 202 and _wait(c, r.json()["job_id"])["state"] == "succeeded"
    r = c.post("/v1/heads", json={"dataset": r.json()["id"], "view": "layer:-1", "pooling": "mean"})
    head_id = r.json()["id"]
    assert _wait(c, r.json()["job_id"])["state"] == "succeeded"
    assert c.post(f"/v1/heads/{head_id}/predict", json={"texts": texts[:2]}).status_code == 200
    d = api.data_dir / "heads" / head_id
    good = {f: (d / f).read_bytes() for f in ("arrays.npz", "head.json")}
    with np.load(d / "arrays.npz", allow_pickle=False) as npz:
        coef = npz["coef_"]

    def restore() -> None:
        for f, b in good.items():
            (d / f).write_bytes(b)

    damages: list[tuple[str, Any, str]] = [
        ("garbage arrays.npz", lambda: (d / "arrays.npz").write_bytes(b"\x00not a zip" * 50), "arrays.npz"),
        ("missing arrays.npz", lambda: (d / "arrays.npz").unlink(), "arrays.npz"),
        ("garbage head.json", lambda: (d / "head.json").write_text("{not json"), "head.json"),
        ("head.json of another kind", lambda: (d / "head.json").write_text('{"format": 3}'), "head.json"),
        ("wrong-shape weights",
         lambda: _rewrite_npz(d / "arrays.npz", coef_=np.zeros((coef.shape[0], coef.shape[1] + 7))), "shape"),
        ("NaN weights", lambda: _rewrite_npz(d / "arrays.npz", coef_=np.full_like(coef, np.nan)), "NaN"),
    ]
    for what, damage, word in damages:
        damage()
        r = c.post(f"/v1/heads/{head_id}/predict", json={"texts": texts[:2]})
        assert r.status_code == 409, (what, r.status_code, r.text)
        body = r.json()
        assert head_id in body["error"] and "damaged" in body["error"] and word in body["error"], (what, body)
        got = c.get(f"/v1/heads/{head_id}").json()
        assert got["state"] == "damaged" and word in got["damage"], (what, got)
        listed = {h["id"]: h for h in c.get("/v1/heads").json()["data"]}
        assert listed[head_id]["state"] == "damaged", what
        restore()
        r = c.post(f"/v1/heads/{head_id}/predict", json={"texts": texts[:2]})
        assert r.status_code == 200, (what, r.text)
        assert all(np.isfinite(p).all() for p in (x["probabilities"] for x in r.json()["data"]))
        assert c.get(f"/v1/heads/{head_id}").json()["state"] == "succeeded"


def test_non_finite_weights_are_refused_when_saved_and_when_loaded(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(20, 5)), np.array(["a", "b"] * 10)
    head = make_head("logistic", seed=0).fit(X, y)
    save_head(head, tmp_path / "ok", {})
    assert np.allclose(load_head(tmp_path / "ok").predict_proba(X), head.predict_proba(X))

    head.coef_ = head.coef_.copy()
    head.coef_[0, 1] = np.nan
    with pytest.raises(ValueError, match="coef_.*NaN"):
        save_head(head, tmp_path / "nan", {})
    assert not (tmp_path / "nan" / "arrays.npz").exists()

    shutil.copytree(tmp_path / "ok", tmp_path / "inf")
    _rewrite_npz(tmp_path / "inf" / "arrays.npz", intercept_=np.array([np.inf]))
    with pytest.raises(HeadDamaged, match="intercept_"):
        load_head(tmp_path / "inf")
    # a dropped (noise) dimension has scale inf by design: that is not damage
    shutil.copytree(tmp_path / "ok", tmp_path / "dropped")
    with np.load(tmp_path / "ok" / "arrays.npz") as npz:
        scale = npz["scale_"].copy()
    scale[0] = np.inf
    _rewrite_npz(tmp_path / "dropped" / "arrays.npz", scale_=scale)
    assert load_head(tmp_path / "dropped").n_dropped_ == 1
    doc = json.loads((tmp_path / "ok" / "head.json").read_text())
    assert doc["format"] == "layerbank-head/1"

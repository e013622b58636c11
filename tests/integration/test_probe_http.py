"""Probes through a real server (bundled model): a job in the process pool,
progress on the job row, result, plots, and the 4xx a user gets for bad input.

Texts: SST-2 dev phrases from offset 2000 (conftest.sst_sentences).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.integration.conftest import ServerProcess, sst_sentences, write_tsv

pytestmark = pytest.mark.integration


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_probe_job_runs_in_a_pool_process_with_progress_and_plots(layerbank_server: ServerProcess,
                                                                  tmp_path: Path) -> None:
    s = layerbank_server
    texts, labels = sst_sentences(240, 2000)
    # a bigger dataset first keeps the worker busy, so the probe's dataset is still queued
    busy = s.post("/v1/datasets", json={"name": "busy", "texts": sst_sentences(800, 2300)[0]}).json()
    ds = s.post("/v1/datasets", json={"name": "sst2-probe", "texts": texts, "labels": labels}).json()
    early = s.post("/v1/probes", json={"dataset": ds["id"]})
    assert early.status_code == 409, early.text
    body = early.json()
    assert body["type"] == "conflict" and body["job_id"] == ds["job_id"] and body["job_state"] == "queued"
    assert f"its extraction job {ds['job_id']} is queued" in body["error"]
    assert early.headers["retry-after"] == "2"
    s.delete(f"/v1/jobs/{busy['job_id']}")  # not needed any more
    assert s.wait_job(ds["job_id"])["state"] == "succeeded"

    r = s.post("/v1/probes", json={"dataset": ds["id"], "views": ["layer:1", "layer:-1", "scalar_mix"],
                                   "poolings": ["mean", "cls"], "cv": 3, "train_sizes": [40]})
    assert r.status_code == 202, r.text
    probe = r.json()
    job = s.wait_job(probe["id"])
    assert job["state"] == "succeeded", job["error"]
    assert job["kind"] == "probe" and job["progress"]["done"] == job["progress"]["total"]
    assert any(p.get("total") for p in job["seen_progress"])  # progress was visible while it ran

    result = s.get(f"/v1/probes/{probe['id']}").json()["result"]
    # the pool's own process, one BLAS thread (the design rule), never the server or its worker
    assert result["runtime"]["pid"] not in (s.proc.pid, s.worker_pid())  # type: ignore[union-attr]
    assert result["runtime"]["blas_threads"] == 1
    assert [(x["view"], x["pooling"]) for x in result["results"]] == [
        (v, p) for p in ("mean", "cls") for v in ("layer:1", "layer:-1", "scalar_mix")]
    assert result["task"]["n_examples"] == 240 and result["model"]["num_layers"] == 6
    assert 0.6 <= result["best"]["accuracy"] <= 0.95
    weights = result["scalar_mix"]["mean"]["layer_weights"]
    assert len(weights) == 7 and abs(sum(weights) - 1) < 1e-9
    numbers = result["recommendation"]["numbers"]
    assert numbers["lora_r8_params"] == 6 * 2 * 2 * 384 * 8  # L * (q, v) * (A, B) * d * r
    assert numbers["full_finetune_bytes"] == result["model"]["n_params"] * 4

    plot = s.get(f"/v1/probes/{probe['id']}/plot.png")
    curve = s.get(f"/v1/probes/{probe['id']}/learning_curve.png")
    assert plot.headers["content-type"] == curve.headers["content-type"] == "image/png"
    assert _png_size(plot.content) == (1100, 650) and _png_size(curve.content) == (900, 600)
    (tmp_path / "plot.png").write_bytes(plot.content)  # kept with the test's tmp dir, for a look


def test_probe_bad_input_over_http(layerbank_server: ServerProcess, tmp_path: Path) -> None:
    s = layerbank_server
    texts, labels = sst_sentences(12, 2240)
    tsv = write_tsv(tmp_path / "small.tsv", texts, labels)
    with open(tsv, "rb") as fh:  # a label column that does not exist: refused at upload, named
        r = s.post("/v1/datasets", files={"file": ("small.tsv", fh)}, data={"label_column": "sentiment"})
    assert r.status_code == 422 and "no label column 'sentiment'" in r.json()["error"]

    one = s.post("/v1/datasets", json={"name": "one", "texts": texts, "labels": ["1"] * 12}).json()
    few = s.post("/v1/datasets", json={"name": "few", "texts": texts,
                                       "labels": ["0"] * 10 + ["1"] * 2}).json()
    for ds in (one, few):
        assert s.wait_job(ds["job_id"])["state"] == "succeeded"
    cases = [
        ({"dataset": one["id"]}, "all 12 labels are the same class '1'"),
        ({"dataset": few["id"], "cv": 3}, "class '1' has 2 examples, fewer than the 3 cross-validation folds"),
        ({"dataset": few["id"], "cv": 2, "views": ["layer:7"]}, "layer 7 does not exist"),
        ({"dataset": few["id"], "cv": 2, "views": ["top_4"]}, "top_4"),
        ({"dataset": few["id"], "cv": 2, "poolings": ["median"]}, "poolings.0"),
    ]
    for body, message in cases:
        r = s.post("/v1/probes", json=body)
        assert r.status_code == 422 and r.json()["type"] == "validation", (body, r.text)
        assert message in r.json()["error"], (body, r.json())
    r = s.post("/v1/probes", json={"dataset": "ds_000000000000"})
    assert r.status_code == 404 and r.json()["type"] == "not_found"
    r = s.post("/v1/probes", content=b"dataset=x", headers={"content-type": "text/plain"})
    assert r.status_code == 415

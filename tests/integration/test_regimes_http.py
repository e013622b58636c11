"""Regimes through a real server (bundled model, CPU): a job the worker runs,
its result and plot, cancellation of a running fine-tune, and the statuses a
user gets for bad requests.

Texts: SST-2 dev phrases from offset 4500 (conftest.sst_sentences; the
seeded shuffle holds 4,919 phrases): 4500-4559 the small job, 4560-4859 the
cancelled one, 4860-4869 the features request after it.
"""

from __future__ import annotations

import time

import pytest

from tests.integration.conftest import ServerProcess, sst_sentences

pytestmark = pytest.mark.integration
_PNG = b"\x89PNG\r\n\x1a\n"


def _dataset(server: ServerProcess, n: int, offset: int) -> str:
    texts, labels = sst_sentences(n, offset)
    ds = server.post("/v1/datasets", json={"name": f"regimes-{offset}", "texts": texts,
                                           "labels": labels}).json()
    assert server.wait_job(ds["job_id"], timeout=180)["state"] == "succeeded"
    return str(ds["id"])


def test_a_small_seeded_sst2_subset_runs_end_to_end_on_cpu(layerbank_server: ServerProcess) -> None:
    s = layerbank_server
    ds = _dataset(s, 60, 4500)
    started = time.monotonic()
    r = s.post("/v1/regimes", json={"dataset": ds, "regimes": ["frozen", "bitfit"], "seeds": 1,
                                    "max_epochs": 1})
    assert r.status_code == 202, r.text
    rid = r.json()["id"]
    job = s.wait_job(rid, timeout=90)
    took = time.monotonic() - started
    assert job["state"] == "succeeded", job["error"]
    # done/total counts epochs; "stage" names the last regime and seed that started
    assert job["kind"] == "regimes" and job["progress"] == {"done": 2, "total": 2,
                                                            "stage": "bitfit, seed 1 of 1, 42 training texts"}
    result = s.get(f"/v1/regimes/{rid}").json()["result"]
    assert result["split"]["n_train"] == 42 and result["split"]["n_test"] == 12  # 60 = 42 + 6 + 12
    assert result["model"]["num_layers"] == 6 and result["model"]["hidden_size"] == 384
    rows = result["regimes"]
    for name in ("frozen", "bitfit"):
        for key in ("macro_f1_mean", "accuracy_mean", "trainable_share"):
            assert 0.0 <= rows[name][key] <= 1.0, (name, key, rows[name][key])
    # frozen MiniLM separates sentiment: chance is 0.5 (measured ~0.8-0.9 on these 12 test texts)
    assert rows["frozen"]["accuracy_mean"] >= 0.6
    # BitFit trains every bias the forward pass uses: the model's biases minus the unused
    # pooler's (d), plus the linear head on the mean-pooled state (d x 2 classes + 2)
    n_bias = s.get("/info").json()["model"]["n_bias_params"]
    assert rows["bitfit"]["trainable_params"] == n_bias - 384 + 384 * 2 + 2 == 25_728 + 770
    assert rows["bitfit"]["matches_formula"] and rows["bitfit"]["bytes_per_task"] == 4 * (25_728 + 770)
    assert result["best"] in rows and result["cheapest_within_one_std"] in result["within_noise"]
    stored = s.data_dir / result["artifacts_dir"]
    assert sorted(p.name for p in stored.rglob("*.safetensors")) == ["seed0.safetensors"] * 2
    plot = s.get(f"/v1/regimes/{rid}/plot.png")
    assert plot.status_code == 200 and plot.headers["content-type"] == "image/png"
    assert plot.content[:8] == _PNG and len(plot.content) > 10_000
    assert took < 90, f"the small regimes job took {took:.0f} s"


def test_cancelling_a_running_regimes_job_stops_it(layerbank_server: ServerProcess) -> None:
    s = layerbank_server
    ds = _dataset(s, 300, 4560)
    r = s.post("/v1/regimes", json={"dataset": ds, "regimes": ["full", "gradual"], "seeds": 3,
                                    "max_epochs": 5})
    rid = r.json()["id"]
    deadline = time.monotonic() + 120
    while "stage" not in (job := s.get(f"/v1/jobs/{rid}").json())["progress"]:  # a seed's training began
        assert job["state"] in ("queued", "running") and time.monotonic() < deadline, job
        time.sleep(0.05)
    assert job["state"] == "running" and job["progress"]["stage"].startswith("full, seed 1 of 3"), job
    cancel = s.delete(f"/v1/regimes/{rid}")
    assert cancel.status_code == 202 and cancel.json()["cancel_requested"] is True, cancel.text
    asked = time.monotonic()
    job = s.wait_job(rid, timeout=60)
    assert job["state"] == "cancelled", job
    assert time.monotonic() - asked < 30  # heartbeat (1 s) + one training step of 16 texts
    assert not (s.data_dir / "regimes" / rid).exists()  # half a comparison is not kept
    assert s.get(f"/v1/regimes/{rid}/plot.png").status_code == 409
    again = s.delete(f"/v1/regimes/{rid}")
    assert again.status_code == 409 and "already cancelled" in again.json()["error"]
    # the worker is free again: a request that needs the encoder is answered
    texts, _ = sst_sentences(10, 4860)
    features = s.post("/v1/features", json={"texts": texts, "view": "layer:-1"}, timeout=60)
    assert features.status_code == 200, features.text


def test_bad_regimes_requests_get_statuses_and_messages(layerbank_server: ServerProcess) -> None:
    s = layerbank_server
    r = s.post("/v1/regimes", json={"dataset": "ds_000000000000"})
    assert r.status_code == 404
    assert r.json() == {"error": "no dataset 'ds_000000000000'", "type": "not_found", "field": "dataset"}
    texts, _ = sst_sentences(4, 4866)
    unlabelled = s.post("/v1/datasets", json={"name": "no-labels", "texts": texts}).json()
    early = s.post("/v1/regimes", json={"dataset": unlabelled["id"]})
    if early.status_code == 409:  # still extracting: the job id tells the user what to wait for
        assert early.json()["job_id"] == unlabelled["job_id"] and "not extracted yet" in early.json()["error"]
        s.wait_job(unlabelled["job_id"], timeout=180)
    r = s.post("/v1/regimes", json={"dataset": unlabelled["id"]})
    assert r.status_code == 422 and "4 of 4 texts have no label" in r.json()["error"]
    r = s.post("/v1/regimes", json={"dataset": unlabelled["id"], "regimes": ["frozen", "prompt"]})
    assert r.status_code == 422 and r.json()["field"] == "regimes" and "unknown ['prompt']" in r.json()["error"]
    r = s.post("/v1/regimes", json={"dataset": unlabelled["id"], "seeds": 0})
    assert r.status_code == 422 and r.json()["type"] == "validation"
    r = s.get("/v1/regimes/0123456789abcdef")
    assert r.status_code == 404 and r.json()["error"] == "no regimes job '0123456789abcdef'"

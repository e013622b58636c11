"""``/v1/regimes`` on the tiny encoder (worker in a thread): request checks with
their statuses and messages, a whole job (frozen + bitfit) through the worker,
artifacts under the data directory, the plot, cancellation, and the app's
torch-free boundary."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from layerbank.app.api.routes.regimes import REGIMES, _train_split_size
from tests.regimes_data import NEG, POS, cli_regimes, dataset, wait


def test_regime_names_and_split_agree_with_the_worker() -> None:
    from layerbank.workers.regimes.linear_probe import stratified_split
    from layerbank.workers.regimes.trainable import REGIMES as WORKER_REGIMES

    assert REGIMES == WORKER_REGIMES
    labels = ["pos"] * 13 + ["neg"] * 9 + ["mixed"] * 7
    for seed in (0, 3):
        train, _, _ = stratified_split(np.asarray(labels), 0.2, 0.1, seed)
        assert _train_split_size(labels, seed) == len(train)


def test_bad_requests_get_statuses_and_messages(tiny_api: Any) -> None:
    c = tiny_api.client
    ds = dataset(c, POS + NEG, ["pos"] * 10 + ["neg"] * 10)

    def error(body: dict[str, Any], status: int) -> dict[str, Any]:
        r = c.post("/v1/regimes", json=body)
        assert r.status_code == status, r.text
        return r.json()  # type: ignore[no-any-return]

    e = error({"dataset": "ds_nope"}, 404)
    assert e == {"error": "no dataset 'ds_nope'", "type": "not_found", "field": "dataset"}
    e = error({"dataset": ds, "regimes": ["frozen", "adapters"]}, 422)
    assert e["field"] == "regimes" and "unknown ['adapters']" in e["error"] and "lora" in e["error"]
    assert error({"dataset": ds, "seeds": 0}, 422)["type"] == "validation"
    assert error({"dataset": ds, "max_epochs": -1}, 422)["type"] == "validation"
    e = error({"dataset": ds, "top_k": 3}, 422)  # the tiny model has 2 layers
    assert e["field"] == "top_k" and "has 2" in e["error"]
    e = error({"dataset": ds, "train_sizes": [500]}, 422)  # 20 texts: the train split holds 14
    assert e["field"] == "train_sizes" and "2..12 or be 14" in e["error"]
    unlabelled = dataset(c, ["one text", "another text", "a third text"])
    e = error({"dataset": unlabelled}, 422)
    assert e["field"] == "dataset" and "3 of 3 texts have no label" in e["error"]
    few = dataset(c, ["x one", "x two", "y one", "y two"], ["x", "x", "y", "y"])
    e = error({"dataset": few}, 422)
    assert "cannot be split into stratified" in e["error"] and "'x': 2" in e["error"]
    assert c.get("/v1/regimes/nope").status_code == 404
    assert c.get("/v1/regimes/nope").json()["error"] == "no regimes job 'nope'"
    # evaluation sets: known, labelled, and with no label the training set lacks
    e = error({"dataset": ds, "eval_datasets": ["ds_gone"]}, 404)
    assert e["field"] == "eval_datasets" and "ds_gone" in e["error"]
    e = error({"dataset": ds, "eval_datasets": [unlabelled]}, 422)
    assert e == {"error": f"eval_datasets: {unlabelled} needs one label per text", "type": "validation",
                 "field": "eval_datasets"}
    stranger = dataset(c, ["a so-so film", "a good play"], ["meh", "pos"])
    e = error({"dataset": ds, "eval_datasets": [stranger]}, 422)
    assert e["error"] == f"eval_datasets: {stranger} has labels ['meh'] that {ds} never trains on"

    tiny_api.worker.stop()  # nothing extracts any more: the next dataset stays queued
    late = c.post("/v1/datasets", json={"name": "late", "texts": ["late one", "late two"],
                                        "labels": ["a", "b"]}).json()
    e = error({"dataset": late["id"]}, 409)
    assert e["job_id"] == late["job_id"] and e["job_state"] == "queued"


def test_a_frozen_job_is_scored_on_its_evaluation_set(tiny_api: Any) -> None:
    c = tiny_api.client
    ds = dataset(c, POS + NEG, ["pos"] * 10 + ["neg"] * 10)
    shifted = dataset(c, ["good fun", "a bad time", "lovely and warm", "dull and poor"],
                       ["pos", "neg", "pos", "neg"])
    r = c.post("/v1/regimes", json={"dataset": ds, "regimes": ["frozen"], "seeds": 2,
                                    "eval_datasets": [shifted]})
    assert r.status_code == 202, r.text
    assert r.json()["request"]["eval_datasets"] == [shifted]
    job = wait(c, r.json()["job_id"])
    assert job["state"] == "succeeded", job
    result = c.get(f"/v1/regimes/{r.json()['id']}").json()["result"]
    frozen = result["regimes"]["frozen"]
    assert set(frozen["evals"]) == {shifted} and result["settings"]["eval_sets"] == {shifted: 4}
    assert len(frozen["runs"]) == 2 and all(0.0 <= x["eval_scores"][shifted]["macro_f1"] <= 1.0
                                            for x in frozen["runs"])
    assert result["by_eval"][shifted]["best"] == "frozen"


def test_a_regimes_job_runs_in_the_worker_and_stores_its_tensors(tiny_api: Any) -> None:
    c = tiny_api.client
    ds = dataset(c, POS + NEG, ["pos"] * 10 + ["neg"] * 10)
    r = c.post("/v1/regimes", json={"dataset": ds, "regimes": ["frozen", "bitfit"], "seeds": 2,
                                    "max_epochs": 1})
    assert r.status_code == 202, r.text
    rid = r.json()["id"]
    # the worker may claim the job before the response is written
    assert r.json()["job_id"] == rid and r.json()["state"] in ("queued", "running")
    early = c.get(f"/v1/regimes/{rid}/plot.png")
    assert early.status_code == 409 and early.json()["job_id"] == rid
    job = wait(c, rid)
    assert job["state"] == "succeeded", job["error"]
    # 2 seeds x (1 probe + 1 epoch), and the regime and seed trained last
    assert job["progress"] == {"done": 4, "total": 4, "stage": "bitfit, seed 2 of 2, 14 training texts"}
    out = c.get(f"/v1/regimes/{rid}").json()
    result = out["result"]
    assert out["request"]["regimes"] == ["frozen", "bitfit"]
    assert set(result["regimes"]) == {"frozen", "bitfit"}
    for row in result["regimes"].values():
        assert 0 <= row["macro_f1_mean"] <= 1 and 0 <= row["accuracy_mean"] <= 1
        assert len(row["runs"]) == 2
    bitfit = result["regimes"]["bitfit"]
    assert bitfit["matches_formula"]
    assert bitfit["trainable_params"] == bitfit["encoder_trainable"] + 32 * 2 + 2
    assert result["best"] in ("frozen", "bitfit")
    stored = sorted(p.relative_to(tiny_api.data_dir).as_posix()
                    for p in (tiny_api.data_dir / result["artifacts_dir"]).rglob("*.safetensors"))
    # the frozen probe is deterministic: fit (and stored) once when every seed uses the whole split
    assert stored == [f"regimes/{rid}/size14/bitfit/seed{s}.safetensors" for s in (0, 1)] + [
        f"regimes/{rid}/size14/frozen/seed0.safetensors"]
    meta = json.loads((tiny_api.data_dir / f"regimes/{rid}/size14/bitfit/seed0.json").read_text())
    assert meta["regime"] == "bitfit" and meta["seed"] == 0
    png = c.get(f"/v1/regimes/{rid}/plot.png")
    assert png.status_code == 200 and png.content[:8] == b"\x89PNG\r\n\x1a\n"
    done = c.delete(f"/v1/regimes/{rid}")
    assert done.status_code == 409 and "already succeeded" in done.json()["error"]


def test_cancelling_a_queued_regimes_job(tiny_api: Any) -> None:
    c = tiny_api.client
    ds = dataset(c, POS + NEG, ["pos"] * 10 + ["neg"] * 10)
    tiny_api.worker.stop()  # the job stays queued
    rid = c.post("/v1/regimes", json={"dataset": ds, "regimes": ["full"]}).json()["id"]
    r = c.delete(f"/v1/regimes/{rid}")
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert c.get(f"/v1/regimes/{rid}/plot.png").json()["job_state"] == "cancelled"


def test_the_app_renders_the_plot_without_torch() -> None:
    result = {"model": {"path": "/m/minilm"}, "settings": {"seeds": [0]}, "train_size": 10,
              "best": "frozen", "within_noise": ["frozen"], "cheapest_within_one_std": "frozen",
              "regimes": {"frozen": {"bytes_per_task": 3080, "macro_f1_mean": 0.8, "macro_f1_std": 0.0}}}
    code = ("import sys, json, layerbank.app.api.main\nfrom layerbank.app.api.routes import regimes\n"
            "from layerbank.app.probes.regimes_plot import regimes_plot_png\n"
            f"png = regimes_plot_png(json.loads({json.dumps(json.dumps(result))}))\n"
            "assert png[:4] == b'\\x89PNG', png[:8]\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("body", [{"dataset": "x", "regimes": []}, {"dataset": "x", "train_sizes": []},
                                  {"dataset": "x", "unknown": 1}])
def test_malformed_bodies_are_422(tiny_api: Any, body: dict[str, Any]) -> None:
    r = tiny_api.client.post("/v1/regimes", json=body)
    assert r.status_code == 422 and r.json()["type"] == "validation"


def test_the_cli_prints_the_table_and_the_verdict(tiny_model_dir: str, tmp_path: Any,
                                                  capsys: Any) -> None:
    code = cli_regimes(tmp_path, tiny_model_dir, "--regimes", "frozen,bitfit", "--seeds", "2", "--max-epochs", "1",
                       "--json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "p"))
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "r.json").read_text())
    assert code == 0 and "train size 14 (2 seeds" in out
    best, cheap = result["best"], result["cheapest_within_one_std"]
    assert f"verdict: best {best} (macro-F1 {result['regimes'][best]['macro_f1_mean']:.3f}" in out
    assert f"cheapest within one std: {cheap} ({result['regimes'][cheap]['bytes_per_task']:,} bytes" in out
    assert (tmp_path / "p" / "regimes.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(list((tmp_path / "d" / "regimes").rglob("*.safetensors"))) == 3  # 2 bitfit + 1 frozen

"""ProbeOptions: run_probe takes one options object (or its fields as keywords) and
the probe job builds it from its payload."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from layerbank.app.probes.options import ProbeOptions
from layerbank.app.probes.sweep import run_probe


def _data() -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(0)
    y = np.array(["neg", "pos"] * 30)
    signal = (y == "pos")[:, None, None] * np.array([0.0, 1.0, 3.0])[None, :, None]
    states = {p: (rng.normal(size=(60, 3, 6)) + signal).astype(np.float32) for p in ("mean", "cls")}
    return states, y


def _scores(result: dict) -> list[tuple[str, str, list[float]]]:
    return [(r["view"], r["pooling"], r["accuracy"]["folds"]) for r in result["results"]]


def test_an_options_object_and_keywords_run_the_same_probe() -> None:
    states, y = _data()
    opts = ProbeOptions(views=["each_layer"], cv=3, seed=4, learning_curve=False, control_task=False, n_jobs=1)
    a = run_probe(states.__getitem__, y, opts)
    b = run_probe(states.__getitem__, y, views=["each_layer"], cv=3, seed=4, learning_curve=False,
                  control_task=False, n_jobs=1)
    assert _scores(a) == _scores(b) and len(a["results"]) == 6  # 3 layers x 2 poolings
    assert (a["task"]["cv"], a["task"]["seed"], a["best"]["layer"]) == (3, 4, 2)
    # keywords override the object's fields
    c = run_probe(states.__getitem__, y, opts, poolings=["mean"])
    assert [r["pooling"] for r in c["results"]] == ["mean"] * 3


def test_the_options_come_from_a_probe_jobs_payload() -> None:
    payload = {"task": "sentence_classification", "dataset_id": "ds_1", "views": ["layer:2"],
               "poolings": ["cls"], "head": "ridge", "cv": 4, "seed": 7, "control_task": False,
               "learning_curve": True, "train_sizes": [50, 100]}
    opts = dataclasses.asdict(ProbeOptions.from_payload(payload, threads=1))
    asked = {k: v for k, v in payload.items() if k not in ("task", "dataset_id")}
    assert {k: opts[k] for k in asked} == asked  # every option the job was given, as given
    assert (opts["threads"], opts["n_jobs"]) == (1, None)  # where it runs; not in the payload
    assert "task" not in opts and "dataset_id" not in opts


def test_an_unknown_option_is_refused_by_name() -> None:
    states, y = _data()
    with pytest.raises(TypeError, match="colour"):
        run_probe(states.__getitem__, y, views=["each_layer"], colour="red")

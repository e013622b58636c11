"""RegimesOptions: run_regimes takes one options object (or its fields as keywords),
and the regimes job builds it from its payload."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from layerbank.workers.regimes.options import RegimesOptions
from layerbank.workers.regimes.run import run_regimes


def test_the_options_come_from_a_regimes_jobs_payload() -> None:
    # what app/api/routes/regimes.py check_request puts in the job
    payload = {"dataset_id": "ds_1", "regimes": ["frozen", "lora"], "seeds": 2, "top_k": None,
               "train_sizes": [40, 80], "max_epochs": 3, "patience": 1, "split_seed": 5}
    # the worker adds where it runs and how its store holds the features
    opts = RegimesOptions.from_payload(payload, max_length=64, device="cpu", storage_dtype="float32")
    assert dataclasses.asdict(opts) == {
        "regimes": ["frozen", "lora"], "seeds": 2, "top_k": None, "xi": None, "train_sizes": [40, 80],
        "split_seed": 5, "test_size": 0.2, "val_size": 0.1, "max_epochs": 3, "patience": 1, "batch_size": 16, "lr": None,
        "head_lr": 1e-3, "max_length": 64, "device": "cpu", "head_init": "probe",
        "storage_dtype": "float32"}


def test_an_options_object_and_keywords_train_the_same(tiny_model_dir: str) -> None:
    texts = [f"text number {i}" for i in range(60)]
    labels = [i % 2 for i in range(60)]
    feats = np.random.default_rng(1).normal(size=(60, 3, 8)).astype(np.float32)
    feats[:, 1, 0] += 1.5 * np.array(labels)
    opts = RegimesOptions(regimes=("frozen",), seeds=1, split_seed=2, device="cpu")
    a = run_regimes(texts, labels, opts, model_path=tiny_model_dir, frozen_features=feats)
    b = run_regimes(texts, labels, model_path=tiny_model_dir, frozen_features=feats, regimes=("frozen",),
                    seeds=1, split_seed=2, device="cpu")
    fa, fb = a["regimes"]["frozen"], b["regimes"]["frozen"]
    assert fa["macro_f1_mean"] == fb["macro_f1_mean"] and fa["bytes_per_task"] == fb["bytes_per_task"]
    assert a["settings"] == b["settings"] and a["settings"]["seeds"] == [0]
    with pytest.raises(ValueError, match=r"unknown regimes \['sparse'\]"):
        run_regimes(texts, labels, opts, regimes=("sparse",), model_path=tiny_model_dir)

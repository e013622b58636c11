"""run_probe: the numbers a user reads, checked against scikit-learn."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from sklearn.model_selection import StratifiedKFold, cross_val_score
from threadpoolctl import threadpool_limits

import layerbank.app.probes.sweep
from layerbank.app.probes.heads import make_head
from layerbank.app.probes.scalar_mix import ScalarMixHead
from layerbank.app.probes.sweep import ProbeInputError, fit_head, run_probe
from layerbank.cache.views import parse_view


@pytest.fixture(autouse=True)
def one_blas_thread():  # type: ignore[no-untyped-def]
    # tiny matrices on a shared 2-core machine: BLAS threads only contend
    with threadpool_limits(1):
        yield


def synthetic(n: int = 120, signal: tuple[float, ...] = (0.0, 1.0, 3.0), d: int = 8, seed: int = 0,
              classes: tuple[str, ...] = ("neg", "pos")) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Hidden states [n, H, d] per pooling; layer k moves class means apart by signal[k].

    Layers get different scales (like a real encoder) so that a scalar mix
    cannot find the informative layer from its norm alone.
    """
    rng = np.random.default_rng(seed)
    y = np.arange(n) % len(classes)
    centers = rng.normal(size=(len(classes), d))
    states = {}
    for pooling, gain in (("mean", 1.0), ("cls", 0.5)):
        layers = [(rng.normal(size=(n, d)) + gain * s * centers[y]) * (1.0 + k)
                  for k, s in enumerate(signal)]
        states[pooling] = np.stack(layers, axis=1).astype(np.float32)
    return states, np.array(classes)[y]


@pytest.mark.parametrize("head", ["logistic", "ridge"])
def test_fold_scores_equal_cross_val_score(head: str) -> None:
    states, labels = synthetic()
    result = run_probe(states.__getitem__, labels, views=["each_layer", "layers:1,2", "scalar_mix"],
                       head=head, cv=3, seed=7, control_task=False, learning_curve=False)
    folds = StratifiedKFold(3, shuffle=True, random_state=7)
    assert len(result["results"]) == 2 * 5
    for entry in result["results"]:
        x = states[entry["pooling"]]
        if entry["view"] == "scalar_mix":
            estimator: Any = ScalarMixHead()
        else:
            estimator, x = make_head(head, seed=7), parse_view(entry["view"]).apply(x)
        for metric, scoring in (("accuracy", "accuracy"), ("macro_f1", "f1_macro")):
            expected = cross_val_score(estimator, x, labels, cv=folds, scoring=scoring)
            np.testing.assert_allclose(entry[metric]["folds"], expected, rtol=0, atol=1e-12)
            assert entry[metric]["mean"] == pytest.approx(expected.mean())
            assert entry[metric]["std"] == pytest.approx(expected.std())


def test_best_view_gaps_progress_and_json() -> None:
    states, labels = synthetic()
    calls: list[tuple[int, int]] = []
    result = run_probe(states.__getitem__, labels, views=["each_layer"], cv=3,
                       train_sizes=(30,), progress=lambda done, total: calls.append((done, total)))
    json.dumps(result)  # the lead stores it as JSON
    assert result["best"]["view"] == "layer:2" and result["best"]["pooling"] == "mean"
    assert result["best"]["accuracy"] > 0.95
    gaps = {(r["view"], r["pooling"]): r["gap_to_best"] for r in result["results"]}
    assert gaps[("layer:2", "mean")] == 0.0
    assert gaps[("layer:0", "mean")] > 0.3  # layer 0 carries no signal
    assert all(g >= 0 for g in gaps.values())
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert calls[-1][0] == calls[-1][1] and len({t for _, t in calls}) == 1
    assert result["task"]["chance_accuracy"] == 0.5 and result["task"]["classes"] == ["neg", "pos"]


def test_control_task_is_near_chance_while_the_task_is_not() -> None:
    states, labels = synthetic(n=240)
    result = run_probe(states.__getitem__, labels, views=["each_layer"], cv=4, learning_curve=False)
    control = result["control_task"]
    assert control["pooling"] == "mean"
    assert [r["view"] for r in control["results"]] == ["layer:0", "layer:1", "layer:2"]
    for row in control["results"]:
        assert abs(row["control_accuracy"] - 0.5) < 0.12, row
        assert row["selectivity"] == pytest.approx(row["task_accuracy"] - row["control_accuracy"])
    assert control["best"]["view"] == "layer:2" and control["best"]["selectivity"] > 0.35
    assert result["best"]["selectivity"] == control["best"]["selectivity"]
    # macro-F1 selectivity next to accuracy's, and MDL on the shuffled labels: nothing to learn
    for row in control["results"]:
        assert row["selectivity_macro_f1"] == pytest.approx(row["task_macro_f1"] - row["control_macro_f1"])
        assert 0.8 < row["control_compression"] < 1.1, row
    assert result["best"]["selectivity_macro_f1"] > 0.35


def test_mdl_codelength_ranks_the_layers_like_their_signal() -> None:
    states, labels = synthetic(n=400)
    result = run_probe(states.__getitem__, labels, views=["each_layer", "scalar_mix"], cv=3,
                       control_task=False, learning_curve=False)
    mdl = {(r["view"], r["pooling"]): r["mdl"] for r in result["results"]}
    assert mdl[("scalar_mix", "mean")] is None  # a learnt mix has no fixed features to code with
    # 400 labels of 2 classes: 400 bits with the uniform code
    assert all(m["uniform_kbits"] == 0.4 for k, m in mdl.items() if m)
    ranked = [mdl[(f"layer:{k}", "mean")]["compression"] for k in range(3)]
    assert ranked[0] < 1.1 < ranked[1] < ranked[2], ranked
    assert result["best"]["mdl"] == mdl[("layer:2", "mean")]
    assert result["mdl_seconds"] > 0
    quiet = run_probe(states.__getitem__, labels, views=["layer:2"], cv=3, mdl=False,
                      control_task=False, learning_curve=False)
    assert quiet["results"][0]["mdl"] is None and quiet["mdl_seconds"] is None


def test_learning_curve_uses_the_sizes_below_the_training_folds(monkeypatch: pytest.MonkeyPatch) -> None:
    states, labels = synthetic(n=150)
    fitted_sizes: list[int] = []
    real = layerbank.app.probes.sweep.quiet_fit

    def spy(head, X, y):  # type: ignore[no-untyped-def]
        fitted_sizes.append(len(y))
        return real(head, X, y)

    monkeypatch.setattr(layerbank.app.probes.sweep, "quiet_fit", spy)
    result = run_probe(states.__getitem__, labels, views=["layer:2"], poolings=["mean"], cv=3,
                       control_task=False, train_sizes=(20, 50, 100, 500))
    curve = result["learning_curve"]
    assert [p["label"] for p in curve["points"]] == ["20", "50", "all"]  # folds train on 100 rows
    assert curve["points"][-1]["train_size"] == 100
    assert fitted_sizes == [100] * 3 + [20] * 3 + [50] * 3
    assert all(len(p["accuracy"]["folds"]) == 3 for p in curve["points"])
    assert curve["points"][-1]["accuracy"] == result["results"][0]["accuracy"]


def test_scalar_mix_finds_the_one_informative_layer() -> None:
    states, labels = synthetic(n=200, signal=(0.0, 0.0, 2.0, 0.0), d=6)
    result = run_probe(states.__getitem__, labels, views=["scalar_mix"], poolings=["mean"], cv=3,
                       control_task=False, learning_curve=False)
    mix = result["scalar_mix"]["mean"]
    weights = np.array(mix["layer_weights"])
    assert weights.sum() == pytest.approx(1.0)
    others = np.delete(weights, 2)
    assert weights[2] > 2 * others.max() and weights[2] > 0.5, weights  # uniform would be 0.25
    assert mix["accuracy"]["mean"] > 0.9
    # its weighted view, in the layerbank.cache.views grammar, reproduces the mix (up to a shift)
    head = fit_head(states["mean"], labels, "scalar_mix")
    view = parse_view(mix["view"]).apply(states["mean"])
    z = (states["mean"] - head.mean_) / head.layer_scale_[:, None]
    mixed = head.gamma_ * np.einsum("h,nhd->nd", head.layer_weights_, z)
    np.testing.assert_allclose(view - view.mean(0), mixed - mixed.mean(0), atol=1e-4)


def test_multiclass_labels_work() -> None:
    states, labels = synthetic(n=150, classes=("a", "b", "c"))
    result = run_probe(states.__getitem__, labels, views=["layer:2"], cv=3, learning_curve=False)
    assert result["task"]["chance_accuracy"] == pytest.approx(1 / 3)
    assert result["best"]["accuracy"] > 0.8


@pytest.mark.parametrize(("labels", "kwargs", "message"), [
    (["a"] * 30, {}, r"all 30 labels are the same class 'a'; a probe needs at least 2 classes"),
    (["a"] * 27 + ["b"] * 3, {}, (r"class 'b' has 3 examples, fewer than the 5 cross-validation folds; "
                                  r"each class needs at least 5 .*Class counts: 'a': 27, 'b': 3")),
    (["a"] * 26 + ["b", "c"] * 2, {}, r"2 of 3 classes \('b': 2, 'c': 2\) have fewer examples than the 5"),
    (["a", "b"] * 13 + [None, "a", "", "b"], {}, r"2 of 30 labels are missing .*first is at index 26"),
    (None, {}, r"labels are missing"),
    (["a", "b"] * 15, {"views": ["layer-3"]}, r"unknown view 'layer-3'; expected layer:K"),
    (["a", "b"] * 15, {"views": ["layer:9"]}, r"layer 9 does not exist; this model has hidden states 0..2"),
    (["a", "b"] * 15, {"head": "xgboost"}, r"unknown head 'xgboost'"),
    (["a", "b"] * 15, {"cv": 1}, r"cv must be an integer >= 2"),
    (["a", "b"] * 10, {}, r"expected hidden states \[n=20, H, d\]; got shape \(30, 3, 8\)"),
])
def test_input_errors_say_what_is_wrong(labels: Any, kwargs: dict[str, Any], message: str) -> None:
    states, _ = synthetic(n=30)
    with pytest.raises(ProbeInputError, match=message):
        run_probe(states.__getitem__, labels, **({"views": ["each_layer"]} | kwargs))


def test_a_scalar_mix_that_wins_gets_a_control_task_but_no_codelength() -> None:
    # the mix is the only view, so it is the best: its control runs, MDL has no fixed features to code
    states, labels = synthetic(n=120)
    result = run_probe(states.__getitem__, labels, views=["scalar_mix"], poolings=["mean"], cv=3,
                       learning_curve=False)
    assert result["best"]["view"] == "scalar_mix" and result["results"][0]["mdl"] is None
    control = result["control_task"]["best"]
    assert control["view"] == "scalar_mix" and control["control_compression"] is None
    assert abs(control["control_accuracy"] - 0.5) < 0.2

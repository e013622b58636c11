"""Linear probes on stored features: the frozen regime, and the split it shares.

``stratified_split`` makes the one train/validation/test split every regime
uses; ``subsample`` draws a seeded, stratified training subset for learning
curves. ``probe_layers`` is the frozen regime: for each hidden state a
StandardScaler + LogisticRegression (C=1, lbfgs) fit on train, the state with
the best validation macro-F1 (first on ties) scored on test; ``converged``
is False when any of those fits stopped at ``max_iter`` (its scores may be
understated, and the table says so). ``probe_head``
folds such a probe into one linear layer, so a fine-tuned head can start
from it (LP-FT).

Example::

    >>> train, val, test = stratified_split(y, test_size=0.2, val_size=0.1, seed=0)
    >>> metrics, arrays = probe_layers(features, y, train, val, test)
    >>> metrics["layer"], metrics["test_macro_f1"]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, f1_score
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

__all__ = ["probe_head", "probe_layers", "stratified_split", "subsample"]


def stratified_split(labels: np.ndarray, test_size: float, val_size: float,
                     seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices of train, validation and test, each stratified by label."""
    idx = np.arange(len(labels))
    rest, test = train_test_split(idx, test_size=test_size, stratify=labels, random_state=seed)
    train, val = train_test_split(rest, test_size=val_size / (1 - test_size),
                                  stratify=labels[rest], random_state=seed)
    return np.sort(train), np.sort(val), np.sort(test)


def subsample(train: np.ndarray, labels: np.ndarray, size: int | None, split_seed: int,
              seed: int) -> np.ndarray:
    """A stratified subset of ``size`` training rows, the same for every regime of a seed."""
    if size is None or size >= len(train):
        return train
    state = int(np.random.SeedSequence([split_seed, seed, size]).generate_state(1)[0])
    part, _ = train_test_split(train, train_size=size, stratify=labels[train], random_state=state)
    return np.sort(part)


def probe_layers(features: np.ndarray, y: np.ndarray, train: np.ndarray, val: np.ndarray,
                 test: np.ndarray, evals: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
                 ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Scaler + logistic regression per hidden state; pick by validation macro-F1.

    ``evals``: extra evaluation sets, name -> (features [m, L + 1, d], labels),
    scored with the chosen state's probe into ``metrics["eval_scores"]``."""
    # One BLAS thread: each fit is small (n x d), and on a busy machine waking
    # BLAS threads cost 100x the fit itself (measured: 0.35 s against 3 ms).
    with threadpool_limits(limits=1):
        return _probe_layers(features, y, train, val, test, dict(evals or {}))


def _probe_layers(features: np.ndarray, y: np.ndarray, train: np.ndarray, val: np.ndarray,
                  test: np.ndarray, evals: dict[str, tuple[np.ndarray, np.ndarray]],
                  ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    best: tuple[float, int, StandardScaler, LogisticRegression] | None = None
    val_f1s, stopped = [], []
    for layer in range(features.shape[1]):
        scaler = StandardScaler().fit(features[train, layer])
        clf = LogisticRegression(C=1.0, max_iter=2000)
        clf.fit(scaler.transform(features[train, layer]), y[train])
        if int(np.max(clf.n_iter_)) >= clf.max_iter:  # lbfgs gave up: reported, not hidden
            stopped.append(layer)
        f1 = float(f1_score(y[val], clf.predict(scaler.transform(features[val, layer])), average="macro"))
        val_f1s.append(f1)
        if best is None or f1 > best[0]:
            best = (f1, layer, scaler, clf)
    assert best is not None
    f1, layer, scaler, clf = best
    pred = clf.predict(scaler.transform(features[test, layer]))
    arrays = {"scaler_mean": scaler.mean_, "scaler_scale": scaler.scale_, "coef": clf.coef_,
              "intercept": clf.intercept_}
    eval_scores: dict[str, dict[str, float]] = {}
    metrics = {"layer": layer, "val_macro_f1": f1, "val_macro_f1_by_layer": val_f1s,
               "test_accuracy": float(accuracy_score(y[test], pred)),
               "test_macro_f1": float(f1_score(y[test], pred, average="macro")),
               "trainable": int(clf.coef_.size + clf.intercept_.size),
               "converged": not stopped, "layers_not_converged": stopped, "eval_scores": eval_scores}
    for name, (x_eval, y_eval) in evals.items():
        p = clf.predict(scaler.transform(x_eval[:, layer]))
        eval_scores[name] = {"accuracy": float(accuracy_score(y_eval, p)),
                             "macro_f1": float(f1_score(y_eval, p, average="macro"))}
    stored = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in arrays.items()}
    metrics["stored_params"] = sum(int(v.size) for v in stored.values())
    return metrics, stored


def probe_head(x: np.ndarray, y: np.ndarray, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """A logistic-regression probe on ``(x, y)`` as one linear layer, to start a head from.

    Returns float32 ``(weight [C, d], bias [C])`` whose logits' argmax is the
    probe's prediction, so a fine-tuning head can start where linear probing
    ends (LP-FT, Kumar et al. 2022) instead of at random: with a few hundred
    examples and a few epochs a random head is still undertrained, and the
    comparison would measure the step budget rather than the regime.

    Features are centred and divided by one scalar (the mean per-dimension
    std), not standardised per dimension: all-MiniLM-L6-v2 has near-constant
    dimensions (std ~1e-9) that per-dimension scaling turns into weights of
    ~1e28, so the first encoder update, moving those dimensions a little,
    flipped every prediction.
    """
    centre, scale = x.mean(0), float(x.std(0).mean()) or 1.0
    with threadpool_limits(limits=1):
        clf = LogisticRegression(C=1.0, max_iter=2000).fit((x - centre) / scale, y)
    w = clf.coef_ / scale  # w . (x - centre) / scale + b  ==  (w / scale) . x + b'
    b = clf.intercept_ - w @ centre
    weight, bias = np.zeros((n_classes, x.shape[1])), np.zeros(n_classes)
    if w.shape[0] == 1:  # binary: sigmoid(z) is softmax([0, z]) for the second class
        weight[clf.classes_[1]], bias[clf.classes_[1]] = w[0], b[0]
    else:
        weight[clf.classes_], bias[clf.classes_] = w, b
    return weight.astype(np.float32), bias.astype(np.float32)

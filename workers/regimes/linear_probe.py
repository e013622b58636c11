"""Linear probes on stored features: the frozen regime, and the split it shares.

``stratified_split`` makes the one train/validation/test split every regime
uses; ``subsample`` draws a seeded, stratified training subset for learning
curves. ``probe_layers`` is the frozen regime: for each hidden state the probe
sweep's logistic head (app/probes/heads.py ``LogisticHead``, which workers/
may not import), fit on train with the same code (layerbank.linear_probe):
the noise-aware standardisation of ``storage_dtype`` (dimensions below its
rounding step weigh nothing) and L2 logistic regression with C chosen from
``CS`` by inner stratified CV on the training rows (log loss; ``C`` in the
metrics), refit on all of them. The state with the best validation macro-F1
(first on ties) is scored on test; ``converged`` is False when any of those
refits stopped at ``MAX_ITER`` (its scores may be understated, and the table
says so). Until issue 26 it fit sklearn's StandardScaler + LogisticRegression
at C=1; on 1,500 SST-2 phrases (MiniLM) the inner-CV C moved test macro-F1
by the amounts docs/regimes.md gives. ``probe_head`` folds such a probe
into one linear layer, so a fine-tuned head can start from it (LP-FT).

Example::

    >>> train, val, test = stratified_split(y, test_size=0.2, val_size=0.1, seed=0)
    >>> metrics, arrays = probe_layers(features, y, train, val, test)
    >>> metrics["layer"], metrics["test_macro_f1"], metrics["C"]
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import accuracy_score, f1_score
from sklearn.model_selection import train_test_split
from threadpoolctl import threadpool_limits

from layerbank.linear_probe.logistic import (
    PROBE_CS,
    PROBE_INNER_CV,
    PROBE_MAX_ITER,
    PROBE_TOL,
    decision,
    fit_logistic_cv,
    softmax_decision,
)
from layerbank.linear_probe.standardize import Standardizer

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


# The probe sweep's logistic head's defaults (app/probes/heads.py LogisticHead takes the same
# constants): the C grid, inner folds, iteration cap and tolerance of its fit.
CS, INNER_CV, MAX_ITER, TOL = PROBE_CS, PROBE_INNER_CV, PROBE_MAX_ITER, PROBE_TOL


class _Probe:
    """One hidden state's probe, fit as ``LogisticHead.fit`` fits it: noise-aware
    standardisation of the training rows (a dropped dimension: scale inf, so it is 0
    and weighs nothing), then ``fit_logistic_cv`` on class indices."""

    def __init__(self, x: np.ndarray, y: np.ndarray, storage_dtype: str, random_state: int) -> None:
        x = np.asarray(x, dtype=np.float64)
        self.classes, y_idx = np.unique(y, return_inverse=True)
        self.mean, self.scale = Standardizer(storage_dtype).fit(x).full()
        with warnings.catch_warnings():  # not converging is reported in the metrics, not warned
            warnings.simplefilter("ignore", ConvergenceWarning)
            self.C, self.params, n_iter = fit_logistic_cv(
                (x - self.mean) / self.scale, y_idx, len(self.classes), CS, inner_cv=INNER_CV,
                random_state=random_state, max_iter=MAX_ITER, tol=TOL)
        self.converged = n_iter < MAX_ITER

    def predict(self, x: np.ndarray) -> np.ndarray:
        z = decision((np.asarray(x, dtype=np.float64) - self.mean) / self.scale, self.params)
        return np.asarray(self.classes[np.argmax(softmax_decision(z), axis=1)])


def probe_layers(features: np.ndarray, y: np.ndarray, train: np.ndarray, val: np.ndarray,
                 test: np.ndarray, evals: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None, *,
                 storage_dtype: str = "float16", random_state: int = 0,
                 ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The sweep's logistic probe per hidden state; pick by validation macro-F1.

    ``storage_dtype``: what the features were stored as (the standardisation's noise
    floor); ``random_state``: the inner-CV folds. ``evals``: extra evaluation sets,
    name -> (features [m, L + 1, d], labels), scored with the chosen state's probe
    into ``metrics["eval_scores"]``."""
    # One BLAS thread: each fit is small (n x d), and on a busy machine waking
    # BLAS threads cost 100x the fit itself (measured: 0.35 s against 3 ms).
    with threadpool_limits(limits=1):
        return _probe_layers(features, y, train, val, test, dict(evals or {}), storage_dtype, random_state)


def _probe_layers(features: np.ndarray, y: np.ndarray, train: np.ndarray, val: np.ndarray,
                  test: np.ndarray, evals: dict[str, tuple[np.ndarray, np.ndarray]], storage_dtype: str,
                  random_state: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    best: tuple[float, int, _Probe] | None = None
    val_f1s, stopped = [], []
    for layer in range(features.shape[1]):
        probe = _Probe(features[train, layer], y[train], storage_dtype, random_state)
        if not probe.converged:  # the refit gave up at max_iter: reported, not hidden
            stopped.append(layer)
        f1 = float(f1_score(y[val], probe.predict(features[val, layer]), average="macro"))
        val_f1s.append(f1)
        if best is None or f1 > best[0]:
            best = (f1, layer, probe)
    assert best is not None
    f1, layer, probe = best
    pred = probe.predict(features[test, layer])
    arrays = {"scaler_mean": probe.mean, "scaler_scale": probe.scale, "coef": probe.params[:, :-1],
              "intercept": probe.params[:, -1]}
    eval_scores: dict[str, dict[str, float]] = {}
    metrics = {"layer": layer, "C": probe.C, "val_macro_f1": f1, "val_macro_f1_by_layer": val_f1s,
               "test_accuracy": float(accuracy_score(y[test], pred)),
               "test_macro_f1": float(f1_score(y[test], pred, average="macro")),
               "trainable": int(probe.params.size),
               "converged": not stopped, "layers_not_converged": stopped, "eval_scores": eval_scores}
    for name, (x_eval, y_eval) in evals.items():
        p = probe.predict(x_eval[:, layer])
        eval_scores[name] = {"accuracy": float(accuracy_score(y_eval, p)),
                             "macro_f1": float(f1_score(y_eval, p, average="macro"))}
    stored = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in arrays.items()}
    metrics["stored_params"] = sum(int(v.size) for v in stored.values())
    return metrics, stored


def probe_head(x: np.ndarray, y: np.ndarray, n_classes: int,
               random_state: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A logistic-regression probe on ``(x, y)`` as one linear layer, to start a head from.

    Returns float32 ``(weight [C, d], bias [C])`` whose logits' argmax is the
    probe's prediction, so a fine-tuning head can start where linear probing
    ends (LP-FT, Kumar et al. 2022) instead of at random: with a few hundred
    examples and a few epochs a random head is still undertrained, and the
    comparison would measure the step budget rather than the regime.

    The fit is the frozen regime's (``fit_logistic_cv``: C from ``CS`` by inner
    CV, folds from ``random_state``), but features are centred and divided by
    one scalar (the mean per-dimension std), not standardised per dimension:
    all-MiniLM-L6-v2 has near-constant dimensions (std ~1e-9) that per-dimension
    scaling turns into weights of ~1e28, so the first encoder update, moving
    those dimensions a little, flipped every prediction.
    """
    x = np.asarray(x, dtype=np.float64)
    centre, scale = x.mean(0), float(x.std(0).mean()) or 1.0
    classes, y_idx = np.unique(y, return_inverse=True)
    with threadpool_limits(limits=1), warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        _, params, _ = fit_logistic_cv((x - centre) / scale, y_idx, len(classes), CS, inner_cv=INNER_CV,
                                       random_state=random_state, max_iter=MAX_ITER, tol=TOL)
    w = params[:, :-1] / scale  # w . (x - centre) / scale + b  ==  (w / scale) . x + b'
    b = params[:, -1] - w @ centre
    weight, bias = np.zeros((n_classes, x.shape[1])), np.zeros(n_classes)
    if w.shape[0] == 1:  # binary: sigmoid(z) is softmax([0, z]) for the second class
        weight[classes[1]], bias[classes[1]] = w[0], b[0]
    else:
        weight[classes], bias[classes] = w, b
    return weight.astype(np.float32), bias.astype(np.float32)

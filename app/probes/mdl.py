"""MDL probing: how many bits it takes to transmit the labels given the features.

Voita & Titov (2020), "Information-Theoretic Probing with Minimum Description
Length", online (prequential) code. Accuracy says whether a probe *can* read
a property; codelength also says how *easily*: a representation where the
labels are a simple function of the features compresses them with few
examples, one where a probe must memorise needs many bits.

The online code, exactly as in the paper: shuffle the examples once (seed),
cut them at the fractions ``0.1%, 0.2%, 0.4%, ..., 50%, 100%`` into blocks;
the first block is sent with the uniform code (``log2 K`` bits a label);
then for each following block, a probe trained on everything before it
encodes it, at ``-log2 p(y | x)`` bits a label::

    online = t_1 log2 K + sum_i  sum_{j in (t_i, t_{i+1}]} -log2 p_i(y_j | x_j)
    uniform = N log2 K,    compression = uniform / online

Compression near 1 means the probe learnt nothing transmissible (shuffled
labels give ~1.0); higher is better. The probe is the engine's own L2
logistic regression (``layerbank.linear_probe.logistic``) over standardized
features, with one output per class from the first block on, so a class not
seen yet still gets a (small) probability, as the paper's probe does.

Regularisation is chosen per block from the data already sent, never from
the block being coded (that would not be a code): by inner 3-fold CV over
``CS`` (``fit_logistic_cv``) once every class has 3 examples, and the
strongest C before that. The paper early-stops its probe on held-out data
for the same reason: with a fixed C = 1, a probe trained on 8 SST-2
sentences in 384 dimensions is confidently wrong on the next 8, and the
online code came out *longer* than the uniform one (compression 0.67 on the
best MiniLM layer, measured), which says nothing about the layer.

Cost: one fit per block (10-11 fits a view; the early ones on a handful of
rows), about as much as two folds of the accuracy sweep. A token probe's
blocks are hundreds of thousands of words, and the inner CV is most of its
time: it walks the grid from the previous block's C (``walk_from_previous``,
``_cv_walk``: the same folds and loss, the same C where the loss is
unimodal in C) and starts each fit from the previous block's model.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from sklearn.model_selection import StratifiedKFold

from layerbank.linear_probe.logistic import INNER_TOL_FACTOR, decision, fit_logistic, fit_logistic_cv
from layerbank.linear_probe.standardize import StandardizedRows, Standardizer

__all__ = ["CS", "PAPER_FRACTIONS", "block_ends", "online_codelength", "online_codelengths",
           "uniform_codelength"]

# Inverse L2 strengths tried per block (inner CV); the first is used while a class has < 3 examples.
CS: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0)

# Voita & Titov 2020, section 3.2: timestamps 0.1, 0.2, 0.4, 0.8, 1.6, 3.2,
# 6.25, 12.5, 25, 50 and 100 percent of the data.
PAPER_FRACTIONS: tuple[float, ...] = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032,
                                      0.0625, 0.125, 0.25, 0.5, 1.0)


def uniform_codelength(n: int, n_classes: int) -> float:
    """Bits to send ``n`` labels of ``n_classes`` with no model at all."""
    return n * math.log2(n_classes)


def block_ends(n: int, fractions: Sequence[float] = PAPER_FRACTIONS, min_first: int = 2) -> list[int]:
    """Where each block ends (exclusive), increasing, the last one ``n``.

    On small data the first fractions round to the same few rows; repeated
    ends are merged and the first block has at least ``min_first`` rows (the
    paper's 0.1% of its corpora was already dozens of examples).
    """
    if n < min_first + 1:
        raise ValueError(f"MDL needs at least {min_first + 1} examples, got {n}")
    ends = sorted({min(n, max(min_first, int(round(f * n)))) for f in fractions} | {n})
    return ends


def _bits(params: np.ndarray, Z: StandardizedRows, y: np.ndarray) -> np.ndarray:
    """-log2 p(y | z) per row for a fit of ``fit_logistic``."""
    logits = decision(Z, params)
    if logits.shape[1] == 1:  # binary: one row scores class 1 against 0
        logits = np.hstack([np.zeros_like(logits), logits])
    logits = logits - logits.max(axis=1, keepdims=True)
    log_p = logits[np.arange(len(y)), y] - np.log(np.exp(logits).sum(axis=1))
    return -log_p / math.log(2.0)


def _cv_walk(Z: StandardizedRows | np.ndarray, y: np.ndarray, k: int, c_prev: float | None,
             start: np.ndarray | None, *, seed: int, max_iter: int, tol: float = 1e-4,
             grid: Sequence[float] = CS) -> tuple[float, np.ndarray, int]:
    """``fit_logistic_cv(Z, y, k, grid)``'s choice of C, walked from ``c_prev`` (the previous
    block's C): its inner 3-fold CV (the same StratifiedKFold folds, held-out log loss, inner fits
    at 10x the tolerance) goes up the grid from ``c_prev`` while the loss falls, and down from
    it when the first step up does not help. ``fit_logistic_cv`` walks up from the smallest C and
    stops at the first rise; for a loss unimodal in C (which it assumes too) both stop at the
    same C, this one after 2-3 Cs instead of 4-6 on CoNLL's blocks (the chosen C rarely moves
    from one block to the next). The fits at ``c_prev`` start from ``start`` (the previous
    block's model, fitted on the first half of these rows), the others from the fold's fit at
    the neighbouring C; the refit from the mean of the folds' fits at the chosen C.

    Returns ``(C, params, n_iter)`` as ``fit_logistic_cv`` does."""
    grid = sorted(float(c) for c in grid)
    n_splits = min(3, int(np.bincount(y, minlength=k).min()))
    at = grid.index(c_prev) if c_prev in grid else 0
    splitter = StratifiedKFold(n_splits, shuffle=True, random_state=seed)
    folds = [(Z.take(tr), y[tr], Z.take(va), y[va]) if isinstance(Z, StandardizedRows)
             else (Z[tr], y[tr], Z[va], y[va]) for tr, va in splitter.split(np.zeros(len(y)), y)]
    inner_tol = INNER_TOL_FACTOR * tol

    def cv(C: float, starts: Sequence[np.ndarray | None]) -> tuple[float, list[np.ndarray]]:
        fitted, loss = [], 0.0
        for (Z_tr, y_tr, Z_va, y_va), s in zip(folds, starts):
            params, _ = fit_logistic(Z_tr, y_tr, k, C, start=s, max_iter=max_iter, tol=inner_tol)
            fitted.append(params)
            loss += float(_bits(params, Z_va, y_va).sum())
        return loss, fitted

    best_loss, best_fits = cv(grid[at], [start] * n_splits)
    best = at
    for step in (1, -1):  # up while the loss falls; down only if the first step up did not help
        i, fits = best + step, best_fits
        while 0 <= i < len(grid):
            loss, fits = cv(grid[i], fits)
            if loss >= best_loss if step == 1 else not loss < best_loss:
                break
            best, best_loss, best_fits = i, loss, fits
            i += step
        if best != at:
            break
    params, n_iter = fit_logistic(Z, y, k, grid[best], start=np.mean(best_fits, axis=0), max_iter=max_iter,
                                  tol=tol)
    return grid[best], params, n_iter


def online_codelength(X: np.ndarray, y: np.ndarray, n_classes: int | None = None, *,
                      fractions: Sequence[float] = PAPER_FRACTIONS, C: float | None = None, seed: int = 0,
                      max_iter: int = 500, storage_dtype: Any = np.float16,
                      shuffle: bool = True, dtype: Any = np.float64) -> dict[str, Any]:
    """Online codelength of labels ``y`` (class indices 0..K-1) given ``X`` [n, d].

    ``C``: one fixed inverse L2 strength for every block, or None (default)
    to choose it per block from the rows already sent (see the module docstring).
    ``dtype``: of the products the probes compute over chunks of rows (float32 halves the
    time on a token probe's corpus-sized blocks; float64 by default).

    Returns a JSON-serialisable dict: ``online_bits``, ``uniform_bits``,
    ``compression``, ``blocks`` (per block: its rows, the rows it was encoded
    from, its bits), ``first_block`` and ``dropped_dims`` (dimensions the
    standardizer ignored as below ``storage_dtype``'s resolution), and
    ``converged`` (every block's fit stopped before ``max_iter``).
    """
    y = np.asarray(y)
    k = int(n_classes if n_classes is not None else (y.max() + 1 if y.size else 0))
    return online_codelengths(X, [y], k, fractions=fractions, C=C, seed=seed, max_iter=max_iter,
                              storage_dtype=storage_dtype, shuffle=shuffle, dtype=dtype)[0]


def online_codelengths(X: np.ndarray, ys: Sequence[np.ndarray], n_classes: int, *,
                       fractions: Sequence[float] = PAPER_FRACTIONS, C: float | None = None, seed: int = 0,
                       max_iter: int = 500, storage_dtype: Any = np.float16, shuffle: bool = True,
                       dtype: Any = np.float64, n_jobs: int = 1,
                       walk_from_previous: bool = False) -> list[dict[str, Any]]:
    """``online_codelength`` of several label sets over the same ``X`` (a task's tags and its
    control tags): one shuffle, the same blocks, each block standardised once for all of them.

    Memory: no block is copied. ``X`` is read as it is (float16 stays float16); a block is an
    index array into it (with ``shuffle=False``, a slice: the token probe permutes its rows in
    place by the same seeded permutation first, so the fits read contiguous rows instead of
    gathering them at every step; the code is the same), standardised by folding its mean and
    spread into the weights (``StandardizedRows``), and the products run on chunks of rows cast
    to ``dtype`` (inner-CV folds too). ``n_jobs`` > 1 fits the
    label sets of a block on that many threads at once (numpy's products release the GIL).

    ``walk_from_previous`` (the token probe's): each block's C is chosen by the same inner CV
    (the same folds, the same held-out log loss) walked from the previous block's C instead of
    from the smallest (``_cv_walk``), each fold's first fit started from the previous block's
    model: fewer and shorter fits for what a unimodal loss gives the same C.
    """
    X = np.asarray(X)
    ys = [np.asarray(y, dtype=np.int64) for y in ys]
    if X.ndim != 2 or any(len(X) != len(y) for y in ys):
        raise ValueError(f"X must be [n, d] with one label per row; got {X.shape} and "
                         f"{[len(y) for y in ys]} labels")
    k = int(n_classes)
    if k < 2:
        raise ValueError("MDL needs at least 2 classes")
    n = len(X)
    order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
    ys = [y[order] for y in ys]
    ends = block_ends(n, fractions)
    first = ends[0]
    online = [first * math.log2(k)] * len(ys)
    blocks: list[list[dict[str, Any]]] = [[] for _ in ys]
    converged = [True] * len(ys)
    dropped = 0
    work_dtype = np.dtype(dtype)

    # per label set, with walk_from_previous: the previous block's C and model
    previous: list[tuple[float | None, np.ndarray | None]] = [(None, None)] * len(ys)

    def fit(Z: np.ndarray | StandardizedRows, seen: np.ndarray, j: int) -> tuple[np.ndarray, int]:
        with warnings.catch_warnings():  # reported once, as ``converged``
            warnings.simplefilter("ignore")
            if C is not None:
                return fit_logistic(Z, seen, k, C, max_iter=max_iter)
            if np.bincount(seen, minlength=k).min() >= 3:
                if walk_from_previous:
                    c_prev, p_prev = previous[j]
                    chosen, params, n_iter = _cv_walk(Z, seen, k, c_prev, p_prev, seed=seed, max_iter=max_iter)
                    previous[j] = (chosen, params)
                    return params, n_iter
                _, params, n_iter = fit_logistic_cv(Z, seen, k, CS, random_state=seed, max_iter=max_iter)
                return params, n_iter
            return fit_logistic(Z, seen, k, CS[0], max_iter=max_iter)

    pool = ThreadPoolExecutor(n_jobs) if n_jobs > 1 and len(ys) > 1 else None
    try:
        for start, end in zip(ends[:-1], ends[1:]):
            # the rows sent so far, standardised by their own mean and spread: index arrays into X
            # (StandardizedRows folds the standardisation into the weights), no gathered copy
            if shuffle:
                scaler = Standardizer(storage_dtype, work_dtype).fit(X, order[:start])
                Z, coded = scaler.rows(X, order[:start]), scaler.rows(X, order[start:end])
            else:  # rows in order (the token probe shuffles them itself, in place): slices, no gathers
                scaler = Standardizer(storage_dtype, work_dtype).fit(X[:start])
                Z, coded = scaler.rows(X[:start]), scaler.rows(X[start:end])
            dropped = scaler.n_dropped
            seen = [y[:start] for y in ys]
            labels = range(len(ys))
            fits = list(pool.map(fit, [Z] * len(ys), seen, labels)) if pool else list(map(fit, [Z] * len(ys), seen, labels))
            for j, (params, n_iter) in enumerate(fits):
                converged[j] &= n_iter < max_iter
                bits = float(_bits(params, coded, ys[j][start:end]).sum())
                online[j] += bits
                blocks[j].append({"rows": end - start, "trained_on": start, "bits": round(bits, 3)})
    finally:
        if pool is not None:
            pool.shutdown()
    uniform = uniform_codelength(n, k)
    return [{
        "online_bits": round(online[j], 3),
        "uniform_bits": round(uniform, 3),
        "compression": round(uniform / online[j], 4),
        "first_block": first,
        "blocks": blocks[j],
        "dropped_dims": dropped,
        "converged": bool(converged[j]),
    } for j in range(len(ys))]

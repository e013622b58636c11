"""layerbank.linear_probe.whitening: a change of variables of the streamed logistic fit that
keeps its objective (the same weights at the optimum, exactly 0 on dropped dimensions) and
takes far fewer L-BFGS steps on correlated features, as a concat of adjacent layers is."""

from __future__ import annotations

import numpy as np
import pytest

from layerbank.linear_probe import logistic
from layerbank.linear_probe.logistic import fit_logistic
from layerbank.linear_probe.standardize import Standardizer
from layerbank.linear_probe.whitening import whitening_of


def adjacent_layers(n: int, d: int, copies: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """float16 rows of ``copies`` nearly equal blocks (one residual stream read at adjacent
    layers: each block is the last plus a little), the class in a few directions."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    base = rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) / np.sqrt(d)  # correlated within a layer
    base[:, :3] += 0.4 * rng.normal(size=(k, 3))[y]  # overlapping classes: the weights matter
    blocks, layer = [], base
    for _ in range(copies):
        layer = layer + 0.15 * rng.normal(size=(n, d))
        blocks.append(layer)
    return np.hstack(blocks).astype(np.float16), y


def objective(Z: np.ndarray, y: np.ndarray, params: np.ndarray, C: float) -> float:
    logits = Z @ params[:, :-1].T + params[:, -1]
    if logits.shape[1] == 1:  # one row for two classes: the score of the second against the first
        logits = np.hstack([np.zeros_like(logits), logits])
    m = logits.max(axis=1, keepdims=True)
    ce = np.log(np.exp(logits - m).sum(axis=1)) + m[:, 0] - logits[np.arange(len(y)), y]
    return float(ce.mean() + np.sum(params[:, :-1] ** 2) / (2 * C * len(y)))


def test_the_change_of_variables_is_invertible_and_keeps_the_l2_penalty():
    X, _ = adjacent_layers(3000, 12, 3, 4)
    X[:, 5] = np.float16(0.25)  # a constant dimension: dropped by the standardisation
    scaler = Standardizer("float16", "float32").fit(X)
    assert scaler.n_dropped == 1
    white = whitening_of(scaler.rows(X))
    assert white.keep.sum() == 35 and not white.keep[5]
    coef = np.random.default_rng(1).normal(size=(4, 36))
    coef[:, 5] = 0.0
    np.testing.assert_allclose(white.to_coef(white.to_u(coef)), coef, atol=1e-9)
    u = np.random.default_rng(2).normal(size=(4, 35))
    back = white.to_coef(u)
    assert back[:, 5].tolist() == [0.0] * 4
    np.testing.assert_allclose(np.sum(back ** 2), np.sum(u * u * white.inv_eigen), rtol=1e-10)
    # whitened: the standardised rows in the new basis have (nearly) unit covariance where not floored
    Z = scaler.transform(X)  # the kept dimensions only
    cov = np.cov((Z @ white.M.T).T, bias=True)
    big = white.eigen > white.eigen.max() * 1e-3 * 1.0001
    np.testing.assert_allclose(np.diag(cov)[big], 1.0, atol=2e-3)


@pytest.mark.parametrize("k", [2, 9])
def test_correlated_features_fit_in_far_fewer_steps_to_as_low_an_objective(k, monkeypatch):
    X, y = adjacent_layers(6000, 32, 4, k, seed=k)
    scaler = Standardizer("float16", "float32").fit(X)
    Z = scaler.transform(X).astype(np.float64)
    white, white_steps = fit_logistic(scaler.rows(X), y, k, 1.0, max_iter=3000, tol=1e-6)
    monkeypatch.setattr(logistic, "WHITEN_MIN_ROWS_PER_DIM", 10**9)
    plain, plain_steps = fit_logistic(scaler.rows(X), y, k, 1.0, max_iter=3000, tol=1e-6)
    assert white_steps * 4 < plain_steps, (white_steps, plain_steps)  # measured 12 vs 149, 35 vs 248
    assert objective(Z, y, white, 1.0) <= objective(Z, y, plain, 1.0) + 1e-9
    agree = np.mean(np.argmax(Z @ white[:, :-1].T + white[:, -1], 1) == np.argmax(Z @ plain[:, :-1].T + plain[:, -1], 1))
    assert agree > 0.995


def test_few_rows_for_their_width_fit_unwhitened_and_folds_share_the_basis():
    X, y = adjacent_layers(60, 16, 3, 3)  # 60 rows, 48 dimensions: not worth a basis
    rows = Standardizer("float16", "float32").fit(X).rows(X)
    fit_logistic(rows, y, 3, 1.0, max_iter=200)
    assert "whitening" not in rows.derived
    X, y = adjacent_layers(2000, 16, 3, 3)
    rows = Standardizer("float16", "float32").fit(X).rows(X)
    fold = rows.take(np.arange(0, 2000, 3))
    fit_logistic(rows, y, 3, 1.0, max_iter=200)
    assert fold.derived["whitening"] is rows.derived["whitening"]  # one Gram pass for every inner-CV fold

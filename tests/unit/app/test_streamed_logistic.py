"""layerbank.linear_probe.logistic over StandardizedRows: the stored float16 rows with the
standardisation folded into the weights give the fit of the standardised matrix, and
scikit-learn's LogisticRegression on the float32 copy the token probe used to make."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from layerbank.linear_probe import logistic, standardize
from layerbank.linear_probe.logistic import decision, fit_logistic, fit_logistic_cv
from layerbank.linear_probe.standardize import Standardizer


def stored_rows(n: int, d: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """float16 features with large means and uneven spreads (as hidden states have), some of
    whose dimensions carry the class."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    x = rng.normal(size=(n, d)) * rng.uniform(0.2, 3.0, d) + rng.normal(size=d) * 5.0
    x[:, :4] += 1.5 * rng.normal(size=(k, 4))[y]
    return x.astype(np.float16), y


def objective(Z: np.ndarray, y: np.ndarray, params: np.ndarray, C: float) -> float:
    """sklearn's LogisticRegression objective (per row) of ``params`` on the standardised copy."""
    logits = Z @ params[:, :-1].T + params[:, -1]
    if logits.shape[1] == 1:
        logits = np.hstack([np.zeros_like(logits), logits])
    m = logits.max(axis=1, keepdims=True)
    ce = np.log(np.exp(logits - m).sum(axis=1)) + m[:, 0] - logits[np.arange(len(y)), y]
    return float(ce.mean() + np.sum(params[:, :-1] ** 2) / (2 * C * len(y)))


@pytest.mark.parametrize("whitened", [False, True])
@pytest.mark.parametrize("k", [2, 5])
def test_folded_standardisation_fits_what_the_standardised_copy_fits(k, whitened, monkeypatch):
    monkeypatch.setattr(standardize, "CHUNK_BYTES", 4096)  # many chunks, a partial last one
    if not whitened:
        monkeypatch.setattr(logistic, "WHITEN_MIN_ROWS_PER_DIM", 10**9)
    X, y = stored_rows(1500, 24, k)
    scaler = Standardizer("float16", "float64").fit(X)
    Z = scaler.transform(X)  # the standardised float64 copy
    expected, _ = fit_logistic(Z, y, k, 0.5, max_iter=2000, tol=1e-9)
    rows = scaler.rows(X)
    got, _ = fit_logistic(rows, y, k, 0.5, max_iter=2000, tol=1e-9)
    assert X.dtype == np.float16 and rows.X is X  # read as stored, never copied
    assert ("whitening" in rows.derived) is whitened
    if whitened:  # other coordinates, the same optimum: as low an objective, the same weights
        assert objective(Z, y, got, 0.5) <= objective(Z, y, expected, 0.5) + 1e-13
        np.testing.assert_allclose(got, expected, atol=2e-5)
    else:  # the same steps: the same weights to rounding
        np.testing.assert_allclose(got, expected, atol=1e-6)
    np.testing.assert_allclose(decision(rows, got), Z @ got[:, :-1].T + got[:, -1], atol=1e-9)
    # a subset of rows (an MDL block) is an index array into the same X
    idx = np.random.default_rng(1).permutation(len(y))[:400]
    sub, _ = fit_logistic(scaler.rows(X, idx), y[idx], k, 0.5, max_iter=2000, tol=1e-9)
    direct, _ = fit_logistic(Z[idx], y[idx], k, 0.5, max_iter=2000, tol=1e-9)
    np.testing.assert_allclose(sub, direct, atol=2e-5 if whitened else 1e-6)


def test_the_float32_stream_predicts_as_sklearn_on_the_standardised_float32_copy():
    X, y = stored_rows(4000, 48, 9, seed=3)
    scaler = Standardizer("float16", "float32").fit(X)
    clf = LogisticRegression(C=1.0, max_iter=1000).fit(scaler.transform(X), y)
    params, n_iter = fit_logistic(scaler.rows(X), y, 9, 1.0, max_iter=1000)
    assert n_iter < 1000
    scores = decision(scaler.rows(X), params)
    assert np.mean(scores.argmax(axis=1) == clf.predict(scaler.transform(X))) > 0.995
    # the weights agree; intercepts up to the common shift softmax cannot see
    np.testing.assert_allclose(params[:, :-1], clf.coef_, atol=2e-2 * np.abs(clf.coef_).max())
    shift = params[:, -1] - clf.intercept_
    assert np.ptp(shift) < 2e-2 * max(1.0, np.abs(clf.intercept_).max())


def test_a_dimension_of_rounding_noise_gets_no_weight_and_cv_folds_are_not_copies():
    X, y = stored_rows(900, 10, 3, seed=5)
    base = np.float16(0.37)
    X[:, 0] = np.where(np.random.default_rng(2).random(len(X)) < 0.5, base, np.nextafter(base, np.float16(1)))
    scaler = Standardizer("float16", "float32").fit(X)
    assert scaler.n_dropped == 1
    C, params, _ = fit_logistic_cv(scaler.rows(X), y, 3, (0.01, 0.1, 1.0), max_iter=500)
    assert params[:, 0].tolist() == [0.0, 0.0, 0.0]
    # the same C as the standardised copy's inner CV (the same folds: same y, same seed)
    C_copy, _, _ = fit_logistic_cv(scaler.transform(X).astype(np.float64), y, 3, (0.01, 0.1, 1.0), max_iter=500)
    assert C == C_copy


def test_float16_rows_cast_by_integer_operations_are_exactly_numpys_cast(monkeypatch):
    # every finite float16 (63,488 bit patterns: subnormals, zeros of both signs, the largest),
    # cast as a chunk of rows is cast for a fit; an infinity falls back to numpy's own cast
    monkeypatch.setattr(standardize, "CHUNK_BYTES", 31 * 4 * 100)  # 100 rows a chunk: 21 chunks
    bits = np.arange(2**16, dtype=np.uint16)
    finite = bits[(bits & 0x7C00) != 0x7C00].view(np.float16)
    X = finite[: finite.size // 31 * 31].reshape(-1, 31)
    rows = standardize.StandardizedRows(X, None, np.zeros(31), np.ones(31), np.float32)
    got = np.concatenate([chunk.copy() for _, chunk in rows.chunks()])
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), X.astype(np.float32).view(np.uint32))
    X[5, 3], X[-1, 0] = np.inf, -np.inf
    got = np.concatenate([chunk.copy() for _, chunk in rows.chunks()])
    np.testing.assert_array_equal(got, X.astype(np.float32))

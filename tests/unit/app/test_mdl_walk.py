"""The token probe's MDL path (layerbank.app.probes.mdl, ``walk_from_previous``): the inner CV walked
from the previous block's C picks the C that fit_logistic_cv's walk from the smallest picks, its
model is scikit-learn's LogisticRegression at that C on the same standardised rows, and the
online code it gives is the grid walk's up to the fits' tolerance."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from layerbank.app.probes.mdl import CS, _cv_walk, online_codelengths
from layerbank.linear_probe.logistic import fit_logistic_cv
from layerbank.linear_probe.standardize import Standardizer


def stored_rows(n: int, d: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """float16 rows with large means, uneven spreads and a noisy class signal in a few dimensions
    (so the held-out loss has its minimum inside the C grid, not at an end)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    x = rng.normal(size=(n, d)) * rng.uniform(0.2, 3.0, d) + rng.normal(size=d) * 5.0
    x[:, :3] += 0.6 * rng.normal(size=(k, 3))[y]
    return x.astype(np.float16), y


@pytest.mark.parametrize("k", [2, 4])
def test_the_walk_from_any_previous_C_chooses_the_grid_walks_C_and_fits_as_sklearn(k):
    X, y = stored_rows(600, 40, k, seed=k)
    scaler = Standardizer("float16", "float32").fit(X)
    rows = scaler.rows(X)
    C_grid, _, _ = fit_logistic_cv(rows, y, k, CS, random_state=0, max_iter=500)
    assert CS[0] < C_grid < CS[-1]  # an interior choice: the walk must go up or down to find it
    for c_prev in (None, *CS):
        C, params, n_iter = _cv_walk(rows, y, k, c_prev, None, seed=0, max_iter=500)
        assert C == C_grid, c_prev
    clf = LogisticRegression(C=C, tol=1e-8, max_iter=5000).fit(scaler.transform(X).astype(np.float64), y)
    coef = params[:, :-1]
    if k > 2:  # sklearn's multinomial intercepts are up to a common shift; compare the scores
        scores, ref = rows.decision(coef, params[:, -1]), clf.decision_function(scaler.transform(X))
        np.testing.assert_allclose(scores - scores.mean(1, keepdims=True), ref - ref.mean(1, keepdims=True),
                                   atol=2e-2 * np.abs(ref).max())
    np.testing.assert_allclose(coef, clf.coef_, atol=2e-2 * np.abs(clf.coef_).max())
    assert n_iter < 500


def test_the_walked_code_is_the_grid_code_up_to_the_fits_tolerance():
    X, y = stored_rows(3000, 24, 3, seed=7)
    control = np.random.default_rng(1).integers(0, 3, len(y))
    kwargs = dict(seed=0, max_iter=300, dtype=np.float32, shuffle=False)
    grid = online_codelengths(X, [y, control], 3, **kwargs)
    walked = online_codelengths(X, [y, control], 3, walk_from_previous=True, **kwargs)
    for g, w in zip(grid, walked):
        assert w["online_bits"] == pytest.approx(g["online_bits"], rel=2e-3)
        assert [b["rows"] for b in w["blocks"]] == [b["rows"] for b in g["blocks"]]
    assert grid[0]["compression"] > 1.05 and grid[1]["compression"] < 1.02  # signal vs noise labels

"""MDL online codelength (Voita & Titov 2020) against hand-computed and independent values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from layerbank.app.probes.mdl import block_ends, online_codelength, uniform_codelength
from layerbank.linear_probe.standardize import Standardizer


def test_block_ends_follow_the_papers_fractions():
    # 0.1%, 0.2%, ... of 1,000 rows; 0.1% rounds to 1 row, raised to the 2-row minimum
    assert block_ends(1000) == [2, 4, 8, 16, 32, 62, 125, 250, 500, 1000]
    assert block_ends(10) == [2, 5, 10]  # 2.5 rounds to 2 (half to even), merged with the first


def test_uniform_code_is_log2_k_bits_per_label():
    assert uniform_codelength(1000, 2) == 1000.0
    assert uniform_codelength(10, 4) == 20.0
    assert uniform_codelength(3, 3) == pytest.approx(3 * 1.584962500721156)


def _independent(X, y, ends, C):
    """The online code with scikit-learn's LogisticRegression, written from the paper."""
    bits = ends[0] * math.log2(2)
    for start, end in zip(ends[:-1], ends[1:]):
        scaler = StandardScaler().fit(X[:start])
        clf = LogisticRegression(C=C, tol=1e-10, max_iter=10_000).fit(scaler.transform(X[:start]), y[:start])
        p = clf.predict_proba(scaler.transform(X[start:end]))[np.arange(end - start), y[start:end]]
        bits += float(-np.log2(p).sum())
    return bits


def test_codelength_equals_an_independent_implementation():
    rng = np.random.default_rng(0)
    n = 400
    X = rng.normal(size=(n, 5))
    y = (X[:, 0] + 0.7 * rng.normal(size=n) > 0).astype(int)
    y[0], y[1] = 0, 1  # every training block holds both classes (sklearn needs them)
    result = online_codelength(X, y, 2, shuffle=False, storage_dtype=np.float32, C=1.0)
    expected = _independent(X, y, block_ends(n), C=1.0)
    assert result["online_bits"] == pytest.approx(expected, rel=2e-3)
    assert result["uniform_bits"] == 400.0
    assert result["compression"] == pytest.approx(400.0 / expected, rel=2e-3)
    assert sum(b["rows"] for b in result["blocks"]) + result["first_block"] == n


def test_a_label_that_is_one_feature_compresses_and_shuffled_labels_do_not():
    rng = np.random.default_rng(1)
    n = 2000
    X = rng.normal(size=(n, 16))
    y = (X[:, 3] > 0).astype(int)
    clean = online_codelength(X, y, 2, seed=0)
    shuffled = online_codelength(X, rng.permutation(y), 2, seed=0)
    # the first block (2 rows) always costs exactly 1 bit a label
    assert clean["first_block"] == 2
    assert clean["online_bits"] > 2.0
    assert clean["compression"] > 4.0
    assert 0.85 < shuffled["compression"] < 1.05
    assert clean["converged"] and shuffled["converged"]


def test_four_classes_and_a_class_not_seen_in_the_first_block():
    rng = np.random.default_rng(2)
    n = 800
    X = rng.normal(size=(n, 8))
    y = np.argmax(X[:, :4], axis=1)
    result = online_codelength(X, y, 4, seed=3)
    assert result["uniform_bits"] == 1600.0
    assert result["compression"] > 2.0
    assert np.isfinite(result["online_bits"])


def test_bad_input_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="at least 3 examples"):
        online_codelength(np.zeros((2, 3)), np.array([0, 1]), 2)
    with pytest.raises(ValueError, match="one label per row"):
        online_codelength(np.zeros((5, 3)), np.array([0, 1]), 2)


def test_standardizer_drops_dimensions_below_the_storage_resolution():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(500, 4)).astype(np.float16).astype(np.float64)
    # a dimension that is a constant up to float16 rounding: two adjacent float16 values
    base = np.float16(0.37)
    X[:, 2] = np.where(rng.random(500) < 0.5, base, np.nextafter(base, np.float16(1)))
    s = Standardizer(np.float16).fit(X)
    assert s.n_dropped == 1 and s.keep_.tolist() == [True, True, False, True]
    Z = s.transform(X)
    assert Z.shape == (500, 3)
    assert np.allclose(Z.mean(axis=0), 0) and np.allclose(Z.std(axis=0), 1)
    # stored as float32 the same spread is far above one step: kept
    assert Standardizer(np.float32).fit(X).n_dropped == 0


def test_several_label_sets_share_the_blocks_and_match_one_by_one():
    # the token probe codes its tags and its control tags in one pass, fits side by side
    from layerbank.app.probes.mdl import online_codelengths

    rng = np.random.default_rng(4)
    n = 600
    X = rng.normal(size=(n, 6)).astype(np.float32)
    X[:, 5] = 2.0  # constant: dropped (zeroed in place) in every block
    y = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5).astype(int)
    y_control = rng.integers(0, 3, size=n)
    one_by_one = [online_codelength(X, labels, 3, seed=2, C=1.0, dtype=np.float32) for labels in (y, y_control)]
    together = online_codelengths(X, [y, y_control], 3, seed=2, C=1.0, dtype=np.float32, n_jobs=2)
    for a, b in zip(together, one_by_one):
        assert a["online_bits"] == pytest.approx(b["online_bits"], rel=1e-9)
        assert a["dropped_dims"] == 1 and a["blocks"] == b["blocks"]
    # random tags compress nothing (below 1 with a fixed C: early blocks overfit, see the module docstring)
    assert together[0]["compression"] > 1.5 and together[1]["compression"] < 1.05
    assert X[0, 5] == 2.0  # the caller's rows are not standardised in place

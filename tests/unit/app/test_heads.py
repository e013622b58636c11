"""Heads: scikit-learn's estimator contract, save/load without pickle."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.utils.estimator_checks import parametrize_with_checks
from threadpoolctl import threadpool_limits

from layerbank.app.probes import heads
from layerbank.app.probes.heads import HEAD_NAMES, ProbeInputError, load_head, make_head, save_head
from layerbank.app.probes.scalar_mix import ScalarMixHead
from layerbank.linear_probe.logistic import fit_logistic

ALL_HEADS = [make_head(name, seed=0) for name in HEAD_NAMES]

# the data here are tiny and separable: the MLP keeps improving until max_iter
# and says so; expected, and not what these tests are about
pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


@pytest.fixture(autouse=True)
def one_blas_thread():  # type: ignore[no-untyped-def]
    # tiny matrices on a shared 2-core machine: BLAS threads only contend (10x slower)
    with threadpool_limits(1):
        yield


def _contract_checks():  # type: ignore[no-untyped-def]
    """scikit-learn's checks, without the array-API ones: those need SCIPY_ARRAY_API
    set before scipy is imported and only skip here; heads take numpy arrays."""
    marker = parametrize_with_checks(ALL_HEADS)
    names, values = marker.args[:2]
    keep = [v for v in values
            if "array_api" not in getattr(getattr(v.values[1] if hasattr(v, "values") else v[1],
                                                  "func", None), "__name__", "")]
    return pytest.mark.parametrize(names, keep, **marker.kwargs)


@_contract_checks()
def test_sklearn_estimator_contract(estimator, check):  # type: ignore[no-untyped-def]
    check(estimator)


def _data(n: int = 120, d: int = 6, k: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = np.arange(n) % k
    X = rng.normal(size=(n, d)) + 1.5 * np.eye(k, d)[y]
    return X, np.array(["neg", "neu", "pos"])[y]


def _fit(name: str, X: np.ndarray, y: np.ndarray):  # type: ignore[no-untyped-def]
    if name == "scalar_mix":  # reads [n, H, d]: give it three hidden states
        X = np.stack([X * 0.1, X, X[::-1] * 2.0], axis=1)
    return make_head(name, seed=0).fit(X, y), X


@pytest.mark.parametrize("name", HEAD_NAMES)
def test_save_load_round_trip_gives_identical_probabilities(name: str, tmp_path: Path) -> None:
    X, y = _data()
    head, X = _fit(name, X, y)
    n_bytes = save_head(head, tmp_path / name, {"view": "layer:-1", "pooling": "mean"})
    assert n_bytes == sum(f.stat().st_size for f in (tmp_path / name).iterdir())
    loaded = load_head(tmp_path / name)
    assert type(loaded) is type(head)
    np.testing.assert_array_equal(loaded.predict_proba(X), head.predict_proba(X))
    np.testing.assert_array_equal(loaded.predict(X), head.predict(X))
    assert loaded.get_params() == head.get_params()
    doc = json.loads((tmp_path / name / "head.json").read_text())
    assert doc["metadata"] == {"view": "layer:-1", "pooling": "mean"}


@pytest.mark.parametrize("name", HEAD_NAMES)
def test_saved_head_holds_no_pickle_and_loads_with_allow_pickle_false(
        name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    X, y = _data()
    head, X = _fit(name, X, y)
    save_head(head, tmp_path, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["arrays.npz", "head.json"]
    with zipfile.ZipFile(tmp_path / "arrays.npz") as z:
        for member in z.namelist():
            raw = z.read(member)
            assert raw.startswith(b"\x93NUMPY"), member  # plain .npy, not a pickled object
            header = raw[10:10 + int.from_bytes(raw[8:10], "little")].decode("latin1")
            assert "'descr': '|O'" not in header, (member, header)
    real_load = np.load
    calls: list[object] = []

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(kwargs.get("allow_pickle"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(np, "load", spy)
    load_head(tmp_path).predict_proba(X)
    assert calls == [False]


def test_object_labels_are_saved_as_text(tmp_path: Path) -> None:
    X, y = _data()
    head = make_head("ridge").fit(X, y.astype(object))
    save_head(head, tmp_path, {})
    assert list(load_head(tmp_path).predict(X[:3])) == list(head.predict(X[:3]))


def test_unknown_head_name_is_a_probe_input_error() -> None:
    with pytest.raises(ProbeInputError, match=r"unknown head 'xgboost'; choose one of logistic, ridge"):
        make_head("xgboost")


def test_logistic_solver_matches_sklearn_logistic_regression() -> None:
    """layerbank.linear_probe.logistic is sklearn's objective; same C gives the same model."""
    X, y = _data(n=200, d=8)
    Z = (X - X.mean(0)) / X.std(0)
    y_idx = np.unique(y, return_inverse=True)[1]
    for k, target in ((2, y_idx % 2), (3, y_idx)):
        params, _ = fit_logistic(Z, target, k, C=0.3, tol=1e-8, max_iter=1000)
        ref = LogisticRegression(C=0.3, tol=1e-8, max_iter=1000).fit(Z, target)
        np.testing.assert_allclose(params[:, :-1], ref.coef_, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(params[:, -1], ref.intercept_, rtol=1e-4, atol=1e-6)


def test_logistic_picks_C_inside_the_training_rows_only() -> None:
    """A noise-only problem wants the strongest regularization in the grid."""
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(300, 40)), rng.integers(0, 2, 300)
    assert make_head("logistic").fit(X, y).C_ == 0.001
    X_signal = X + 3.0 * y[:, None] * (np.arange(40) < 2)
    assert make_head("logistic").fit(X_signal, y).C_ > 0.001


def test_uncalibrated_heads_give_softmax_of_the_decision() -> None:
    X, y = _data()
    for name in ("ridge", "linear_svm"):
        head = make_head(name).fit(X, y)
        Z = (X - head.mean_) / head.scale_
        z = Z @ head.coef_.T + head.intercept_
        expected = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        np.testing.assert_allclose(head.predict_proba(X), expected)


def test_knn_saves_its_training_rows_so_its_size_grows_with_them(tmp_path: Path) -> None:
    X, y = _data(n=60)
    small = save_head(make_head("knn").fit(X, y), tmp_path / "a", {})
    X2, y2 = _data(n=600)
    large = save_head(make_head("knn").fit(X2, y2), tmp_path / "b", {})
    assert large > 5 * small


def test_scalar_mix_head_is_registered_for_loading() -> None:
    assert isinstance(heads.make_head("scalar_mix"), ScalarMixHead)


@pytest.mark.parametrize("name", [n for n in HEAD_NAMES if n != "scalar_mix"])
def test_a_dimension_of_float16_rounding_noise_is_left_out(name: str, tmp_path: Path) -> None:
    # what a near-constant dimension looks like after float16 storage: two adjacent
    # float16 values at random; plain standardisation made that unit-variance noise
    X, y = _data(n=150, d=4)
    step = float(np.spacing(np.float16(3.0)))  # 0.00195 at 3.0
    noise = 3.0 + step * np.random.default_rng(1).integers(0, 2, size=(len(X), 1))
    with_noise = np.hstack([X[:, :2], noise, X[:, 2:]])
    head = make_head(name, seed=0).fit(with_noise, y)
    assert head.n_dropped_ == 1 and np.isinf(head.scale_[2]) and np.isfinite(np.delete(head.scale_, 2)).all()
    # the noise column weighs nothing: other noise there changes no probability
    redrawn = with_noise.copy()
    redrawn[:, 2] = 3.0 + step * np.random.default_rng(2).integers(0, 2, size=len(X))
    np.testing.assert_array_equal(head.predict_proba(redrawn), head.predict_proba(with_noise))
    if name != "mlp":  # (the MLP's random init draws weights for the extra input too)
        # and the head is the one that never saw it
        clean = make_head(name, seed=0).fit(X, y)
        np.testing.assert_allclose(head.predict_proba(with_noise), clean.predict_proba(X), atol=1e-6)
    save_head(head, tmp_path / "h", {})
    assert load_head(tmp_path / "h").n_dropped_ == 1
    # stored as float32, the same spread is 16,000 steps: a real dimension, kept
    assert make_head(name, seed=0, storage_dtype="float32").fit(with_noise, y).n_dropped_ == 0


def test_the_sentence_probe_passes_the_storage_dtype_to_its_heads() -> None:
    from layerbank.app.probes.sweep import fit_head

    X, y = _data(n=90, d=4)
    step = float(np.spacing(np.float16(3.0)))
    states = np.stack([X, X], axis=1)  # [n, H=2, d]
    states[:, 1, 0] = 3.0 + step * (np.arange(len(X)) % 2)  # layer 1, dimension 0: float16 rounding noise
    assert fit_head(states, y, "layer:1").n_dropped_ == 1  # float16, the default storage
    assert fit_head(states, y, "layer:1", storage_dtype="float32").n_dropped_ == 0

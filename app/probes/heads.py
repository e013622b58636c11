"""Heads: small classifiers trained on cached (frozen) encoder features.

Contract (scikit-learn's): ``__init__`` only stores parameters; ``fit(X, y)``
learns, sets attributes ending in ``_`` and returns ``self``; ``predict`` and
``predict_proba`` call ``check_is_fitted``. So a head works in a ``Pipeline``,
``GridSearchCV`` or ``cross_val_score``.

Every head standardizes its input (mean and scale learned in ``fit``, so only
from training rows) and then predicts from plain numpy arrays it owns. The
standardisation is noise-aware, as the token probe's and MDL's are
(layerbank.linear_probe.standardize): a dimension whose spread is below one step
of ``storage_dtype`` (the dtype the features were stored in) is stored
rounding noise, and gets ``scale_ = inf``, so its standardized value is 0 and
it carries no weight, instead of being scaled up to unit variance; ``n_dropped_``
counts them. Saved heads keep their layout (``mean_``, ``scale_``). That is
what makes saving possible without pickle: ``save_head`` writes those arrays
to ``arrays.npz`` and the parameters to ``head.json``; ``load_head`` reads
them back with ``np.load(..., allow_pickle=False)``.

Heads by name (``make_head(name, seed)``):

    logistic     standardize + L2 logistic regression (lbfgs); C chosen by
                 inner stratified CV on the training rows only (the default)
    ridge        RidgeClassifierCV; alpha chosen by efficient leave-one-out
    linear_svm   LinearSVC
    mlp          MLPClassifier, one small ReLU hidden layer, lbfgs
    knn          k nearest neighbours (Euclidean, standardized features)
    scalar_mix   learned ELMo scalar mix + linear softmax (layerbank.app.probes.scalar_mix);
                 takes all hidden states [n, H, d], not one view

``predict_proba`` exists for every head. For ``ridge`` and ``linear_svm`` it is
the softmax of ``decision_function`` (sigmoid for two classes): it ranks like
the decision function but is *not calibrated*.

Example::

    >>> head = make_head("logistic", seed=0).fit(X_train, y_train)
    >>> n_bytes = save_head(head, "heads/sst2", {"view": "layer:-2"})
    >>> load_head("heads/sst2").predict_proba(X_test)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.linear_model import RidgeClassifierCV
from sklearn.neighbors import KNeighborsClassifier
from sklearn.neural_network import MLPClassifier
from sklearn.svm import LinearSVC
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from layerbank.app.probes.head_files import read_head, write_head
from layerbank.app.probes.head_names import HEAD_NAMES
from layerbank.app.probes.scalar_mix import ScalarMixHead  # it imports logistic, not this module
from layerbank.cache.errors import InputError
from layerbank.linear_probe.logistic import (
    PROBE_CS,
    PROBE_INNER_CV,
    PROBE_MAX_ITER,
    PROBE_TOL,
    fit_logistic_cv,
    softmax_decision,
)
from layerbank.linear_probe.standardize import Standardizer

__all__ = [
    "HEAD_NAMES",
    "Head",
    "KNNHead",
    "LinearSVMHead",
    "LogisticHead",
    "MLPHead",
    "ProbeInputError",
    "RidgeHead",
    "load_head",
    "make_head",
    "save_head",
    "softmax_decision",
]

# the names live in head_names.py (no scikit-learn there, so the API and CLI can list them)


class ProbeInputError(InputError):
    """Input a probe cannot run on (labels, views, head name); the message says why."""


class Head(ClassifierMixin, BaseEstimator):
    """Base of the 2-D heads: standardize, then ``_fit_standardized``.

    Subclasses set ``name``, list their fitted arrays in ``_arrays`` and
    fitted scalars in ``_scalars`` (what ``save_head`` writes), and implement
    ``_fit_standardized(Z, y_idx)`` and ``_decision(Z)``.
    """

    name: ClassVar[str] = ""
    storage_dtype: str = "float16"  # set by every subclass's __init__ (a scikit-learn parameter)
    _arrays: ClassVar[tuple[str, ...]] = ()
    _scalars: ClassVar[tuple[str, ...]] = ()

    def fit(self, X: Any, y: Any) -> Head:
        X, y = validate_data(self, X, y, dtype=np.float64)
        check_classification_targets(y)
        self.classes_, y_idx = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            # sklearn's one-label check accepts a ValueError naming the class count
            raise ValueError(f"a head needs samples of at least 2 classes; got 1 class ({self.classes_[0]!r})")
        # a dropped (noise) dimension: scale inf, so (x - mean) / scale is 0 and it weighs nothing
        self.mean_, self.scale_ = Standardizer(self.storage_dtype).fit(X).full()
        self._fit_standardized((X - self.mean_) / self.scale_, y_idx)
        return self

    @property
    def n_dropped_(self) -> int:
        """Dimensions left out as storage rounding noise (also for a loaded head)."""
        return int(np.isinf(self.scale_).sum())

    def _fit_standardized(self, Z: np.ndarray, y_idx: np.ndarray) -> None:
        raise NotImplementedError

    def _decision(self, Z: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _restore(self) -> None:
        """Rebuild helper objects after ``load_head`` set the arrays."""

    def predict_proba(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float64)
        return self._proba((X - self.mean_) / self.scale_)

    def _proba(self, Z: np.ndarray) -> np.ndarray:
        return softmax_decision(self._decision(Z))

    def predict(self, X: Any) -> np.ndarray:
        proba = self.predict_proba(X)  # checks fitted before classes_ is read
        return self.classes_[np.argmax(proba, axis=1)]


class _LinearHead(Head):
    """A head whose decision is ``Z @ coef_.T + intercept_``."""

    _arrays = ("classes_", "mean_", "scale_", "coef_", "intercept_")

    def decision_function(self, X: Any) -> np.ndarray:
        """Scores [n] for two classes (> 0 means ``classes_[1]``), else [n, K]."""
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float64)
        z = self._decision((X - self.mean_) / self.scale_)
        return z[:, 0] if z.shape[1] == 1 else z

    def _decision(self, Z: np.ndarray) -> np.ndarray:
        return Z @ self.coef_.T + self.intercept_

    def _take_linear(self, model: Any) -> None:
        self.coef_ = np.array(model.coef_, dtype=np.float64).reshape(-1, self.n_features_in_)
        self.intercept_ = np.array(model.intercept_, dtype=np.float64).reshape(-1)


class LogisticHead(_LinearHead):
    """L2 logistic regression; C picked from ``Cs`` by inner stratified CV.

    Same objective and solver (lbfgs) as sklearn's ``LogisticRegression(C)``
    on standardized features, solved by ``layerbank.linear_probe.logistic`` (see there why).
    ``C_`` comes from an inner CV on the rows given to ``fit`` only
    (``fit_logistic_cv``: log loss, warm-started path over ``Cs``); the
    final model is refit on all those rows at ``C_``.

    Example::

        >>> LogisticHead(random_state=0).fit(X, y).C_
        0.01
    """

    name = "logistic"
    _scalars = ("C_", "n_iter_")

    def __init__(self, Cs: tuple[float, ...] = PROBE_CS, inner_cv: int = PROBE_INNER_CV,
                 max_iter: int = PROBE_MAX_ITER, tol: float = PROBE_TOL, random_state: int | None = 0,
                 storage_dtype: str = "float16") -> None:
        self.storage_dtype = storage_dtype
        self.Cs = Cs
        self.inner_cv = inner_cv
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state

    def _fit_standardized(self, Z: np.ndarray, y_idx: np.ndarray) -> None:
        self.C_, params, self.n_iter_ = fit_logistic_cv(
            Z, y_idx, len(self.classes_), self.Cs, inner_cv=self.inner_cv, random_state=self.random_state,
            max_iter=self.max_iter, tol=self.tol)
        self.coef_, self.intercept_ = params[:, :-1].copy(), params[:, -1].copy()


class RidgeHead(_LinearHead):
    """RidgeClassifierCV: alpha from ``alphas`` by leave-one-out (closed form).

    ``predict_proba`` is the softmax of the decision function: uncalibrated.
    """

    name = "ridge"
    _scalars = ("alpha_",)

    def __init__(self, alphas: tuple[float, ...] = (0.1, 1.0, 10.0, 100.0, 1000.0),
                 storage_dtype: str = "float16") -> None:
        self.storage_dtype = storage_dtype
        self.alphas = alphas

    def _fit_standardized(self, Z: np.ndarray, y_idx: np.ndarray) -> None:
        model = RidgeClassifierCV(alphas=tuple(self.alphas)).fit(Z, y_idx)
        self.alpha_ = float(model.alpha_)
        self._take_linear(model)


class LinearSVMHead(_LinearHead):
    """LinearSVC (squared hinge, L2). ``predict_proba``: softmax of the decision
    function, uncalibrated. ``C`` defaults below sklearn's 1.0 because probe
    features are many, standardized and usually few rows per dimension."""

    name = "linear_svm"
    _scalars = ("n_iter_",)

    def __init__(self, C: float = 0.1, max_iter: int = 2000, random_state: int | None = 0,
                 storage_dtype: str = "float16") -> None:
        self.storage_dtype = storage_dtype
        self.C = C
        self.max_iter = max_iter
        self.random_state = random_state

    def _fit_standardized(self, Z: np.ndarray, y_idx: np.ndarray) -> None:
        model = LinearSVC(C=self.C, max_iter=self.max_iter, random_state=self.random_state)
        model.fit(Z, y_idx)
        self.n_iter_ = int(np.max(model.n_iter_))
        self._take_linear(model)


class MLPHead(Head):
    """MLPClassifier with one ReLU hidden layer of ``hidden_units`` (lbfgs).

    Prediction is a numpy forward pass over the stored weights (identical
    maths to sklearn's), so a loaded head needs no sklearn object.
    """

    name = "mlp"
    _arrays = ("classes_", "mean_", "scale_", "hidden_weights_", "hidden_bias_",
               "output_weights_", "output_bias_")
    _scalars = ("n_iter_",)

    def __init__(self, hidden_units: int = 64, alpha: float = 1e-2, max_iter: int = 200,
                 random_state: int | None = 0, storage_dtype: str = "float16") -> None:
        self.storage_dtype = storage_dtype
        self.hidden_units = hidden_units
        self.alpha = alpha
        self.max_iter = max_iter
        self.random_state = random_state

    def _fit_standardized(self, Z: np.ndarray, y_idx: np.ndarray) -> None:
        # full-batch lbfgs: on probe-sized data (thousands of rows) it matched
        # adam's accuracy in a sixth of the time
        model = MLPClassifier(hidden_layer_sizes=(self.hidden_units,), alpha=self.alpha, solver="lbfgs",
                              max_iter=self.max_iter, random_state=self.random_state)
        model.fit(Z, y_idx)
        self.n_iter_ = int(model.n_iter_)
        self.hidden_weights_, self.output_weights_ = (np.asarray(w, np.float64) for w in model.coefs_)
        self.hidden_bias_, self.output_bias_ = (np.asarray(b, np.float64) for b in model.intercepts_)

    def _decision(self, Z: np.ndarray) -> np.ndarray:
        hidden = np.maximum(Z @ self.hidden_weights_ + self.hidden_bias_, 0.0)
        return hidden @ self.output_weights_ + self.output_bias_


class KNNHead(Head):
    """k nearest neighbours (uniform vote, Euclidean on standardized features).

    The training rows are part of the head (that is what kNN is), so its saved
    size grows with the training set. ``k`` is capped at the number of rows.
    """

    name = "knn"
    _arrays = ("classes_", "mean_", "scale_", "train_features_", "train_labels_")
    _scalars = ("n_neighbors_",)

    def __init__(self, n_neighbors: int = 10, storage_dtype: str = "float16") -> None:
        self.storage_dtype = storage_dtype
        self.n_neighbors = n_neighbors

    def _fit_standardized(self, Z: np.ndarray, y_idx: np.ndarray) -> None:
        self.train_features_ = Z
        self.train_labels_ = y_idx.astype(np.int64)
        self.n_neighbors_ = int(min(self.n_neighbors, len(Z)))
        self._restore()

    def _restore(self) -> None:
        self._knn = KNeighborsClassifier(self.n_neighbors_, algorithm="brute")
        self._knn.fit(self.train_features_, self.train_labels_)

    def _proba(self, Z: np.ndarray) -> np.ndarray:
        # the vote fractions, laid out over all classes (labels are 0..K-1)
        out = np.zeros((len(Z), len(self.classes_)))
        out[:, self._knn.classes_] = self._knn.predict_proba(Z)
        return out


_HEAD_CLASSES: dict[str, type] = {c.name: c for c in (LogisticHead, RidgeHead, LinearSVMHead, MLPHead, KNNHead)}


def _head_class(name: str) -> type:
    if name == "scalar_mix":
        return ScalarMixHead
    if name not in _HEAD_CLASSES:
        raise ProbeInputError(f"unknown head {name!r}; choose one of {', '.join(HEAD_NAMES)}", field="head")
    return _HEAD_CLASSES[name]


def make_head(name: str, seed: int = 0, storage_dtype: str = "float16") -> Any:
    """A fresh, unfitted head by name, with ``seed`` wherever it draws randomness;
    ``storage_dtype``: what its features were stored as (the noise floor of its standardisation)."""
    if not isinstance(name, str):
        raise ProbeInputError(f"a head name must be a string, one of {', '.join(HEAD_NAMES)}", field="head")
    cls = _head_class(name)
    params = cls().get_params()
    given = {"random_state": seed, "storage_dtype": storage_dtype}
    return cls(**{k: v for k, v in given.items() if k in params})


def save_head(head: Any, directory: str | Path, metadata: dict[str, Any]) -> int:
    """Write a fitted head to ``directory`` as ``arrays.npz`` + ``head.json``.

    ``metadata`` (JSON-serializable: view, pooling, model, scores ...) is
    stored under ``"metadata"``. Returns the bytes written (both files).
    """
    return write_head(head, directory, metadata)


def load_head(directory: str | Path) -> Any:
    """Rebuild a head saved by ``save_head``; never unpickles anything."""
    return read_head(directory, _head_class)

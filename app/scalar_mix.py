"""Learned scalar mix (ELMo, Peters et al. 2018; AllenNLP ``ScalarMix``).

One vector per text is mixed from all hidden states ``h_0 .. h_L``::

    mix = gamma * sum_i softmax(s)_i * z_i,    z_i = (h_i - mean_i) / scale_i

and a linear softmax classifier reads ``mix``. ``s``, ``gamma`` and the
classifier are fitted together on cached features ``X[n, H, d]`` by
minimizing one objective::

    mean cross-entropy + l2/2 * (||W||^2 + gamma^2) + 1e-3/2 * ||s||^2

Each layer is scaled by one number (its RMS after centering), not per
feature, so that the mix stays a weighted sum of the *stored* states: the
view ``weighted:w_0,...,w_L`` with ``w_i = gamma * softmax(s)_i / scale_i``
(``view_weights_``) gives the mixed vector up to a constant shift. This is
the learned layer weighting in the form the feature API reads.
``layer_weights_`` (``softmax(s)``, sums to 1) is the one to read as "how
much each layer contributes", because the scales are divided out.

gamma and W only act through their product, so penalizing both picks the
balanced split (gamma^2 = ||W||); predictions do not depend on that choice.

Fitting alternates two exact minimizations of the objective (block
coordinate descent): W and the intercept with scikit-learn's lbfgs logistic
regression on the current mix, then ``s``, gamma and the intercept with
scipy's L-BFGS on per-layer logits ``z_i @ W`` (an [H, n, K] array, cheap).
Both steps lower the same objective, so it converges; it needs two passes
over ``X`` per round instead of two per gradient step.

Example::

    >>> head = ScalarMixHead().fit(states, labels)     # states [n, H, d]
    >>> head.layer_weights_.round(2)
    array([0.02, 0.03, 0.05, 0.1 , 0.2 , 0.6 ])
    >>> weighted_view_spec(head)
    'weighted:0.0012,...'
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.optimize import minimize
from sklearn import config_context
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.linear_model import LogisticRegression
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from app.heads import softmax_decision

__all__ = ["ScalarMixHead", "weighted_view_spec"]

_S_L2 = 1e-3  # keeps softmax logits finite when a layer carries nothing


def _as_states(X: np.ndarray) -> np.ndarray:
    """[n, d] is read as one hidden state; [n, H, d] as H of them."""
    if X.ndim == 2:
        return X[:, None, :]
    if X.ndim != 3:
        raise ValueError(f"expected hidden states [n, H, d] or features [n, d]; got shape {X.shape}")
    return X


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max())
    return e / e.sum()


def _cross_entropy(decision: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy and its gradient w.r.t. decision [n, 1 or K]."""
    p = softmax_decision(decision)
    n = len(y)
    loss = -np.log(np.clip(p[np.arange(n), y], 1e-300, None)).mean()
    g = p.copy()
    g[np.arange(n), y] -= 1.0
    g /= n
    # binary: the single column is the score of class 1 against class 0
    return float(loss), (g[:, 1:] if decision.shape[1] == 1 else g)


class ScalarMixHead(ClassifierMixin, BaseEstimator):
    """Scalar mix of all hidden states + linear softmax classifier.

    ``fit(X, y)`` takes ``X`` of shape [n, H, d] (all hidden states of one
    pooling) or [n, d] (read as H = 1). ``n_features_in_`` is H for 3-D input.
    Fitted: ``layer_weights_`` [H] (softmax(s)), ``gamma_``, ``view_weights_``
    [H], ``coef_`` [K or 1, d], ``intercept_``, ``mean_`` [H, d],
    ``layer_scale_`` [H], ``mix_logits_`` [H] (s), ``n_iter_`` (rounds).
    """

    name = "scalar_mix"
    _arrays = ("classes_", "mean_", "layer_scale_", "mix_logits_", "layer_weights_",
               "view_weights_", "coef_", "intercept_")
    _scalars = ("gamma_", "n_iter_", "hidden_size_")

    def __init__(self, l2: float = 1e-2, max_iter: int = 30, tol: float = 1e-5) -> None:
        self.l2 = l2
        self.max_iter = max_iter
        self.tol = tol

    def _restore(self) -> None:
        """Nothing to rebuild after load_head: prediction uses the arrays."""

    def _standardize(self, X: np.ndarray) -> np.ndarray:
        return (X - self.mean_) / self.layer_scale_[:, None]

    def fit(self, X: Any, y: Any) -> ScalarMixHead:
        if not self.l2 > 0:
            raise ValueError(f"l2 must be > 0 (gamma and W are only identified by it); got {self.l2}")
        X, y = validate_data(self, X, y, dtype=np.float64, allow_nd=True)
        states = _as_states(X)
        check_classification_targets(y)
        self.classes_, y_idx = np.unique(y, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"a head needs samples of at least 2 classes; got 1 class ({self.classes_[0]!r})")
        n, h, d = states.shape
        self.hidden_size_ = d
        self.mean_ = states.mean(axis=0)
        rms = np.sqrt(((states - self.mean_) ** 2).mean(axis=(0, 2)))
        self.layer_scale_ = np.where(rms > 1e-12, rms, 1.0)
        Z = self._standardize(states)

        s, gamma = np.zeros(h), 1.0
        clf = LogisticRegression(C=1.0 / (self.l2 * n), warm_start=True, max_iter=500)
        previous = np.inf
        with config_context(assume_finite=True, skip_parameter_validation=True):
            for rounds in range(1, int(self.max_iter) + 1):
                # step 1: classifier on the current mix (sklearn's C * sum == mean / (l2 n))
                clf.fit(gamma * np.einsum("h,nhd->nd", _softmax(s), Z), y_idx)
                W, b = clf.coef_, clf.intercept_
                # step 2: mix weights, gamma, intercept with W held fixed
                per_layer = np.einsum("nhd,kd->hnk", Z, W)
                s, gamma, b, objective = self._fit_mix(per_layer, y_idx, s, gamma, b, W)
                # gamma*W is what predicts; rebalance so gamma^2 = ||W|| (lower penalty)
                w_norm = float(np.linalg.norm(W))
                if w_norm > 0 and gamma > 0:
                    new_gamma = np.sqrt(gamma * w_norm)
                    clf.coef_ = W * (gamma / new_gamma)
                    gamma = new_gamma
                clf.intercept_ = b
                if previous - objective <= self.tol * max(1.0, abs(objective)):
                    break
                previous = objective
        self.n_iter_ = rounds
        self.mix_logits_, self.gamma_ = s, float(gamma)
        self.coef_, self.intercept_ = np.array(clf.coef_), np.array(clf.intercept_)
        self.layer_weights_ = _softmax(s)
        self.view_weights_ = self.gamma_ * self.layer_weights_ / self.layer_scale_
        return self

    def _fit_mix(self, per_layer: np.ndarray, y: np.ndarray, s: np.ndarray, gamma: float,
                 b: np.ndarray, W: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, float]:
        """Minimize the objective over (s, gamma, intercept) with W fixed."""
        h = len(s)
        w_penalty = 0.5 * self.l2 * float((W ** 2).sum())

        def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
            s_, g_, b_ = theta[:h], theta[h], theta[h + 1:]
            a = _softmax(s_)
            mixed = np.einsum("h,hnk->nk", a, per_layer)
            loss, grad = _cross_entropy(g_ * mixed + b_, y)
            da = g_ * np.einsum("nk,hnk->h", grad, per_layer)
            ds = a * (da - a @ da) + _S_L2 * s_
            dg = float((grad * mixed).sum()) + self.l2 * g_
            value = loss + w_penalty + 0.5 * self.l2 * g_ ** 2 + 0.5 * _S_L2 * float(s_ @ s_)
            return value, np.concatenate([ds, [dg], grad.sum(axis=0)])

        theta0 = np.concatenate([s, [gamma], b])
        result = minimize(objective, theta0, jac=True, method="L-BFGS-B", options={"maxiter": 200})
        t = result.x
        return t[:h], float(t[h]), t[h + 1:], float(result.fun)

    def _decision(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=np.float64, allow_nd=True)
        states = _as_states(X)
        if states.shape[2] != self.hidden_size_:
            raise ValueError(f"X has hidden size {states.shape[2]}, but this head expects {self.hidden_size_}")
        mix = self.gamma_ * np.einsum("h,nhd->nd", self.layer_weights_, self._standardize(states))
        return mix @ self.coef_.T + self.intercept_

    def predict_proba(self, X: Any) -> np.ndarray:
        return softmax_decision(self._decision(X))

    def predict(self, X: Any) -> np.ndarray:
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]


def weighted_view_spec(head: ScalarMixHead, digits: int = 6) -> str:
    """The ``weighted:w0,...,wL`` view (cache.views grammar) of a fitted mix."""
    check_is_fitted(head)
    return "weighted:" + ",".join(f"{w:.{digits}g}" for w in head.view_weights_)

"""L2 logistic regression with lbfgs, the objective of scikit-learn's
``LogisticRegression(C=C, solver="lbfgs")``, without its per-call overhead.

Why not call sklearn: choosing C by inner CV takes ~13 fits per outer fold
and a probe sweep ~70 outer folds; sklearn re-validates inputs and rebuilds
its loss object on every call, which was most of the time on 2,000 x 384
features. Here one fit is scipy's L-BFGS-B over a numpy loss. The test
suite checks the coefficients against sklearn's ``LogisticRegression``.

Objective (sklearn's, scaled by 1/n as sklearn does internally)::

    mean_i CE(x_i W^T + b, y_i) + ||W||^2 / (2 C n)      (b not penalized)

Two classes: one weight row, ``p(class 1) = sigmoid(x w + b)``. More:
multinomial softmax with one row per class. Same stopping rule as sklearn:
``gtol=tol``, ``ftol=64 * eps``, at most ``max_iter`` iterations.

Corpus-sized features (a token probe on a whole corpus: 200k words x 1,536
for ``concat_last_4``) come as ``StandardizedRows``
(layerbank.linear_probe.standardize): the stored rows (float16 for a wide
view) with the standardisation folded into the weights, so no standardised
float32 copy is ever made. Each loss evaluation walks the rows in chunks
(cast to float32, a few MB, kept in cache for both products): logits
``x (W / s)^T + (b - mu (W / s)^T)`` and gradient
``((P - Y)^T x - colsum(P - Y) mu) / s``; subsets of rows (MDL blocks,
inner-CV folds) are index arrays. Mathematically the same objective as on
the standardised copy; in float32 the scores differ from it in the 7th
digit. Such fits also run in whitened coordinates
(layerbank.linear_probe.whitening: the same objective and optimum, 5-7x fewer
L-BFGS steps on ``concat_last_4``), so their ``tol`` is read in those
coordinates; fits on arrays keep sklearn's steps.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit, log_expit
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import StratifiedKFold

from layerbank.linear_probe.standardize import StandardizedRows
from layerbank.linear_probe.whitening import Whitening, whitening_of

__all__ = ["PROBE_CS", "PROBE_INNER_CV", "PROBE_MAX_ITER", "PROBE_TOL", "decision", "fit_logistic",
           "fit_logistic_cv", "softmax_decision"]

# The frozen probe's defaults, one place for both users: the probe sweep's LogisticHead
# (app/probes/heads.py) and the frozen regime (workers/regimes/linear_probe.py). The C grid,
# the inner folds that choose C, the refit's iteration cap and tolerance.
PROBE_CS: tuple[float, ...] = (0.001, 0.01, 0.1, 1.0)
PROBE_INNER_CV, PROBE_MAX_ITER, PROBE_TOL = 3, 300, 1e-4

# Inner-CV fits only rank the Cs by held-out loss, which settles long before
# the weights do: a 10x looser gtol there cut a third of the work on real
# features (SST-2, MiniLM) and chose the same C. The refit uses ``tol``.
INNER_TOL_FACTOR = 10.0

# Streamed fits (StandardizedRows) run whitened (layerbank.linear_probe.whitening) when the rows
# are at least this many times the dimensions: below that the Gram pass and eigendecomposition
# cost more than the few steps such a fit takes (an MDL code's first blocks).
WHITEN_MIN_ROWS_PER_DIM = 2
_BASIS_LOCK = threading.Lock()


def _binary(theta: np.ndarray, Z: np.ndarray, y: np.ndarray, l2: float) -> tuple[float, np.ndarray]:
    w, b = theta[:-1], theta[-1]
    z = (Z @ w.astype(Z.dtype)).astype(np.float64) + b  # float32 Z: see _Multinomial
    # log(1 + e^z) - y z, written with log_expit so large |z| stays finite
    loss = float(np.mean(-log_expit(z) + (1.0 - y) * z)) + 0.5 * l2 * float(w @ w)
    g = (expit(z) - y) / len(y)
    return loss, np.concatenate([Z.T @ g.astype(Z.dtype) + l2 * w, [g.sum()]])


class _Multinomial:
    """Softmax loss and gradient over one fixed (Z, y): the one-hot targets
    and flat label indices are built once per fit, not once per L-BFGS step
    (this is called ~30 times per fit, ~700 fits per probe sweep)."""

    def __init__(self, Z: np.ndarray, y: np.ndarray, l2: float, k: int) -> None:
        self.Z = Z
        self.n, self.d = self.Z.shape
        self.k, self.l2 = k, l2
        self.Y = np.zeros((self.n, k))
        self.Y[np.arange(self.n), y] = 1.0
        self.at_label = np.arange(self.n) * k + y  # flat index of each row's label logit

    def __call__(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        n, d, k = self.n, self.d, self.k
        W = theta.reshape(k, d + 1)
        coef = W[:, :-1]
        # the two products read all of Z, which dominates the time; with Z in
        # float32 (inner-CV fits only) they read half the bytes. Everything
        # else (softmax, loss, weights) stays float64.
        logits = (self.Z @ coef.T.astype(self.Z.dtype)).astype(np.float64)
        logits += W[:, -1]
        # log-sum-exp by hand (scipy's re-checks and re-allocates on every
        # call): shift by the row max, then P = exp(shifted) / row sum is the
        # softmax, reused as the gradient below
        logits -= logits.max(axis=1, keepdims=True)
        P = np.exp(logits)
        norm = P.sum(axis=1)
        # CE_i = log(sum_j e^{s_ij}) - s_i,y  (s: shifted logits; the max cancels)
        loss = (np.log(norm).sum() - logits.ravel()[self.at_label].sum()) / n
        loss += 0.5 * self.l2 * float(np.vdot(coef, coef))
        P /= norm[:, None]
        P -= self.Y
        P *= 1.0 / n
        grad = np.empty((k, d + 1))
        grad[:, :-1] = P.T.astype(self.Z.dtype) @ self.Z
        grad[:, :-1] += self.l2 * coef
        grad[:, -1] = P.sum(axis=0)
        return float(loss), grad.ravel()


class _Streamed:
    """Loss and gradient (binary: one row; else softmax) over ``StandardizedRows``, chunk by
    chunk: the same objective as ``_binary`` / ``_Multinomial`` on the standardised matrix.

    With ``white`` (layerbank.linear_probe.whitening), the variables are the whitened ``u``
    (then intercepts), ``coef = white.to_coef(u)``: the same objective in other coordinates."""

    def __init__(self, Z: StandardizedRows, y: np.ndarray, l2: float, rows: int,
                 white: Whitening | None = None) -> None:
        self.Z, self.y, self.l2, self.rows = Z, np.asarray(y, dtype=np.int64), l2, rows
        self.n, self.d = Z.shape
        self.white = white
        self.width = self.d if white is None else int(white.keep.sum())  # variables per row

    def __call__(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        n, d, rows, Z, white = self.n, self.d, self.rows, self.Z, self.white
        W = theta.reshape(rows, self.width + 1)
        u = W[:, :-1]
        coef = u if white is None else white.to_coef(u)
        v, b = Z.folded(coef, W[:, -1])
        vt = np.ascontiguousarray(v.T, dtype=Z.dtype)
        loss = 0.0
        xg = np.zeros((rows, d))  # sum_i g_i x_i over the raw rows
        gsum = np.zeros(rows)
        for a, chunk in Z.chunks():
            y = self.y[a : a + chunk.shape[0]]
            z = (chunk @ vt).astype(np.float64)
            z += b
            if rows == 1:
                z1 = z[:, 0]
                loss += float(np.sum(-log_expit(z1) + (1.0 - y) * z1))
                g = (expit(z1) - y)[:, None]
            else:
                z -= z.max(axis=1, keepdims=True)
                g = np.exp(z)
                norm = g.sum(axis=1)
                loss += float(np.log(norm).sum() - z[np.arange(len(y)), y].sum())
                g /= norm[:, None]
                g[np.arange(len(y)), y] -= 1.0
            xg += g.T.astype(Z.dtype) @ chunk
            gsum += g.sum(axis=0)
        xg /= n
        gsum /= n
        grad = np.empty((rows, self.width + 1))
        data = (xg - np.outer(gsum, Z.mean)) * Z.inv_scale  # d loss / d coef
        if white is None:
            grad[:, :-1] = data + self.l2 * coef
            penalty = float(np.vdot(coef, coef))
        else:  # d / du of the loss at coef = u M, and ||coef||^2 = sum_j ||u_j||^2 / e_j
            grad[:, :-1] = data[:, white.keep] @ white.M.T + self.l2 * u * white.inv_eigen
            penalty = float(np.sum(u * u * white.inv_eigen))
        grad[:, -1] = gsum
        return loss / n + 0.5 * self.l2 * penalty, grad.ravel()


def fit_logistic(Z: np.ndarray | StandardizedRows, y: np.ndarray, n_classes: int, C: float, *,
                 start: np.ndarray | None = None, max_iter: int = 300,
                 tol: float = 1e-4) -> tuple[np.ndarray, int]:
    """Fit on ``Z`` [n, d] (float64, or ``StandardizedRows``) and class indices ``y`` (0..K-1).

    A float32 ``Z`` (C-contiguous) makes the two products per step float32,
    about half the time; the loss, gradient sums and weights stay float64.
    ``fit_logistic_cv`` does that for its inner-CV fits only: they rank Cs at
    a 10x looser tol, far above float32 rounding (~1e-7 relative).

    Returns ``(params, n_iter)``: ``params`` is [rows, d + 1] (weights then
    intercept; 1 row for two classes, else K), usable as ``start`` for a
    warm start at another C.
    """
    n, d = Z.shape
    rows = 1 if n_classes == 2 else n_classes
    l2 = 1.0 / (C * n)
    theta0 = np.zeros(rows * (d + 1)) if start is None else np.asarray(start, np.float64).ravel()
    args: tuple = ()
    fun: Any
    white: Whitening | None = None
    if isinstance(Z, StandardizedRows):
        if n >= WHITEN_MIN_ROWS_PER_DIM * d:  # layerbank.linear_probe.whitening: same optimum, fewer steps
            with _BASIS_LOCK:  # the tagger and its control head start on the same rows at once: one basis
                white = Z.derived.get("whitening")
                if white is None:
                    white = Z.derived["whitening"] = whitening_of(Z)
            W0 = theta0.reshape(rows, d + 1)
            theta0 = np.hstack([white.to_u(W0[:, :-1]), W0[:, -1:]]).ravel()
        fun = _Streamed(Z, y, l2, rows, white)
    else:
        if Z.dtype != np.float32:
            Z = np.ascontiguousarray(Z, dtype=np.float64)
        if rows == 1:
            args, fun = (Z, y.astype(np.float64), l2), _binary
        else:
            fun = _Multinomial(Z, y, l2, rows)
    result = minimize(fun, theta0, args=args, jac=True, method="L-BFGS-B",
                      options={"maxiter": max_iter, "maxls": 50, "gtol": tol,
                               "ftol": 64 * np.finfo(float).eps})
    if result.status == 1:  # stopped at max_iter, as sklearn reports it
        warnings.warn(f"logistic regression did not converge in max_iter={max_iter} iterations",
                      ConvergenceWarning, stacklevel=2)
    if white is not None:
        U = result.x.reshape(rows, -1)
        return np.hstack([white.to_coef(U[:, :-1]), U[:, -1:]]), int(result.nit)
    return result.x.reshape(rows, d + 1), int(result.nit)


def decision(Z: np.ndarray | StandardizedRows, params: np.ndarray) -> np.ndarray:
    """Scores [n, rows] of a ``fit_logistic`` result on ``Z``."""
    if isinstance(Z, StandardizedRows):
        return Z.decision(params[:, :-1], params[:, -1])
    return Z @ params[:, :-1].T + params[:, -1]


def _log_loss(Z: np.ndarray | StandardizedRows, y: np.ndarray, params: np.ndarray) -> float:
    """Summed log loss of ``params`` on (Z, y)."""
    logits = decision(Z, params)
    if logits.shape[1] == 1:
        logits = np.hstack([np.zeros_like(logits), logits])
    logits -= logits.max(axis=1, keepdims=True)
    return float((np.log(np.exp(logits).sum(axis=1)) - logits[np.arange(len(y)), y]).sum())


def fit_logistic_cv(Z: np.ndarray | StandardizedRows, y: np.ndarray, n_classes: int, Cs: tuple[float, ...], *,
                    inner_cv: int = 3, random_state: int | None = 0, max_iter: int = 300,
                    tol: float = 1e-4) -> tuple[float, np.ndarray, int]:
    """Choose C by inner stratified CV on (Z, y), refit on all of it.

    Returns ``(C, params, n_iter)``. The inner CV scores held-out log loss
    and walks ``Cs`` upwards, each fold warm-started from its own fit at the
    previous C; it stops once the summed loss rises (it is unimodal in C in
    practice, and the largest C costs the most iterations). The refit starts
    from the mean of the fold models at the chosen C. With fewer than 2
    examples of some class per inner fold there is nothing to validate on,
    and C = 1.0 (sklearn's default) is used.
    """
    grid = sorted(float(c) for c in Cs)
    inner_tol = INNER_TOL_FACTOR * tol
    n_splits = min(int(inner_cv), int(np.bincount(y).min()))
    best_C, start = (grid[0] if len(grid) == 1 else 1.0), None
    if len(grid) > 1 and n_splits >= 2:
        splitter = StratifiedKFold(n_splits, shuffle=True, random_state=random_state)
        folds: list[tuple[Any, np.ndarray, Any, np.ndarray]]
        if isinstance(Z, StandardizedRows):  # folds are index arrays into the same rows, no copies
            folds = [(Z.take(tr), y[tr], Z.take(va), y[va]) for tr, va in splitter.split(np.zeros(len(y)), y)]
        else:
            Z32 = Z.astype(np.float32)  # see fit_logistic: products in float32
            folds = [(Z32[tr], y[tr], Z[va], y[va]) for tr, va in splitter.split(Z, y)]
        fold_params: list[Any] = [None] * n_splits  # each fold's fit at the previous C
        best_loss = np.inf
        for C in grid:
            loss = 0.0
            for f, (Z_tr, y_tr, Z_va, y_va) in enumerate(folds):
                fold_params[f], _ = fit_logistic(Z_tr, y_tr, n_classes, C, start=fold_params[f],
                                                 max_iter=max_iter, tol=inner_tol)
                loss += _log_loss(Z_va, y_va, fold_params[f])
            if loss >= best_loss:
                break
            best_C, best_loss, start = C, loss, np.mean(fold_params, axis=0)
    params, n_iter = fit_logistic(Z, y, n_classes, best_C, start=start, max_iter=max_iter, tol=tol)
    return best_C, params, n_iter


def softmax_decision(decision: np.ndarray) -> np.ndarray:
    """Class probabilities from decision scores [n, 1] (binary) or [n, K].

    A single column ``z`` is read as the score of the second class against
    the first, so the result is ``[1 - sigmoid(z), sigmoid(z)]``, which is
    exactly logistic regression's binary ``predict_proba``.
    """
    z = np.asarray(decision, dtype=np.float64)
    if z.shape[1] == 1:
        z = np.hstack([np.zeros_like(z), z])
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)

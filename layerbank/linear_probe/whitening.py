"""The streamed logistic fit's variables, whitened: same objective, far fewer L-BFGS steps.

Why: a token probe's features are strongly correlated (``concat_last_4`` stacks four
adjacent layers of one residual stream), and L-BFGS on correlated features crawls: on
the full CoNLL-2003 training set (203,621 words x 1,536, float16) the tagger took 229
steps (193 s) and stopped by its tolerance at objective 0.060501. Fitted in whitened
coordinates it took 46 steps (46 s, 8 s of them for this basis) and reached 0.059419,
lower; the word-type control head 71 steps (68 s) instead of 473 (419 s), also to a lower
objective (docs/token-features.md, "the fits run whitened").

How: with the kept dimensions' covariance of the standardised rows ``S = R diag(e) R^T``,
the fit's variables are ``u`` and the weights ``coef = u M`` with ``M = diag(e)^-1/2 R^T``.
That is only a change of variables (``M`` is invertible), so the optimum is the same:
the products still read the rows once per step (``x coef^T = x M^T u^T``), and the L2
penalty ``||coef||^2 = sum_j ||u_j||^2 / e_j`` is exact because ``R`` is orthonormal.
Eigenvalues are floored at ``EIGEN_FLOOR`` times the largest, so a direction the rows
barely span does not become a stiff one; any floor keeps the change of variables
invertible. Dimensions the standardisation dropped (``inv_scale`` 0) stay out of it and
keep weight exactly 0.

Cost: one Gram pass over the rows (float32 products, chunk by chunk, like a loss
evaluation but d wide instead of K) and one eigendecomposition of a d x d matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from layerbank.linear_probe.standardize import StandardizedRows

__all__ = ["EIGEN_FLOOR", "Whitening", "whitening_of"]

# Smallest eigenvalue kept, relative to the largest (see the module docstring).
EIGEN_FLOOR = 1e-3


@dataclass(frozen=True)
class Whitening:
    """``coef[:, keep] = u @ M``; ``inv_eigen`` weighs ``u``'s columns in the L2 penalty."""

    keep: np.ndarray  # bool [d]: the dimensions the standardisation kept
    M: np.ndarray  # [d_kept, d_kept]: diag(e)^-1/2 R^T
    eigen: np.ndarray  # [d_kept]: e, floored

    @property
    def inv_eigen(self) -> np.ndarray:
        return 1.0 / self.eigen

    def to_u(self, coef: np.ndarray) -> np.ndarray:
        """The variables of weights ``coef`` [rows, d] (a warm start): ``coef[:, keep] M^-1``,
        where ``M^-1 = R diag(e)^1/2 = M^T diag(e)``."""
        return (coef[:, self.keep] @ self.M.T) * self.eigen

    def to_coef(self, u: np.ndarray) -> np.ndarray:
        """The weights [rows, d] of variables ``u`` [rows, d_kept]; 0 on dropped dimensions."""
        coef = np.zeros((u.shape[0], self.keep.shape[0]))
        coef[:, self.keep] = u @ self.M
        return coef


def whitening_of(Z: StandardizedRows) -> Whitening:
    """The whitening of the rows ``Z``: one Gram pass over them, one eigendecomposition."""
    keep = Z.inv_scale != 0
    every = bool(keep.all())
    dk = int(keep.sum())
    gram = np.zeros((dk, dk))
    colsum = np.zeros(dk)
    for _, chunk in Z.chunks():
        part = chunk if every else chunk[:, keep]
        gram += part.T @ part  # in the chunk's dtype (float32): a preconditioner need not be exact
        colsum += part.sum(axis=0, dtype=np.float64)
    mean = colsum / Z.shape[0]
    # covariance of the raw rows, then of the standardised ones: diag(1/s) C diag(1/s)
    inv = Z.inv_scale[keep]
    cov = (gram / Z.shape[0] - np.outer(mean, mean)) * inv[:, None] * inv[None, :]
    eigen, R = np.linalg.eigh(cov)
    eigen = np.maximum(eigen, EIGEN_FLOOR * max(float(eigen.max()), np.finfo(float).tiny))
    return Whitening(keep, (R / np.sqrt(eigen)).T, eigen)

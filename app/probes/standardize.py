"""Standardize features, ignoring dimensions that carry only rounding noise.

Why: some encoders have dimensions that are constant up to storage rounding
(all-MiniLM-L6-v2's last layer has LayerNorm weights near 1e-9 and 1e-32 in
three dimensions). Stored as float16, such a dimension is one value or two
adjacent float16 values at random. Plain standardisation divides by that
tiny spread and turns the rounding noise into a unit-variance feature the
probe then fits (it cost 0.7 entity-F1 points on ``layer:-1`` of CoNLL-2003).

Rule: a dimension whose standard deviation over the fitting rows is below
one step of the storage dtype at its mean (``np.spacing``) is dropped; the
count is reported as ``n_dropped``. With float32 storage that is a much
smaller step, so almost nothing is dropped; int8 storage uses float16's step
(its own step is a per-row scale the features no longer carry).

Memory (token probes on a whole corpus, where X is hundreds of MB): a large
X is not copied to float64 whole to fit (mean and spread are accumulated in
float64 over row chunks, two passes), and ``transform`` makes one copy,
standardised in place, in ``dtype`` (float64 by default; the token probe
asks for float32: its X is float32 already, and a float64 copy doubled the
peak).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin

__all__ = ["NoiseAwareScaler", "Standardizer"]


# Rows per chunk when a large X is fitted without a float64 copy of it.
FIT_CHUNK_ROWS = 16384


def _mean_std(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Column mean and (population) standard deviation in float64."""
    if X.shape[0] <= FIT_CHUNK_ROWS:
        X64 = np.asarray(X, dtype=np.float64)
        return X64.mean(axis=0), X64.std(axis=0)
    # two passes over float64 chunks: the same formula, no full float64 copy
    total = np.zeros(X.shape[1])
    for a in range(0, X.shape[0], FIT_CHUNK_ROWS):
        total += np.asarray(X[a : a + FIT_CHUNK_ROWS], dtype=np.float64).sum(axis=0)
    mean = total / X.shape[0]
    sq = np.zeros(X.shape[1])
    for a in range(0, X.shape[0], FIT_CHUNK_ROWS):
        d = np.asarray(X[a : a + FIT_CHUNK_ROWS], dtype=np.float64) - mean
        sq += np.einsum("ij,ij->j", d, d)
    return mean, np.sqrt(sq / X.shape[0])


class Standardizer:
    """``fit(X)`` learns mean, scale and which dimensions to keep; ``transform``
    returns ``(X[:, keep] - mean) / scale`` in ``dtype`` (float64 by default).

    >>> s = Standardizer(np.float16).fit(X_train)
    >>> Z = s.transform(X_test); s.n_dropped
    """

    def __init__(self, storage_dtype: Any = np.float16, dtype: Any = np.float64) -> None:
        self.storage_dtype = np.dtype(storage_dtype)
        if self.storage_dtype == np.int8:
            # int8 rows are read back as float32 (cache/int8.py), and their rounding step is
            # each row's own scale, which the features do not carry: float16's step stands in
            self.storage_dtype = np.dtype(np.float16)
        self.dtype = np.dtype(dtype)

    def fit(self, X: np.ndarray) -> Standardizer:
        X = np.asarray(X)
        mean, std = _mean_std(X)
        step = np.spacing(np.abs(mean).astype(self.storage_dtype)).astype(np.float64)
        keep = std >= step
        if not keep.any():  # nothing above the noise: keep all rather than fit on no features
            keep[:] = True
        self.keep_ = keep
        self.mean_ = mean[keep]
        self.scale_ = np.where(std[keep] > 0, std[keep], 1.0)
        self.n_dropped = int((~keep).sum())
        return self

    def transform(self, X: np.ndarray) -> np.ndarray:
        # one copy (the column selection), then in place: the same arithmetic as
        # (X[:, keep] - mean) / scale without its three temporaries
        out = np.asarray(X)[:, self.keep_].astype(self.dtype, copy=False)
        out -= self.mean_.astype(self.dtype, copy=False)
        out /= self.scale_.astype(self.dtype, copy=False)
        return out


    def transform_in_place(self, X: np.ndarray) -> np.ndarray:
        """Standardise ``X`` (of ``dtype``, C-contiguous) in its own memory; returns it.

        Dropped dimensions are set to 0 instead of removed: under L2 a zero
        column gets zero weight, so a logistic fit is the same as without it,
        and no copy of a corpus-sized matrix is made.
        """
        if X.dtype != self.dtype or not X.flags.c_contiguous:
            raise ValueError(f"transform_in_place needs a C-contiguous {self.dtype} array, got {X.dtype}")
        mean = np.zeros(self.keep_.shape[0], dtype=self.dtype)
        scale = np.full(self.keep_.shape[0], np.inf, dtype=self.dtype)  # x / inf = 0: a dropped dimension
        mean[self.keep_], scale[self.keep_] = self.mean_, self.scale_
        X -= mean
        X /= scale
        return X


class NoiseAwareScaler(TransformerMixin, BaseEstimator):
    """``StandardScaler`` for stored features, as a scikit-learn step: dimensions
    below the storage dtype's resolution (see ``Standardizer``) are dropped.

    >>> make_pipeline(NoiseAwareScaler("float16"), LogisticRegression())
    """

    def __init__(self, storage_dtype: Any = "float16", dtype: Any = "float64") -> None:
        self.storage_dtype = storage_dtype
        self.dtype = dtype

    def fit(self, X: np.ndarray, y: Any = None) -> NoiseAwareScaler:
        self.standardizer_ = Standardizer(self.storage_dtype, self.dtype).fit(X)
        self.n_dropped_ = self.standardizer_.n_dropped
        self.n_features_in_ = np.asarray(X).shape[1]
        return self

    def transform(self, X: np.ndarray) -> np.ndarray:
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(self, "standardizer_")
        return self.standardizer_.transform(X)

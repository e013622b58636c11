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

Without any copy (``StandardizedRows``, the token probe's path on a whole
corpus): the standardisation is folded into the weights instead of the
features. A linear model's ``((x - mean) / scale) . w`` equals
``x . (w / scale) - mean . (w / scale)``, so a fit can read the stored rows
as they are (float16 for a wide view: ``concat_last_4`` of the full
CoNLL-2003 training set is 0.63 GB in float16, 1.25 GB as a float32 copy,
2.5 GB in float64), a chunk at a time, and a subset of rows (an MDL block,
an inner-CV fold) is an index array, not a gathered copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin

__all__ = ["NoiseAwareScaler", "StandardizedRows", "Standardizer"]


# Rows per chunk when a large X is fitted without a float64 copy of it (fewer for wide rows:
# a chunk is at most about 32 MB in float64).
FIT_CHUNK_ROWS = 16384
FIT_CHUNK_VALUES = 2**22


def _mean_std(X: np.ndarray, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Column mean and (population) standard deviation in float64 of ``X`` (of ``X[rows]``)."""
    n = X.shape[0] if rows is None else len(rows)
    step = max(1, min(FIT_CHUNK_ROWS, FIT_CHUNK_VALUES // max(1, X.shape[1])))
    if n <= step:
        X64 = np.asarray(X if rows is None else X[rows], dtype=np.float64)
        return X64.mean(axis=0), X64.std(axis=0)

    def chunk(a: int) -> np.ndarray:
        part = X[a : a + step] if rows is None else X[rows[a : a + step]]
        return np.asarray(part, dtype=np.float64)

    # two passes over float64 chunks: the same formula, no full float64 copy
    total = np.zeros(X.shape[1])
    for a in range(0, n, step):
        total += chunk(a).sum(axis=0)
    mean = total / n
    sq = np.zeros(X.shape[1])
    for a in range(0, n, step):
        d = chunk(a) - mean
        sq += np.einsum("ij,ij->j", d, d)
    return mean, np.sqrt(sq / n)


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

    def fit(self, X: np.ndarray, rows: np.ndarray | None = None) -> Standardizer:
        """Learn from ``X`` (from ``X[rows]`` when given: read by chunks, never gathered whole)."""
        X = np.asarray(X)
        mean, std = _mean_std(X, rows)
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

    def full(self, dtype: Any = np.float64) -> tuple[np.ndarray, np.ndarray]:
        """Mean and scale over every dimension, a dropped one at mean 0 and scale inf, so
        ``(x - mean) / scale`` is 0 there and it weighs nothing in a linear model."""
        mean = np.zeros(self.keep_.shape[0], dtype=dtype)
        scale = np.full(self.keep_.shape[0], np.inf, dtype=dtype)
        mean[self.keep_], scale[self.keep_] = self.mean_, self.scale_
        return mean, scale

    def transform_in_place(self, X: np.ndarray) -> np.ndarray:
        """Standardise ``X`` (of ``dtype``, C-contiguous) in its own memory; returns it.

        Dropped dimensions are set to 0 instead of removed: under L2 a zero
        column gets zero weight, so a logistic fit is the same as without it,
        and no copy of a corpus-sized matrix is made.
        """
        if X.dtype != self.dtype or not X.flags.c_contiguous:
            raise ValueError(f"transform_in_place needs a C-contiguous {self.dtype} array, got {X.dtype}")
        mean, scale = self.full(self.dtype)
        X -= mean
        X /= scale
        return X

    def rows(self, X: np.ndarray, rows: np.ndarray | None = None, dtype: Any = None) -> StandardizedRows:
        """``X`` (or ``X[rows]``) standardised by this fit without a copy (``StandardizedRows``);
        the products are computed in ``dtype`` (default: this standardizer's)."""
        full_mean = np.zeros(self.keep_.shape[0])
        inv_scale = np.zeros(self.keep_.shape[0])  # 0: a dropped dimension gets no weight
        full_mean[self.keep_], inv_scale[self.keep_] = self.mean_, 1.0 / self.scale_
        return StandardizedRows(X, rows, full_mean, inv_scale, self.dtype if dtype is None else dtype)


# Bytes of one chunk of rows in the products' dtype: fits in a core's L2 cache with room to spare,
# so a chunk cast from float16 is read from memory once and multiplied twice (logits, gradient).
CHUNK_BYTES = 2 * 2**20


def _fast_half(stored: np.dtype, dtype: np.dtype) -> bool:
    return stored == np.float16 and dtype == np.float32


# 2**112: a float16's magnitude bits shifted into float32's place read as the value times 2**-112
_HALF_SCALE = np.float32(2.0**112)


def _half_to_single(half: np.ndarray, out: np.ndarray, signs: np.ndarray) -> bool:
    """``out[...] = half`` (float16 to float32, exact) by integer operations; False, with ``out``
    unspecified, where ``half`` holds an infinity or NaN (the caller then casts with numpy).

    Why: numpy casts float16 one value at a time here (1.4 ns a value on this project's
    machine, measured), and a fit over ``concat_last_4`` in float16 casts every row at every
    L-BFGS step: 307M values, most of the step's time. Seven vectorised integer passes over a
    chunk already in cache take 0.55 ns a value, and give the same bits for every finite
    float16 (the test checks all 63,488 of them)."""
    bits = out.view(np.uint32)
    np.copyto(bits, half.view(np.uint16))
    np.bitwise_and(bits, 0x8000, out=signs)
    np.left_shift(signs, 16, out=signs)
    np.bitwise_and(bits, 0x7FFF, out=bits)
    if bits.size and int(bits.max()) >= 0x7C00:  # exponent all ones: inf or NaN
        return False
    np.left_shift(bits, 13, out=bits)
    np.multiply(out, _HALF_SCALE, out=out)  # subnormal halves become float32 normals, exactly
    np.bitwise_or(bits, signs, out=bits)
    return True


class StandardizedRows:
    """``(X[rows] - mean) * inv_scale`` as a linear model reads it, never built.

    ``X`` [n, d] stays as it is (float16, float32 or float64, never copied); ``rows`` (None:
    all of them) picks and orders the rows; ``inv_scale`` 0 drops a dimension. A fit asks for
    ``decision(coef, intercept)`` and ``chunks()``; the products run on chunks of about
    ``CHUNK_BYTES`` cast to ``dtype`` (float32 halves the time of float64 on real features;
    layerbank.linear_probe.logistic folds mean and scale into the weights).

    >>> Z = Standardizer("float16", "float32").fit(X).rows(X)
    >>> scores = Z.decision(coef, intercept)       # == standardised(X) @ coef.T + intercept
    """

    def __init__(self, X: np.ndarray, rows: np.ndarray | None, mean: np.ndarray, inv_scale: np.ndarray,
                 dtype: Any = np.float32) -> None:
        if X.ndim != 2:
            raise ValueError(f"X must be [n, d], got shape {list(X.shape)}")
        self.X, self.rows = X, (None if rows is None else np.asarray(rows, dtype=np.int64))
        self.mean = np.asarray(mean, dtype=np.float64)
        self.inv_scale = np.asarray(inv_scale, dtype=np.float64)
        self.dtype = np.dtype(dtype)
        self.shape = (X.shape[0] if self.rows is None else len(self.rows), X.shape[1])
        self.chunk_rows = max(1, CHUNK_BYTES // (self.shape[1] * self.dtype.itemsize))
        # what a fit derives from these rows once (layerbank.linear_probe.whitening's basis), shared
        # with their subsets (``take``: inner-CV folds), whose rows it describes as well
        self.derived: dict[str, Any] = {}

    def __len__(self) -> int:
        return self.shape[0]

    def take(self, idx: np.ndarray) -> StandardizedRows:
        """The rows ``idx`` of these rows (an inner-CV fold), standardised the same way."""
        idx = np.asarray(idx, dtype=np.int64)
        sub = StandardizedRows(self.X, idx if self.rows is None else self.rows[idx], self.mean,
                               self.inv_scale, self.dtype)
        sub.derived = self.derived
        return sub

    def chunks(self) -> Iterator[tuple[int, np.ndarray]]:
        """``(start, raw rows)``: consecutive chunks of the rows, NOT standardised, in ``dtype``.

        A chunk may be a view of ``X`` or a buffer reused for the next chunk: use it before
        asking for the next."""
        n, step = self.shape[0], self.chunk_rows
        buf: np.ndarray | None = None
        signs: np.ndarray | None = None
        for a in range(0, n, step):
            part = self.X[a : a + step] if self.rows is None else self.X[self.rows[a : a + step]]
            if part.dtype == self.dtype:
                yield a, part
                continue
            if buf is None:
                buf = np.empty((min(step, n), self.shape[1]), dtype=self.dtype)
                signs = np.empty(buf.shape, dtype=np.uint32) if _fast_half(part.dtype, self.dtype) else None
            out = buf[: part.shape[0]]
            if signs is None or not _half_to_single(part, out, signs[: part.shape[0]]):
                np.copyto(out, part)
            yield a, out

    def folded(self, coef: np.ndarray, intercept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Weights and intercepts that score the raw rows as ``coef`` scores standardised ones."""
        v = np.asarray(coef, dtype=np.float64) * self.inv_scale
        return v, np.asarray(intercept, dtype=np.float64) - v @ self.mean

    def decision(self, coef: np.ndarray, intercept: np.ndarray) -> np.ndarray:
        """Scores [n, rows of coef] in float64: standardised rows times ``coef.T`` plus ``intercept``."""
        v, b = self.folded(coef, intercept)
        vt = np.ascontiguousarray(v.T, dtype=self.dtype)
        out = np.empty((self.shape[0], v.shape[0]))
        for a, chunk in self.chunks():
            out[a : a + chunk.shape[0]] = chunk @ vt
        out += b
        return out


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

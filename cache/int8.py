"""The ``int8`` storage dtype: symmetric quantisation with one float32 scale per row per
hidden state, dequantised on read so every view, probe and route sees float32 as usual.

For a row ``x`` of one hidden state (``d`` numbers), ``scale = max|x| / 127`` and
``q = round(x / scale)`` in ``[-127, 127]``; the reader returns ``q * scale``. Each value
is then within ``scale / 2 = max|x| / 254`` of the float32 result (docs/storage.md).

One scale per row *per hidden state* rather than per row: hidden states differ in
magnitude (all-MiniLM-L6-v2's last, normalised, state peaks near 0.6 where the others
reach 2-10), and one scale for all of them cost the last state 5.7x the error
(median relative L2 error 4.1% against 0.72% on SST-2 sentences, mean pooling), for
4 bytes a state saved.

Not for every feature: where a hidden state is nearly the same vector for every text
(all-MiniLM-L6-v2's ``cls`` of its inner layers), the rounding noise is as large as the
differences between texts and a probe loses 8-20 points (docs/storage.md, "int8").

Example::

    rows = quantize(pooled)            # [n, H, d] float32 -> Int8Rows(q [n, H, d], scale [n, H])
    np.abs(dequantize(rows.q, rows.scale) - pooled).max() <= np.abs(pooled).max() / 254
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Int8Rows", "concat", "dequantize", "quantize", "scale_name"]

LEVELS = 127  # symmetric: -127..127 (-128 unused, so that -x is as exact as x)


@dataclass
class Int8Rows:
    """Quantised rows as stored: ``q`` int8 ``[..., d]``, ``scale`` float32 ``[...]``."""

    q: np.ndarray
    scale: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.q.shape)

    def __len__(self) -> int:
        return int(self.q.shape[0])


def quantize(x: np.ndarray) -> Int8Rows:
    """Quantise over the last axis (one scale per vector). ValueError on non-finite values,
    which no scale can hold."""
    x = np.asarray(x, dtype=np.float32)
    peak = np.abs(x).max(axis=-1) if x.shape[-1] else np.zeros(x.shape[:-1], np.float32)
    if not np.isfinite(peak).all():
        raise ValueError("non-finite values cannot be stored as int8")
    scale = (peak / LEVELS).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))  # an all-zero vector stays zeros
    q = np.clip(np.rint(x / safe[..., None]), -LEVELS, LEVELS).astype(np.int8)
    return Int8Rows(q, scale)


def dequantize(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """float32 ``q * scale`` (``scale`` broadcast over the last axis)."""
    return np.multiply(q, np.asarray(scale, dtype=np.float32)[..., None], dtype=np.float32)


def concat(parts: Sequence[Int8Rows]) -> Int8Rows:
    """Rows of several blocks as one, bit for bit (compaction)."""
    return Int8Rows(np.concatenate([p.q for p in parts]), np.concatenate([p.scale for p in parts]))


def scale_name(dataset: str) -> str:
    """Where a quantised dataset's scales live: ``pooled/mean`` -> ``pooled/mean_scale``,
    ``tokens/layer_3`` -> ``tokens/scale_3`` (not ``layer_*``, which counts hidden states)."""
    group, slash, name = dataset.rpartition("/")
    if name.startswith("layer_"):
        return f"{group}{slash}scale_{name[len('layer_'):]}"
    return f"{dataset}_scale"

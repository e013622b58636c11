"""The ``int8`` storage dtype: symmetric quantisation with one float32 scale per row per
hidden state, dequantised on read so every view, probe and route sees float32 as usual.

Two encodings, both decoded by :func:`dequantize`:

- **per row** (``quantize(x)``): for a row ``x`` of one hidden state (``d`` numbers),
  ``scale = max|x| / 127``, ``q = round(x / scale)`` in ``[-127, 127]``; the reader
  returns ``q * scale``. Each value is within ``max|x| / 254`` of the float32 result.
  Self-contained per row: what token states and int8 shards written before centres hold.
- **centred** (``quantize(x, centred=True)``, for a block of rows: one shard's pooled
  rows): the same, applied to ``x - c``, where ``c`` is the block's per-dimension mean
  of that hidden state, stored once per block in float16 (``centres [G, H, d]`` and,
  per row, ``centre_of`` naming its block). Each value is within ``max|x - c| / 254``.

Why centred: BERT-family states carry a few huge dimensions in every text ("massive
activations": all-MiniLM-L6-v2's dimension 99 reaches 8-10 in ``cls`` of every layer,
against a median entry of 0.02-0.04), so a per-row scale is coarse for the other 383;
and ``cls`` of the inner layers is nearly the same vector for every text (what tells
texts apart varies by 0.0005-0.012 per dimension). Rounding to a step of 10 / 127 buries
that, and a probe lost 7-43 points there. Around the block's centre the largest entry is
the largest *difference* between texts (about 0.004 in ``cls`` of ``h_1``), so the step
falls 2,000-fold there; measured, the largest change in probe accuracy against float32
over every layer, mean and cls, fell from 20.4 points to 0.33 on SST-2 (float16's own:
0.27) and from 43.4 to 0.13 on AG News (docs/storage.md, "int8", with the alternatives measured: outlier dimensions kept
in float16 beside the codes, per-dimension scales).

One scale per row *per hidden state* rather than per row: hidden states differ in
magnitude (the last, normalised, state peaks near 0.6 where the others reach 2-10);
one scale for all of them cost the last state 5.7x the error, for 4 bytes a state saved.

Compaction concatenates blocks: the centres tables are stacked and ``centre_of``
renumbered, so every row decodes to the same float32 numbers, bit for bit.

Example::

    rows = quantize(pooled, centred=True)   # [n, H, d] float32 -> q [n, H, d], scale [n, H],
                                            # centres [1, H, d] float16, centre_of [n]
    err = np.abs(rows.values() - pooled)    # <= max over d of |pooled - centre| / 254, per row
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Int8Rows", "centre_names", "concat", "dequantize", "quantize", "scale_name"]

LEVELS = 127  # symmetric: -127..127 (-128 unused, so that -x is as exact as x)


@dataclass
class Int8Rows:
    """Quantised rows as stored: ``q`` int8 ``[n, ..., d]``, ``scale`` float32 ``[n, ...]``;
    centred rows also ``centres`` ``[G, ..., d]`` (float16, float32 where float16 would
    overflow) and ``centre_of`` int32 ``[n]`` (which centre each row was coded around)."""

    q: np.ndarray
    scale: np.ndarray
    centres: np.ndarray | None = None
    centre_of: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.q.shape)

    def __len__(self) -> int:
        return int(self.q.shape[0])

    def values(self) -> np.ndarray:
        """The float32 rows a reader sees."""
        return dequantize(self.q, self.scale, self.centres, self.centre_of)


def _codes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    peak = np.abs(x).max(axis=-1) if x.shape[-1] else np.zeros(x.shape[:-1], np.float32)
    if not np.isfinite(peak).all():
        raise ValueError("non-finite values cannot be stored as int8")
    scale = (peak / LEVELS).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))  # an all-zero vector stays zeros
    q = np.clip(np.rint(x / safe[..., None]), -LEVELS, LEVELS).astype(np.int8)
    return q, scale


def quantize(x: np.ndarray, centred: bool = False) -> Int8Rows:
    """Quantise over the last axis (one scale per vector); ``centred``: around the rows'
    per-dimension mean (over axis 0), stored once. ValueError on non-finite values, which
    no scale can hold."""
    x = np.asarray(x, dtype=np.float32)
    if not centred or x.shape[0] == 0:
        return Int8Rows(*_codes(x))
    if not np.isfinite(x).all():
        raise ValueError("non-finite values cannot be stored as int8")
    mean = x.mean(axis=0, dtype=np.float64)
    with np.errstate(over="ignore"):
        centre = mean.astype(np.float16)
    if not np.isfinite(centre).all():  # past float16's range: the centre in float32 instead
        centre = mean.astype(np.float32)
    # around the centre as stored, so the only error left is the rounding of the codes
    q, scale = _codes(x - centre.astype(np.float32))
    return Int8Rows(q, scale, centre[None], np.zeros(x.shape[0], np.int32))


def dequantize(q: np.ndarray, scale: np.ndarray, centres: np.ndarray | None = None,
               centre_of: np.ndarray | None = None) -> np.ndarray:
    """float32 ``q * scale`` (``scale`` broadcast over the last axis), plus each row's
    centre ``centres[centre_of]`` for centred rows."""
    out = np.multiply(q, np.asarray(scale, dtype=np.float32)[..., None], dtype=np.float32)
    if centres is not None:
        if centre_of is None:
            raise ValueError("centred int8 rows need centre_of, the centre of each row")
        out += np.asarray(centres, dtype=np.float32)[np.asarray(centre_of, dtype=np.intp)]
    return out


def concat(parts: Sequence[Int8Rows]) -> Int8Rows:
    """Rows of several blocks as one, bit for bit (compaction): centres tables stacked,
    ``centre_of`` renumbered; per-row blocks, if mixed with centred ones, get an all-zero
    centre (adding 0 changes no value)."""
    q = np.concatenate([p.q for p in parts])
    scale = np.concatenate([p.scale for p in parts])
    if all(p.centres is None for p in parts):
        return Int8Rows(q, scale)
    row_shape = parts[0].q.shape[1:]
    wide = any(p.centres is not None and p.centres.dtype == np.float32 for p in parts)
    dtype = np.float32 if wide else np.float16
    tables, which, base = [], [], 0
    for p in parts:
        if p.centres is None or p.centre_of is None:
            table, of = np.zeros((1, *row_shape), dtype), np.zeros(len(p), np.int32)
        else:
            table, of = p.centres.astype(dtype), np.asarray(p.centre_of, np.int32)
        tables.append(table)
        which.append(of + base)
        base += table.shape[0]
    return Int8Rows(q, scale, np.concatenate(tables), np.concatenate(which).astype(np.int32))


def scale_name(dataset: str) -> str:
    """Where a quantised dataset's scales live: ``pooled/mean`` -> ``pooled/mean_scale``,
    ``tokens/layer_3`` -> ``tokens/scale_3`` (not ``layer_*``, which counts hidden states)."""
    group, slash, name = dataset.rpartition("/")
    if name.startswith("layer_"):
        return f"{group}{slash}scale_{name[len('layer_'):]}"
    return f"{dataset}_scale"


def centre_names(dataset: str) -> tuple[str, str]:
    """Where a centred dataset's centres table and per-row centre index live:
    ``pooled/mean`` -> ``pooled/mean_centres``, ``pooled/mean_centre_of``."""
    return f"{dataset}_centres", f"{dataset}_centre_of"

"""Determinism, as docs/reliability.md states it:

- the same texts in the same batch give bit-identical stored rows (a re-run of a
  job part, a recompute after quarantine of a one-request shard);
- the same text in another batch (other texts, other padding) gives rows within
  the documented tolerance |a - b| <= 1e-5 + 1e-3 * |b| for float16 storage
  (CPU matrix kernels block differently for other shapes: float32 results differ
  at ~1e-6, and rounding to float16 can then flip the last bit).
  Measured on all-MiniLM-L6-v2 (64 SST-2 texts x 4 batchings, every pooling):
  at most 3.3e-6 apart in float32 and 0.00097 * |b| in float16.
"""

from __future__ import annotations

import numpy as np

RTOL, ATOL = 1e-3, 1e-5  # docs/reliability.md, "Deterministic numbers"

TEXTS = ["a short one", "the film is a gentle, funny look at growing up in a small town",
         "no.", "every layer of the encoder is kept, so probes can pick the one that works best",
         "it 's a masterpiece of sorts", "dull"]
OTHERS = ["filler text of another length entirely, to change the padding of the batch " * 3,
          "x", "two words", "a medium length sentence that pads the others"]


def _stored(enc, texts: list[str]) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    out = enc.encode(enc.tokenize(texts))
    return {k: v.astype(np.float16) for k, v in out.pooled.items()}  # as a float16 shard stores them


def test_the_same_batch_gives_bit_identical_rows(tiny_encoder) -> None:  # type: ignore[no-untyped-def]
    a, b = _stored(tiny_encoder, TEXTS), _stored(tiny_encoder, TEXTS)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_another_batch_stays_within_the_documented_tolerance(tiny_encoder) -> None:  # type: ignore[no-untyped-def]
    alone = {t: _stored(tiny_encoder, [t]) for t in TEXTS}
    batches = [OTHERS[:1] + TEXTS, TEXTS[::-1] + OTHERS, OTHERS[1:3] + TEXTS[2:] + TEXTS[:2]]
    for batch in batches:
        got = _stored(tiny_encoder, batch)
        for t in TEXTS:
            j = batch.index(t)
            for k, rows in got.items():
                a, b = rows[j].astype(np.float32), alone[t][k][0].astype(np.float32)
                np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=f"{t!r} {k}")

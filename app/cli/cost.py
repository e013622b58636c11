"""What an extraction is about to cost, said before it starts when it is large.

A newcomer ran ``probe --task token`` on the full CoNLL-2003 training set:
the data directory grew by 2.0 GB and the command ran for minutes, with no
warning. ``extraction_cost(ex, texts, want_tokens)`` counts what the store
lacks (texts and their tokens, with the model's own tokenizer), the bytes the
token-level states will take on disk (every hidden state, ``[n_tokens, d]``
at the storage dtype, plus ids, character spans and word ids) and the pooled
vectors (HDF5 chunking and checksums add a little to both), and the time
at a rate measured on the spot: one small batch of the missing texts is
encoded and timed (its vectors are thrown away; under a second on this
machine's two cores). ``describe(cost)`` is the line printed to stderr.

Only runs past ``LARGE_TOKENS`` are measured and described: small runs
start at once.

Example::

    cost = extraction_cost(ex, texts, want_tokens=True)
    if cost is not None:
        print(describe(cost), file=sys.stderr)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["LARGE_TOKENS", "Cost", "announce", "describe", "extraction_cost", "memory_line",
           "word_states_bytes"]

LARGE_TOKENS = 50_000  # about 10 s of encoding on 2 busy cores: below it, say nothing
_SAMPLE_TEXTS = 32
# per token besides the states: int32 id, two int32 character offsets, int32 word id
_TOKEN_EXTRA_BYTES = 16
_DTYPE_BYTES = {"float16": 2, "float32": 4, "int8": 1}  # int8 adds a 4-byte scale per d numbers


@dataclass(frozen=True)
class Cost:
    texts: int  # texts the store lacks (distinct)
    tokens: int  # their tokens, special tokens included
    n_hidden_states: int
    hidden_size: int
    storage_dtype: str
    token_bytes: int | None  # on disk for token-level states; None when they are not stored
    pooled_bytes: int  # on disk for the pooled vectors: every hidden state x every stored pooling
    tokens_per_second: float  # measured on ``sample_texts`` of the missing texts
    sample_texts: int

    @property
    def seconds(self) -> float:
        return self.tokens / self.tokens_per_second if self.tokens_per_second > 0 else float("nan")


def word_states_bytes(n_words: int, n_hidden_states: int, hidden_size: int) -> int:
    """Memory of the float32 word states a token probe holds: ``[words, H, d]``."""
    return n_words * n_hidden_states * hidden_size * 4


def extraction_cost(ex: Any, texts: Sequence[str], want_tokens: bool) -> Cost | None:
    """The cost of extracting ``texts`` with LocalExtractor ``ex``, or None when small."""
    enc = ex.encoder
    unique = list(dict.fromkeys(texts))
    keys = [ex.store.key(enc.fingerprint, enc.config, t) for t in unique]
    hits = ex.store.lookup(keys, need_tokens=want_tokens)
    missing = [t for t, k in zip(unique, keys) if k not in hits]
    if not missing:
        return None
    lengths = [min(n, int(enc.config.max_length or 512)) for n in enc.tokenize(missing).lengths]
    tokens = sum(lengths)
    if tokens < LARGE_TOKENS:
        return None
    h, d = int(enc.info["n_hidden_states"]), int(enc.info["hidden_size"])
    dtype = str(enc.config.storage_dtype)
    width = _DTYPE_BYTES.get(dtype, 4)
    token_bytes = tokens * (h * d * width + _TOKEN_EXTRA_BYTES) if want_tokens else None
    pooled_bytes = len(missing) * h * len(getattr(enc, "poolings", ("mean", "cls", "max"))) * d * width
    # time a batch shaped like the run's own (the first texts, as given); encode() pools on the
    # device and returns numpy, so this is the encoder's part of the cost, writing excluded
    sample = enc.tokenize(missing[:_SAMPLE_TEXTS])
    enc.encode(sample)  # the first call pays one-off set-up (threads, allocator); not timed
    started = time.perf_counter()
    enc.encode(sample)
    seconds = time.perf_counter() - started
    rate = sum(sample.lengths) / seconds if seconds > 0 else 0.0
    return Cost(texts=len(missing), tokens=tokens, n_hidden_states=h, hidden_size=d, storage_dtype=dtype,
                token_bytes=token_bytes, pooled_bytes=pooled_bytes, tokens_per_second=rate,
                sample_texts=len(sample.input_ids))


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def _duration(seconds: float) -> str:
    if seconds != seconds:  # nan: no rate
        return "unknown time"
    if seconds < 90:
        return f"~{seconds:.0f} s"
    return f"~{seconds / 60:.0f} min" if seconds < 5400 else f"~{seconds / 3600:.1f} h"


def describe(cost: Cost) -> str:
    """One line for stderr: what will be encoded, stored and how long it should take."""
    parts = [f"about to encode {cost.texts:,} texts ({cost.tokens:,} tokens)"]
    if cost.token_bytes is not None:
        parts.append(f"token states {_size(cost.token_bytes)} on disk ({cost.n_hidden_states} hidden "
                     f"states x {cost.hidden_size} x {cost.storage_dtype} per token), pooled vectors "
                     f"{_size(cost.pooled_bytes)}")
    else:
        parts.append(f"pooled vectors {_size(cost.pooled_bytes)} on disk")
    parts.append(f"{_duration(cost.seconds)} at {cost.tokens_per_second:,.0f} tokens/s (timed on "
                 f"{cost.sample_texts} of these texts)")
    return "cost: " + "; ".join(parts)


def announce(ex: Any, texts: Sequence[str], want_tokens: bool = False) -> Cost | None:
    """Print ``describe`` of a large extraction to stderr before it starts; the cost, or None."""
    import sys

    cost = extraction_cost(ex, texts, want_tokens)
    if cost is not None:
        print(describe(cost), file=sys.stderr, flush=True)
    return cost


def memory_line(info: Any, n_words: int, threshold: int = 256 * 10**6) -> str | None:
    """A token probe's word states in memory, said when over ``threshold`` bytes."""
    need = word_states_bytes(n_words, int(info["n_hidden_states"]), int(info["hidden_size"]))
    if need < threshold:
        return None
    # the probe reads one view at a time (app/probes/word_views.py), never all of them
    one = n_words * int(info["hidden_size"]) * 4
    return (f"memory: {n_words:,} words x {info['n_hidden_states']} hidden states x {info['hidden_size']} "
            f"= {_size(need)} of word states in float32, read one view at a time: {_size(one)} for a "
            f"one-layer view, {_size(one * 2)} for concat_last_4 (float16)")

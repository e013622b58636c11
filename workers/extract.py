"""Extraction: texts in, committed shards out; only cache misses are encoded.

The job's unique texts are cut into fixed **parts** (in order of character
length, so each part is length-homogeneous) before anything is looked up.
Part ``p`` of job ``j`` is always written as shard ``j-p``: a re-run after a
crash skips parts already committed and rewrites the others under the same
names, so nothing is stored twice. A part is at most ``part_size`` texts
and, when token-level states are stored, at most ``TOKEN_PART_BYTES`` of
them by an upper bound of its tokens (``token_bound``): a part's states are
held in memory until its shard is written, so this bounds a token job's
memory whatever its size (2,048 CoNLL sentences held 1 GB of float32 states).

A job of more than one part writes its shards on a thread of their own
(``workers/part_writer.py``): part ``p`` is written and committed while part
``p + 1`` is tokenized and encoded, so a slow disk costs the larger of the two,
not their sum. Commits stay in part order; a failed write fails the job with
its error and commits nothing of that part or after it. At most two parts are
in memory (the one being written, the one being encoded).

Example::

    summary = extract(texts, store, encoder, job_id="cli-1")
    summary.cache_hits, summary.texts_encoded
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from layerbank.cache.int8 import quantize
from layerbank.cache.shard import ShardContents, TokenRows
from layerbank.cache.store import FeatureStore

from .batching import batch_cost_tokens, default_max_tokens, min_padding_batches
from .long_texts import CHARS_PER_TOKEN
from .part_writer import PartWriter

if TYPE_CHECKING:  # torch loads with the encoder, not with this module: a run whose
    # texts are all stored plans and reports without it (app/cli/store_first.py)
    from .encoder import Encoded, Encoder, Tokenized

__all__ = ["TOKEN_PART_BYTES", "ExtractSummary", "Part", "Plan", "Progress", "Stopped", "extract", "plan_parts", "return_freed_heap",
           "token_bound", "token_part_limit"]


class Stopped(Exception):
    """The job was cancelled or lost its lease; committed parts stay valid."""


@dataclass
class Progress:
    done: int
    total: int
    tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def eta_seconds(self) -> float | None:
        if self.done == 0 or self.seconds <= 0:
            return None
        return (self.total - self.done) * self.seconds / self.done

    def as_dict(self) -> dict[str, float | int | None]:
        return {"done": self.done, "total": self.total, "tokens": self.tokens,
                "tokens_per_second": round(self.tokens_per_second, 1),
                "eta_seconds": None if self.eta_seconds is None else round(self.eta_seconds, 1)}


@dataclass
class ExtractSummary:
    texts: int = 0
    unique_texts: int = 0
    cache_hits: int = 0
    texts_encoded: int = 0
    tokens_encoded: int = 0
    truncated: int = 0
    bytes_written: int = 0
    shards_written: int = 0
    seconds: float = 0.0
    keys: list[str] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, int | float]:
        d = asdict(self)
        d.pop("keys")
        return d


@dataclass
class Part:
    """One shard's worth of misses: written as ``{job}-{p:05d}`` whatever runs it."""

    name: str
    keys: list[str]
    texts: list[str]


@dataclass
class Plan:
    """What a job must encode: its parts, and the summary so far (keys, hits
    and the truncated texts among them)."""

    summary: ExtractSummary
    parts: list[Part]
    hits: dict[str, Any]  # key -> catalog entry of the texts already stored


def plan_parts(texts: Sequence[str], store: FeatureStore, encoder: Encoder, *, job_id: str,
               part_size: int, want_tokens: bool) -> Plan:
    """Cut a job's unique texts into parts, and keep the parts that hold misses.

    The cut is made over *all* unique texts (by character length, then key)
    before the lookup, so part ``p`` is the same texts in every attempt of
    the job and on every backend; which of them are misses may shrink between
    attempts, never grow. Parts already committed are kept: callers check
    ``store.is_committed(part.name)`` when they get to a part.
    """
    fp, cfg = encoder.fingerprint, encoder.config
    keys = [store.key(fp, cfg, t) for t in texts]
    first: dict[str, int] = {}
    for i, k in enumerate(keys):
        first.setdefault(k, i)
    uniq = sorted(first, key=lambda k: (len(texts[first[k]]), k))
    summary = ExtractSummary(texts=len(texts), unique_texts=len(uniq), keys=keys)
    # a text stored without one of the poolings this encoder stores (it was stored
    # before that pooling was set) is a miss: encoded again, into a shard that holds them all
    hits = store.lookup(uniq, need_tokens=want_tokens, poolings=encoder.poolings)
    summary.cache_hits = len(hits)
    # truncation among hits counts too: the summary describes the whole input
    summary.truncated = sum(1 for e in hits.values() if e.truncated)
    parts = []
    limit = token_part_limit(encoder) if want_tokens else None
    cuts = _cut(uniq, [texts[first[k]] for k in uniq], part_size, limit,
                int(cfg.max_length or 512))
    for p, (start, stop) in enumerate(cuts):
        misses = [k for k in uniq[start:stop] if k not in hits]
        if misses:
            parts.append(Part(f"{job_id}-{p:05d}", misses, [texts[first[k]] for k in misses]))
    return Plan(summary, parts, hits)


# Token-level states of one part are held in memory until its shard is written;
# a part's bound on them (below) keeps a token job's peak independent of the job's size.
TOKEN_PART_BYTES = 128 * 2**20


def token_part_limit(encoder: Encoder) -> int:
    """Most tokens a part of a token job may hold: ``TOKEN_PART_BYTES`` of stored token states
    (H x d numbers of the storage dtype per token)."""
    info = encoder.info
    per_token = (int(info["n_hidden_states"]) * int(info["hidden_size"])
                 * np.dtype(encoder.config.storage_dtype).itemsize)
    return max(1, TOKEN_PART_BYTES // per_token)


def token_bound(text: str, max_length: int) -> int:
    """An upper bound of the tokens a text becomes, known before tokenizing: every
    word piece covers at least one character, plus the special tokens, and
    truncation stops at ``max_length``."""
    return min(len(text) + 2, max_length)


def _cut(keys: list[str], texts: list[str], part_size: int, token_limit: int | None,
         max_length: int) -> list[tuple[int, int]]:
    """Part boundaries over the sorted unique texts: at most ``part_size`` texts a part
    and, for a token job, at most ``token_limit`` tokens by ``token_bound`` (a part holds
    at least one text). Depends only on the texts, so every attempt cuts the same parts."""
    cuts: list[tuple[int, int]] = []
    start, used = 0, 0
    for i, text in enumerate(texts):
        cost = token_bound(text, max_length) if token_limit is not None else 0
        if i > start and (i - start >= part_size or (token_limit is not None and used + cost > token_limit)):
            cuts.append((start, i))
            start, used = i, 0
        used += cost
    if keys:
        cuts.append((start, len(keys)))
    return cuts


def extract(texts: Sequence[str], store: FeatureStore, encoder: Encoder, *, job_id: str,
            want_tokens: bool = False, part_size: int = 2048, max_tokens: int | None = None,
            progress: Callable[[Progress], None] | None = None,
            should_continue: Callable[[], bool] | None = None) -> ExtractSummary:
    """Encode the texts not yet stored for this encoder and config; commit shards.

    ``max_tokens``: padded tokens per batch; None for the device's default
    (``layerbank.workers.batching.default_max_tokens``: 4,096 on CPU, 16,384 on CUDA).
    """
    t0 = time.perf_counter()
    plan = plan_parts(texts, store, encoder, job_id=job_id, part_size=part_size,
                      want_tokens=want_tokens)
    summary = plan.summary
    todo_total = sum(len(part.keys) for part in plan.parts)
    prog = Progress(0, todo_total, 0, 0.0)
    if progress:
        progress(prog)
    commit = _committer(store, encoder, summary)
    # one part: nothing to overlap, so no thread (an HTTP request's misses are one small part)
    writer = PartWriter(commit) if len(plan.parts) > 1 else None
    with writer if writer is not None else contextlib.nullcontext():
        for part in plan.parts:
            if store.is_committed(part.name):
                # a previous attempt of this job committed this part already
                prog.done += len(part.keys)
                continue
            if should_continue is not None and not should_continue():
                raise Stopped(f"job {job_id} stopped after {prog.done} of {todo_total} texts")
            if writer is not None:
                writer.check()  # the writer failed on the part before: encode no more
            encoded = _encode_part(encoder, part.texts, want_tokens, max_tokens, prog, t0,
                                   progress, should_continue)
            if writer is not None:
                writer.submit((part, encoded))  # written while the next part is encoded
            else:
                commit((part, encoded))
    summary.seconds = time.perf_counter() - t0
    return summary


def _committer(store: FeatureStore, encoder: Encoder,
               summary: ExtractSummary) -> Callable[[tuple[Part, Encoded]], None]:
    """What writes one encoded part as its shard and commits it (``workers/part_writer.py``
    runs it on its own thread); the summary counts a part once it is committed."""

    def commit(item: tuple[Part, Encoded]) -> None:
        part, encoded = item
        contents = ShardContents(part.keys, encoded.n_tokens, encoded.truncated, encoded.pooled,
                                 encoded.tokens)
        summary.bytes_written += store.write(part.name, contents, model=encoder.fingerprint,
                                             config=encoder.config)
        summary.shards_written += 1
        summary.texts_encoded += len(part.keys)
        summary.tokens_encoded += int(encoded.n_tokens.sum())
        summary.truncated += int(encoded.truncated.sum())

    return commit


def _encode_part(encoder: Encoder, texts: list[str], want_tokens: bool, max_tokens: int | None,
                 prog: Progress, t0: float, progress: Callable[[Progress], None] | None,
                 should_continue: Callable[[], bool] | None) -> Encoded:
    """Encode one part in batches of little padding; results in the order of ``texts``.

    Pooled rows stay float32 until the shard writer casts them, so that it
    can refuse values the storage dtype cannot hold (float16 overflow); token
    rows are cast per batch (``_storage_token_rows``), keeping float32 where
    float16 would overflow, for the same refusal.
    """
    from .encoder import Encoded

    tok = _tokenize_in_slices(encoder, texts, want_tokens, should_continue)
    n = len(texts)
    pooled: dict[str, np.ndarray] = {}
    tokens: list[TokenRows | None] = [None] * n
    if max_tokens is None:
        max_tokens = default_max_tokens(encoder.device.type)
    batches = min_padding_batches(tok.lengths, max_tokens,
                                  batch_cost_tokens=batch_cost_tokens(encoder.device.type))
    for batch_idx in batches:
        if should_continue is not None and not should_continue():
            raise Stopped("stopped between batches")
        sub = type(tok)([tok.input_ids[i] for i in batch_idx], [tok.truncated[i] for i in batch_idx],
                        None if tok.offsets is None else [tok.offsets[i] for i in batch_idx],
                        None if tok.word_ids is None else [tok.word_ids[i] for i in batch_idx])
        out = encoder.encode(sub, want_tokens=want_tokens)
        for name, arr in out.pooled.items():
            if name not in pooled:
                pooled[name] = np.empty((n,) + arr.shape[1:], dtype=np.float32)
            pooled[name][batch_idx] = arr
        if out.tokens is not None:
            # in the storage dtype now: the part's token states wait in memory for the
            # shard write, and float32 copies of them were twice what is stored
            for j, i in enumerate(batch_idx):
                tokens[i] = _storage_token_rows(out.tokens[j], encoder.config.storage_dtype)
        if encoder.device.type == "cpu":
            _return_freed_heap()
        prog.done += len(batch_idx)
        prog.tokens += int(out.n_tokens.sum())
        prog.seconds = time.perf_counter() - t0
        if progress:
            progress(prog)
    if encoder.device.type == "cpu":
        return_freed_heap()  # the part's batches are gone: what a worker holds between jobs
    dtype = encoder.config.storage_dtype
    return Encoded({name: _storage_rows(arr, dtype) for name, arr in pooled.items()},
                   np.asarray(tok.lengths, dtype=np.int32), np.asarray(tok.truncated, dtype=bool),
                   [t for t in tokens if t is not None] if want_tokens else None)


# characters tokenized between two looks for waiting requests: 300 heads of 8,000
# characters took 5.2 s in one call at load average 9, 32 of them 0.6 s
TOKENIZE_SLICE_CHARS = 256_000


def _tokenize_in_slices(encoder: Encoder, texts: list[str], want_offsets: bool,
                        should_continue: Callable[[], bool] | None) -> Tokenized:
    """``encoder.tokenize(texts)``, a slice of texts at a time, with ``should_continue``
    (which runs the requests' misses waiting meanwhile) between slices: tokenizing a
    huge request's part is seconds of work that a small miss should not wait behind.

    A text counts for the characters tokenizing it costs (at most what truncation
    keeps, ``workers/long_texts.py``); the result is the same as one call's.
    """
    from .encoder import Tokenized

    limit = int(encoder.config.max_length or 512) * CHARS_PER_TOKEN
    slices: list[tuple[int, int]] = []
    start, size = 0, 0
    for i, text in enumerate(texts):
        if i > start and size >= TOKENIZE_SLICE_CHARS:
            slices.append((start, i))
            start, size = i, 0
        size += min(len(text), limit)
    slices.append((start, len(texts)))
    if len(slices) == 1 or should_continue is None:
        return encoder.tokenize(texts, want_offsets=want_offsets)
    out = Tokenized([], [], [] if want_offsets else None, [] if want_offsets else None)
    for a, b in slices:
        if a and not should_continue():
            raise Stopped("stopped while tokenizing")
        tok = encoder.tokenize(texts[a:b], want_offsets=want_offsets)
        out.input_ids += tok.input_ids
        out.truncated += tok.truncated
        if out.offsets is not None and out.word_ids is not None:
            out.offsets += tok.offsets or []
            out.word_ids += tok.word_ids or []
    return out


def _return_freed_heap() -> None:
    """Give memory freed by the last batches back to the OS (glibc ``malloc_trim``), at most
    once every ``TRIM_INTERVAL_S``.

    Every batch has other tensor shapes, and glibc's heap fragments around
    them: peak RSS over 5,000 texts was 1,053 MiB without this and 893 MiB
    with it. Not after every batch: the next batch faults the returned pages
    back in, and with bf16 on AMX (batches of ~0.2 s) trimming after each cost
    12% of extraction (16,635 against 18,897 tokens/s, medians of 4 alternating
    rounds, 1,000 AG News texts); once a second, 4%.
    """
    global _last_trim
    now = time.monotonic()
    if now - _last_trim < TRIM_INTERVAL_S:
        return
    _last_trim = now
    return_freed_heap()


def return_freed_heap() -> None:
    """glibc's ``malloc_trim(0)`` now (nothing elsewhere): at the end of a part, and for a
    process that goes on without the encoder (``layerbank probe`` fitting after extracting)."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim: Any = None
_last_trim = float("-inf")
TRIM_INTERVAL_S = 1.0
_FLOAT16_OVERFLOW = 65520.0  # the smallest magnitude that rounds to inf in float16


def _storage_token_rows(rows: TokenRows, dtype: str) -> TokenRows:
    """One text's token rows with states cast to the storage dtype (a copy: the
    float32 batch they were cut from is freed); float32 kept where float16 would
    overflow, for the shard writer to refuse."""
    if dtype == "int8":
        return _int8_token_rows(rows)
    states = _storage_rows(np.ascontiguousarray(rows.states), dtype)
    return TokenRows(states, rows.ids, rows.char_spans, rows.word_ids)


def _int8_token_rows(rows: TokenRows) -> TokenRows:
    """Quantised now, one scale per token per hidden state (cache/int8.py), so a part's
    token states wait in memory at a quarter of float32; non-finite ones are kept as
    float32 for the shard writer to refuse."""
    try:
        q = quantize(rows.states)
    except ValueError:
        return TokenRows(np.array(rows.states, dtype=np.float32), rows.ids, rows.char_spans, rows.word_ids)
    return TokenRows(q.q, rows.ids, rows.char_spans, rows.word_ids, q.scale)


def _storage_rows(rows: np.ndarray, dtype: str) -> np.ndarray:
    """float32 rows cast to float16 storage, by torch (vectorised: 3-5x faster
    than numpy's cast, which was a third of the shard write).

    Rows that would overflow are returned as float32, unchanged, so that the
    shard writer refuses them with its own error (layerbank.cache.shard.StorageRangeError).
    """
    import torch

    if dtype != "float16":
        return rows
    src = torch.from_numpy(rows)
    if float(src.abs().amax()) >= _FLOAT16_OVERFLOW:
        return rows
    return src.to(torch.float16).numpy()

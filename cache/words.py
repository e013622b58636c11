"""Words: from stored token-level states to one vector per user word.

A sentence given as pre-split words is stored as the text ``" ".join(words)``
and tokenized like any other text. The tokenizer's own notion of a word (its
pre-tokenizer pieces: BERT splits ``"U.S."`` into ``u . s .``) differs from the
user's, so the stored ``word_ids`` cannot be used for the user's words. Words
are instead matched by character offsets: every token's ``(start, end)`` span
from the fast tokenizer's offset mapping is compared with the spans of the
user's words in the joined text.

Contract::

    join_words(words)                      -> (text, word_spans int32 [n_words, 2])
    align_tokens_to_words(char_spans, word_spans, token_word_ids=None)
                                           -> int64 [n_tokens], word index or -1
    word_vectors(token_states, token_word, n_words, mode="first" | "mean")
                                           -> (float32 [n_words, ..., d], bool [n_words])

A token belongs to the first word its span overlaps; special tokens and other
zero-width spans (``(0, 0)``), and tokens that overlap no word, get ``-1``.

Given the tokenizer's own word ids (``token_word_ids``, stored with every
token row), all the tokens of one tokenizer word go to the user word that
its characters fall in. That matters beyond WordPiece: a SentencePiece
``▁`` or byte-level ``Ġ`` that the tokenizer emits as a token of its own
(before a piece that has no ``▁``-form in the vocabulary) has an offset that
covers the space before the word, or no character at all (``(4, 4)``), or,
for the first word of a text, the word's first character: by characters
alone it would be the first word's first sub-token but no other word's.
With word ids it is every word's first sub-token, as the tokenizer (and
Hugging Face's token-classification recipe, which labels the first token
of each word id) has it. A tokenizer word whose characters fall in several
user words (a tokenizer that does not split on spaces) keeps the
per-character answer for its tokens.
A word that no token belongs to (cut off by truncation) is *not* dropped: it
keeps its row, filled with ``fill`` (0.0 by default), and ``covered[i]`` is
False. A word cut in the middle keeps the sub-tokens that survived.

Example::

    >>> text, spans = join_words(["New", "York"])
    >>> text, spans.tolist()
    ('New York', [[0, 3], [4, 8]])
    >>> align_tokens_to_words(np.array([[0, 0], [0, 3], [4, 8], [0, 0]]), spans).tolist()
    [-1, 0, 1, -1]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["WORD_MODES", "align_tokens_to_words", "join_words", "word_vectors"]

WORD_MODES = ("first", "mean")


def join_words(words: Sequence[str]) -> tuple[str, np.ndarray]:
    """Join words with single spaces; return the text and each word's span.

    ``text[start:end] == words[i]`` for ``(start, end) = word_spans[i]``.
    Offsets count Python characters (code points), as the fast tokenizers'
    offset mappings do. Raises ValueError for a word that is not a string, is
    empty, or contains whitespace: such a word could not be found again in the
    joined text.
    """
    if isinstance(words, str):
        # A bare string would be joined letter by letter: almost surely a bug.
        # ValueError, not TypeError: callers map bad user input to one error kind.
        raise ValueError("words must be a sequence of strings, not one string")  # noqa: TRY004
    spans = np.zeros((len(words), 2), dtype=np.int32)
    pos = 0
    for i, word in enumerate(words):
        if not isinstance(word, str):
            raise ValueError(f"word {i} is {type(word).__name__}, expected a string")  # noqa: TRY004
        if not word:
            raise ValueError(f"word {i} is empty; every word needs at least one character")
        if any(ch.isspace() for ch in word):
            raise ValueError(f"word {i} ({word!r}) contains whitespace; split it into words")
        spans[i] = (pos, pos + len(word))
        pos += len(word) + 1
    return " ".join(words), spans


def _as_spans(spans: np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(spans)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(f"{what} must have shape [n, 2], got {list(arr.shape)}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{what} must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    bad = np.flatnonzero((arr[:, 0] < 0) | (arr[:, 1] < arr[:, 0]))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{what}[{i}] = {arr[i].tolist()}: need 0 <= start <= end")
    return arr


def align_tokens_to_words(char_spans: np.ndarray, word_spans: np.ndarray,
                          token_word_ids: np.ndarray | None = None) -> np.ndarray:
    """Word index of each token (int64 ``[n_tokens]``), -1 where none.

    ``char_spans`` are the tokens' ``(start, end)`` character offsets (end
    exclusive), ``word_spans`` the words' spans from ``join_words`` (or any
    sorted, non-overlapping, non-empty spans into the same text).
    ``token_word_ids``: the tokenizer's word id of each token (-1 for special
    tokens), to keep a tokenizer word's tokens together (module docstring).
    """
    out = _align_by_characters(char_spans, word_spans)
    if token_word_ids is None:
        return out
    wid = np.asarray(token_word_ids)
    if wid.shape != out.shape:
        raise ValueError(f"token_word_ids must have one entry per token ({out.shape[0]}), "
                         f"got shape {list(wid.shape)}")
    wid = wid.astype(np.int64, copy=False)
    has = (wid >= 0) & (out >= 0)
    if not has.any():
        return out
    # per tokenizer word: the lowest and highest user word its characters touch
    n = int(wid.max()) + 1
    lo = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    hi = np.full(n, -1, dtype=np.int64)
    np.minimum.at(lo, wid[has], out[has])
    np.maximum.at(hi, wid[has], out[has])
    one = wid >= 0
    one[one] = (hi[wid[one]] >= 0) & (lo[wid[one]] == hi[wid[one]])
    out[one] = hi[wid[one]]
    return out


def _align_by_characters(char_spans: np.ndarray, word_spans: np.ndarray) -> np.ndarray:
    tokens = _as_spans(char_spans, "char_spans")
    words = _as_spans(word_spans, "word_spans")
    if words.shape[0]:
        if np.any(words[:, 1] == words[:, 0]):
            i = int(np.flatnonzero(words[:, 1] == words[:, 0])[0])
            raise ValueError(f"word_spans[{i}] is empty; words need at least one character")
        if np.any(words[1:, 0] < words[:-1, 1]):
            i = int(np.flatnonzero(words[1:, 0] < words[:-1, 1])[0]) + 1
            raise ValueError(
                f"word_spans must be sorted and not overlap; word_spans[{i}] = "
                f"{words[i].tolist()} starts before word {i - 1} ends"
            )
    out = np.full(tokens.shape[0], -1, dtype=np.int64)
    if not tokens.shape[0] or not words.shape[0]:
        return out
    starts, ends = tokens[:, 0], tokens[:, 1]
    # Words are sorted and disjoint, so word ends are increasing: the first
    # word ending after the token's start is the first one that can overlap it.
    first = np.searchsorted(words[:, 1], starts, side="right")
    ok = (first < words.shape[0]) & (ends > starts)
    cand = np.minimum(first, words.shape[0] - 1)
    ok &= words[cand, 0] < ends
    out[ok] = cand[ok]
    return out


def word_vectors(
    token_states: np.ndarray,
    token_word: np.ndarray,
    n_words: int,
    mode: str = "first",
    *,
    fill: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """One vector per word from its sub-tokens' states.

    ``token_states`` is ``[n_tokens, d]`` (one hidden state) or
    ``[n_tokens, H, d]`` (all of them); ``token_word`` is the output of
    ``align_tokens_to_words``. ``mode="first"`` takes the word's first
    sub-token (in token order), ``mode="mean"`` the mean of its sub-tokens
    (accumulated in float32). Returns ``(vectors, covered)``: vectors of shape
    ``[n_words, *token_states.shape[1:]]`` in float32, and ``covered[i]`` True
    when word i has at least one token. Uncovered rows hold ``fill``.
    """
    if mode not in WORD_MODES:
        raise ValueError(f"unknown word mode {mode!r}; expected one of {', '.join(WORD_MODES)}")
    states = np.asarray(token_states)
    if states.ndim not in (2, 3):
        raise ValueError(f"token_states must be [n_tokens, d] or [n_tokens, H, d], got {list(states.shape)}")
    tw = np.asarray(token_word)
    if tw.ndim != 1 or tw.shape[0] != states.shape[0]:
        raise ValueError(
            f"token_word must have one entry per token ({states.shape[0]}), got shape {list(tw.shape)}"
        )
    if tw.size and not np.issubdtype(tw.dtype, np.integer):
        raise ValueError(f"token_word must be integers, got dtype {tw.dtype}")
    if isinstance(n_words, bool) or not isinstance(n_words, (int, np.integer)) or n_words < 0:
        raise ValueError(f"n_words must be a non-negative integer, got {n_words!r}")
    tw = tw.astype(np.int64, copy=False)
    if tw.size and (tw.min() < -1 or tw.max() >= n_words):
        bad = int(tw[(tw < -1) | (tw >= n_words)][0])
        raise ValueError(f"token_word holds {bad}; expected -1 or a word index in 0..{n_words - 1}")

    out = np.full((int(n_words), *states.shape[1:]), fill, dtype=np.float32)
    covered = np.zeros(int(n_words), dtype=bool)
    real = np.flatnonzero(tw >= 0)
    if not real.size:
        return out, covered
    # Group the real tokens by word; a stable sort keeps token order inside a
    # word, so the first token of each group is the word's first sub-token.
    order = real[np.argsort(tw[real], kind="stable")]
    sorted_words = tw[order]
    starts = np.flatnonzero(np.r_[True, sorted_words[1:] != sorted_words[:-1]])
    present = sorted_words[starts]
    covered[present] = True
    if mode == "first":
        out[present] = states[order[starts]]
    else:
        sums = np.add.reduceat(states[order].astype(np.float32, copy=False), starts, axis=0)
        counts = np.diff(np.r_[starts, order.size]).astype(np.float32)
        out[present] = sums / counts.reshape(-1, *([1] * (states.ndim - 1)))
    return out, covered

"""Word features: one vector per user word, from stored token-level states.

A sentence given as words is stored as the text ``" ".join(words)``
(``sentence_texts``), extracted with token-level states (``want_tokens``).
``word_states`` reads those token rows back and pools them per word:

- ``mode="first"``: the word's first sub-token (what the BERT paper fed its
  NER tagger); ``mode="mean"``: the mean of its sub-tokens.
- Tokens are matched to words by **character spans** (layerbank.cache.words), not by
  the tokenizer's ``word_ids`` alone: the tokenizer's words are its pre-tokenizer's
  pieces (``"U.S."`` is four of them for BERT), not the user's words. The word
  ids keep each tokenizer word's tokens together, so a SentencePiece ``▁`` or
  byte-level ``Ġ`` emitted as a token of its own is its word's first sub-token
  (for every tokenizer kind: WordPiece, byte-level BPE, Unigram).
- A word the encoder never saw (cut off at ``max_length``) keeps its row,
  filled with zeros, and ``covered`` is False for it: reported, not dropped.
  ``uncovered_words`` lists them.

Contract::

    sentence_texts(sentences)                      -> list[str]  (validates all first)
    word_states(store, fingerprint, config, sentences, mode="first", layers=None)
        -> WordFeatures (an layerbank.app.probes.token_probe.WordStates): states float32
           [n_words_total, len(layers) or H, d], words, tags, covered [n_words_total],
           truncated [n_sentences]
    uncovered_words(features)                      -> [(sentence, word_index, word), ...]

Raises ValueError (naming the sentence) for words and tags of different
lengths, an empty sentence or a word that cannot be joined (empty, holds
whitespace); ``SentencesNotExtracted`` when sentences are not stored with
token-level states for this model and config; ValueError for a layer the
store does not hold. Nothing is written here, so nothing is half-stored.

Example::

    texts = sentence_texts(sentences)
    ex.extract(texts, job_id="ner", want_tokens=True)           # layerbank.workers.local
    train = word_states(ex.store, ex.encoder.fingerprint, ex.encoder.config, sentences)
    train.states.shape                                           # (n_words, 7, 384)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from layerbank.app.probes.token_probe import WordStates
from layerbank.app.probes.wordsets import TaggedSentence
from layerbank.cache.keys import ExtractionConfig, text_key
from layerbank.cache.store import FeatureStore
from layerbank.cache.words import WORD_MODES, align_tokens_to_words, join_words, word_vectors

__all__ = ["SentencesNotExtracted", "WordFeatures", "sentence_texts", "uncovered_words", "word_states"]

# Sentences read per store call: bounds the token rows held at once (a few
# shards' worth) while keeping one read per shard.
_READ_CHUNK = 4096


class SentencesNotExtracted(LookupError):
    """Sentences with no token-level states stored for this model and config."""

    def __init__(self, missing: list[int], total: int, example: str) -> None:
        self.missing = missing
        super().__init__(
            f"{len(missing)} of {total} sentences are not extracted with token-level states for "
            f"this model and extraction config (first: sentence {missing[0]}, {example!r}); "
            "extract them with want_tokens=True first"
        )


@dataclass
class WordFeatures(WordStates):
    """WordStates plus, per sentence, whether the encoder cut it at max_length."""

    truncated: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))


Sentences = Sequence[TaggedSentence] | Sequence[Sequence[str]]


def _split(sentences: Sentences) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    """(words, tags) per sentence; untagged sentences get empty tag tuples."""
    if isinstance(sentences, (str, TaggedSentence)):
        raise ValueError("sentences must be a list of sentences, not one sentence")  # noqa: TRY004
    words, tags = [], []
    for i, s in enumerate(sentences):
        if isinstance(s, TaggedSentence):
            w, t = tuple(s.words), tuple(s.tags)
            if len(w) != len(t):
                raise ValueError(f"sentence {i}: {len(w)} words but {len(t)} tags")
        elif isinstance(s, str):
            raise ValueError(f"sentence {i} is one string; give its words as a list")  # noqa: TRY004
        else:
            w, t = tuple(cast(Sequence[str], s)), ()
        if not w:
            raise ValueError(f"sentence {i} is empty: a sentence needs at least one word")
        words.append(w)
        tags.append(t)
    if not words:
        raise ValueError("no sentences given")
    return words, tags


def sentence_texts(sentences: Sentences) -> list[str]:
    """The stored text of each sentence, after validating every one.

    Validate-then-extract: call this before extracting so that one bad
    sentence stops the whole set before anything is stored.
    """
    words, _ = _split(sentences)
    texts = []
    for i, w in enumerate(words):
        try:
            texts.append(join_words(w)[0])
        except ValueError as e:
            raise ValueError(f"sentence {i}: {e}") from None
    return texts


def stored_sentences(store: FeatureStore, model_fingerprint: str, config_json: ExtractionConfig | str,
                     sentences: Sentences, mode: str) -> tuple[Any, Any, list[Any], list[str], dict[str, Any]]:
    """Words, tags, (text, spans) per sentence, keys and catalog entries of ``sentences``,
    once every one is stored with token-level states (else SentencesNotExtracted)."""
    if mode not in WORD_MODES:
        raise ValueError(f"unknown word mode {mode!r}; expected one of {', '.join(WORD_MODES)}")
    words, tags = _split(sentences)
    joined = []
    for i, w in enumerate(words):
        try:
            joined.append(join_words(w))
        except ValueError as e:
            raise ValueError(f"sentence {i}: {e}") from None
    keys = [text_key(model_fingerprint, config_json, text) for text, _ in joined]
    entries = store.lookup(keys, need_tokens=True)
    missing = [i for i, k in enumerate(keys) if k not in entries]
    if missing:
        raise SentencesNotExtracted(missing, len(keys), joined[missing[0]][0][:80])
    return words, tags, joined, keys, entries


def word_states(
    store: FeatureStore,
    model_fingerprint: str,
    config_json: ExtractionConfig | str,
    sentences: Sentences,
    *,
    mode: str = "first",
    layers: Sequence[int] | None = None,
) -> WordFeatures:
    """Per-word states of ``sentences`` (see the module docstring)."""
    words, tags, joined, keys, entries = stored_sentences(store, model_fingerprint, config_json,
                                                          sentences, mode)

    starts = np.concatenate([[0], np.cumsum([len(w) for w in words])]).astype(np.int64)
    truncated = np.array([entries[k].truncated for k in keys], dtype=bool)
    covered = np.zeros(int(starts[-1]), dtype=bool)
    states: np.ndarray | None = None
    # Read in (shard, row) order so each chunk touches few shards, each once.
    order = sorted(range(len(keys)), key=lambda i: (entries[keys[i]].shard, entries[keys[i]].row))
    for c in range(0, len(order), _READ_CHUNK):
        chunk = order[c : c + _READ_CHUNK]
        rows = store.read_tokens_many([keys[i] for i in chunk], layers)
        for i, tokens in zip(chunk, rows):
            if tokens is None:  # its shard was quarantined between lookup and read
                raise SentencesNotExtracted([i], len(keys), joined[i][0][:80])
            token_word = align_tokens_to_words(tokens.char_spans, joined[i][1], tokens.word_ids)
            vectors, cov = word_vectors(tokens.states, token_word, len(words[i]), mode)
            if states is None:
                states = np.zeros((int(starts[-1]), *vectors.shape[1:]), dtype=np.float32)
            states[starts[i] : starts[i + 1]] = vectors
            covered[starts[i] : starts[i + 1]] = cov
    assert states is not None  # at least one sentence, all found
    return WordFeatures(states, [list(w) for w in words], [list(t) for t in tags], covered, truncated)


def uncovered_words(features: WordStates) -> list[tuple[int, int, str]]:
    """``(sentence, word_index, word)`` of every word the encoder did not see."""
    if features.covered is None:
        return []
    out, pos = [], 0
    for s, sentence in enumerate(features.words):
        for j, word in enumerate(sentence):
            if not features.covered[pos + j]:
                out.append((s, j, word))
        pos += len(sentence)
    return out

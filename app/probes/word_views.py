"""Word states read one view at a time: token probes at corpus scale in bounded memory.

``word_states`` (layerbank.app.probes.word_features) returns every hidden
state of every word at once, ``[n_words, H, d]`` float32: on the full
CoNLL-2003 training set with MiniLM (203,621 words, 7 x 384) that is 2.2 GB
before a single view is built, and the probe then copies each view from it.
``word_views`` returns a ``LazyWordStates`` instead: it resolves the
sentences, their coverage and truncation once, and reads the stored token
states again for each view the probe asks for, **only the layers that view
needs** (``layer:K`` one, ``concat_last_4`` four, ``mean_all`` all), in
chunks of sentences of about ``CHUNK_BYTES`` of stored token states, pooled
to words and combined into the view chunk by chunk. So the probe holds one
view's float32 matrix (``[n_words, d']``) at a time, plus a chunk.

Cost: one store read per view instead of one in all (the reads are the same
HDF5 ranges again; on CoNLL a layer's read is seconds against a fit's
minute). The learned ``scalar_mix`` mixes every hidden state inside its
head, so for it the full ``[n_words, H, d]`` is built: that view alone is
not bounded by one layer's matrix.

Contract::

    word_views(store, fingerprint, config, sentences, mode="first") -> LazyWordStates
    ws.words, ws.tags, ws.covered [n_words], ws.truncated [n_sentences], ws.shape (n_words, H, d)
    ws.view_matrix(view, keep=None, compact=False) -> float32 [n_kept, d'] (view None: [n_kept, H, d];
        compact: the stored dtype where it is exact, float16 for concat_last_4 by default)

``run_token_probe`` takes a LazyWordStates wherever it takes a WordStates
(it asks ``view_matrix`` for the covered rows of each view), and returns
the same result as with ``word_states`` (tested).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from layerbank.app.probes.word_features import Sentences, SentencesNotExtracted, stored_sentences
from layerbank.cache.keys import ExtractionConfig
from layerbank.cache.store import FeatureStore
from layerbank.cache.views import View
from layerbank.cache.words import align_tokens_to_words, word_vectors

__all__ = ["CHUNK_BYTES", "LazyWordStates", "word_views"]

# Stored token states read per chunk (all layers a view needs together):
# large enough that a shard is read in few ranges, small next to one view's
# matrix (a CoNLL layer is ~390 MB in float32). A chunk costs about 3x this
# while it is pooled (float16 read, float32 word vectors, the combined view).
CHUNK_BYTES = 8 * 2**20


class LazyWordStates:
    """Per-word states of one split, read from the store view by view (see the module docstring)."""

    def __init__(self, store: FeatureStore, keys: list[str], entries: dict[str, Any],
                 words: list[list[str]], tags: list[list[str]], word_spans: list[np.ndarray], mode: str) -> None:
        self.store, self.keys, self.mode = store, keys, mode
        self.words, self.tags = words, tags
        self._spans = word_spans
        self._starts = np.concatenate([[0], np.cumsum([len(w) for w in words])]).astype(np.int64)
        self.truncated = np.array([entries[k].truncated for k in keys], dtype=bool)
        self._tokens = np.array([max(1, entries[k].n_tokens) for k in keys], dtype=np.int64)
        # (shard, row) order: each chunk touches few shards, each once
        self._order = sorted(range(len(keys)), key=lambda i: (entries[keys[i]].shard, entries[keys[i]].row))
        first = self._read([0], None)[0]
        self.n_hidden_states, self.hidden_size = int(first.states.shape[1]), int(first.states.shape[2])
        self._itemsize = first.states.dtype.itemsize
        # the dtype the states come back in (int8 rows are dequantised to float32 on read)
        self.store_dtype = np.dtype(first.states.dtype)
        self.covered = np.zeros(int(self._starts[-1]), dtype=bool)
        for i, token_word in self._alignments([0]):  # one pass over one layer: which words the encoder saw
            present = np.unique(token_word[token_word >= 0])
            self.covered[self._starts[i] + present] = True

    @property
    def shape(self) -> tuple[int, int, int]:
        return int(self._starts[-1]), self.n_hidden_states, self.hidden_size

    @property
    def states(self) -> LazyWordStates:
        # what WordStatesLike readers look at; run_token_probe checks for view_matrix
        return self

    def _read(self, sentences: list[int], layers: list[int] | None) -> list[Any]:
        rows = self.store.read_tokens_many([self.keys[i] for i in sentences], layers)
        for i, tokens in zip(sentences, rows):
            if tokens is None:  # its shard was quarantined after the lookup
                raise SentencesNotExtracted([i], len(self.keys), " ".join(self.words[i])[:80])
        return rows

    def _chunks(self, n_layers: int) -> Iterator[list[int]]:
        budget = max(1, CHUNK_BYTES // (n_layers * self.hidden_size * self._itemsize))
        chunk: list[int] = []
        used = 0
        for i in self._order:
            chunk.append(i)
            used += int(self._tokens[i])
            if used >= budget:
                yield chunk
                chunk, used = [], 0
        if chunk:
            yield chunk

    def _alignments(self, layers: list[int]) -> Iterator[tuple[int, np.ndarray]]:
        for chunk in self._chunks(len(layers)):
            for i, tokens in zip(chunk, self._read(chunk, layers)):
                yield i, align_tokens_to_words(tokens.char_spans, self._spans[i], tokens.word_ids)

    def view_matrix(self, view: View | None, keep: np.ndarray | None = None, *,
                    compact: bool = False) -> np.ndarray:
        """float32 ``[n_kept, d']`` of ``view`` for the words where ``keep`` is True (all when None);
        ``view`` None: every hidden state, ``[n_kept, H, d]``.

        ``compact``: in the stored dtype (float16 by default) where that holds the view's values
        exactly (layers taken as they are, first sub-token: no sum, no mean), else float32.
        ``concat_last_4`` of the full CoNLL-2003 training set is 0.63 GB so, 1.25 GB in float32."""
        h, d = self.n_hidden_states, self.hidden_size
        layers = list(range(h)) if view is None else view.needed_layers(h)
        width: tuple[int, ...] = (h, d) if view is None else (view.output_dim(h, d),)
        n = self.shape[0]
        keep = np.ones(n, dtype=bool) if keep is None else np.asarray(keep, dtype=bool)
        if keep.shape != (n,):
            raise ValueError(f"keep must have one entry per word ({n}), got {list(keep.shape)}")
        # where each word lands in the output (-1: not kept)
        target = np.full(n, -1, dtype=np.int64)
        target[keep] = np.arange(int(keep.sum()))
        exact = view is None or view.kind in ("concat", "all")
        stored = self.store_dtype if compact and exact and self.mode == "first" else np.dtype(np.float32)
        out = np.zeros((int(keep.sum()), *width), dtype=stored)
        for chunk in self._chunks(len(layers)):
            for i, tokens in zip(chunk, self._read(chunk, layers)):
                token_word = align_tokens_to_words(tokens.char_spans, self._spans[i], tokens.word_ids)
                a, b = self._starts[i], self._starts[i + 1]
                vectors, _ = word_vectors(tokens.states, token_word, b - a, self.mode)
                rows = target[a:b]
                if not (rows >= 0).any():
                    continue
                combined = vectors if view is None else view.combine(vectors, h).reshape(b - a, -1)
                out[rows[rows >= 0]] = combined[rows >= 0]
        return out


def word_views(
    store: FeatureStore,
    model_fingerprint: str,
    config_json: ExtractionConfig | str,
    sentences: Sentences,
    *,
    mode: str = "first",
) -> LazyWordStates:
    """``LazyWordStates`` of ``sentences``; raises as ``word_states`` does (ValueError naming the
    sentence, SentencesNotExtracted when some are not stored with token-level states)."""
    words, tags, joined, keys, entries = stored_sentences(store, model_fingerprint, config_json,
                                                          sentences, mode)
    return LazyWordStates(store, keys, entries, [list(w) for w in words], [list(t) for t in tags],
                          [spans for _, spans in joined], mode)

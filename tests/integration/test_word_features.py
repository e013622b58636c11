"""Word-level path on the bundled model: CoNLL sentences in, word vectors out.

Extracts ~40 CoNLL-2003 valid sentences plus a few of our own (sub-word
splits, punctuation, non-ASCII) with token-level states through
LocalExtractor, then checks ``word_states`` against an oracle that does not
use character spans: the tokenizer's own ``word_ids`` when it is given the
same words pre-split (``is_split_into_words=True``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from layerbank.app.probes.token_probe import run_token_probe
from layerbank.app.probes.word_features import sentence_texts, uncovered_words, word_states
from layerbank.app.probes.wordsets import TaggedSentence, read_wordset
from layerbank.workers.local import LocalExtractor
from tests.data_paths import CONLL2003

CONLL_VALID = CONLL2003 / "valid.txt"
THREADS = min(2, os.cpu_count() or 1)

OURS = [
    TaggedSentence(("Müller", "visited", "São", "Paulo", "(", "U.S.", ")", "."),
                   ("B-PER", "O", "B-LOC", "I-LOC", "O", "B-LOC", "O", "O")),
    TaggedSentence(("Nguyễn", "Thị", "Minh", "Khai", "met", "Zoë", "in", "Zürich", "—", "naïvely", "!"),
                   ("B-PER", "I-PER", "I-PER", "I-PER", "O", "B-PER", "O", "B-LOC", "O", "O", "O")),
    TaggedSentence(("unbelievably", "well-known", "3-2", "1996-08-30", "$", "1,234.56", "'s"),
                   ("O", "O", "O", "O", "O", "O", "O")),
]


@pytest.fixture(scope="module")
def conll() -> list[TaggedSentence]:
    sentences = read_wordset(CONLL_VALID)
    rng = np.random.default_rng(0)
    return [sentences[i] for i in sorted(rng.choice(len(sentences), 40, replace=False))]


@pytest.fixture(scope="module")
def extracted(tmp_path_factory, conll):
    with LocalExtractor.open(tmp_path_factory.mktemp("data"), threads=THREADS) as ex:
        summary = ex.extract(sentence_texts(conll + OURS), job_id="words", want_tokens=True)
        assert summary.texts_encoded == len(set(sentence_texts(conll + OURS)))
        yield ex


def oracle_positions(tokenizer, words: tuple[str, ...], stored_ids: np.ndarray) -> list[list[int]]:
    """Token positions of each word by the tokenizer's own word ids."""
    enc = tokenizer(list(words), is_split_into_words=True)
    # the oracle is about the same tokens as the stored ones
    assert enc["input_ids"] == stored_ids.tolist()
    positions: list[list[int]] = [[] for _ in words]
    for pos, w in enumerate(enc.word_ids()):
        if w is not None:
            positions[w].append(pos)
    return positions


def test_word_vectors_are_the_stored_rows_the_tokenizers_word_ids_pick(extracted, conll):
    ex = extracted
    fp, cfg, tok = ex.encoder.fingerprint, ex.encoder.config, ex.encoder.tokenizer
    sentences = conll + OURS
    first = word_states(ex.store, fp, cfg, sentences)
    mean = word_states(ex.store, fp, cfg, sentences, mode="mean")
    assert first.states.shape == (sum(len(s.words) for s in sentences), 7, 384)
    assert first.covered.all() and uncovered_words(first) == []
    split_words = row = 0
    for s in sentences:
        stored = ex.store.read_tokens(ex.store.key(fp, cfg, " ".join(s.words)))
        for j, pos in enumerate(oracle_positions(tok, s.words, stored.ids)):
            assert pos, f"{s.words[j]!r} has no token"
            np.testing.assert_array_equal(first.states[row + j], stored.states[pos[0]].astype(np.float32))
            np.testing.assert_allclose(mean.states[row + j], stored.states[pos].astype(np.float32).mean(0),
                                       rtol=1e-5, atol=1e-6)
            split_words += len(pos) > 1
        row += len(s.words)
    assert split_words >= 30  # the check covers many multi-token words, not only whole ones


def test_our_sentences_split_as_expected(extracted):
    # what the first test relies on: these words really are split and normalised
    tok = extracted.encoder.tokenizer
    assert tok.tokenize("U.S.") == ["u", ".", "s", "."]
    assert tok.tokenize("Müller São") == ["muller", "sao"]
    assert len(tok.tokenize("unbelievably")) > 1


def test_a_sentence_longer_than_max_length_reports_its_cut_words(tmp_path, conll):
    long = max(conll, key=lambda s: len(s.words))
    with LocalExtractor.open(tmp_path, max_length=16, threads=THREADS) as ex:
        summary = ex.extract(sentence_texts([long, OURS[0]]), job_id="cut", want_tokens=True)
        assert summary.truncated == 1  # OURS[0] is 13 tokens with [CLS] and [SEP]: it fits
        ws = word_states(ex.store, ex.encoder.fingerprint, ex.encoder.config, [long, OURS[0]])
        tok = ex.encoder.tokenizer
    assert ws.truncated.tolist() == [True, False]
    # oracle: words with a token among the first 14 (16 minus [CLS] and [SEP])
    expected = []
    for s in (long, OURS[0]):
        kept = {w for w in tok(list(s.words), is_split_into_words=True).word_ids()[1:15] if w is not None}
        expected += [j in kept for j in range(len(s.words))]
    assert ws.covered.tolist() == expected
    lost = uncovered_words(ws)
    assert lost and lost[0][0] == 0 and len(lost) == expected.count(False)
    assert all(long.words[j] == word for s, j, word in lost if s == 0)


def test_a_token_probe_runs_on_the_word_states(extracted, conll):
    ex = extracted
    train = word_states(ex.store, ex.encoder.fingerprint, ex.encoder.config, conll[:30])
    valid = word_states(ex.store, ex.encoder.fingerprint, ex.encoder.config, conll[30:] + OURS[:2])
    result = run_token_probe(train, valid, views=["layer:-2", "sum_last_4"], control_task=False, max_iter=100)
    for row in result["rows"]:
        assert 0.0 <= row["f1"] <= 1.0 and 0.0 <= row["word_accuracy"] <= 1.0
    assert result["n_words"] == {"train": train.states.shape[0], "valid": valid.states.shape[0]}
    # most words are O: even a tiny head tags most words right
    assert result["rows"][0]["word_accuracy"] > 0.7

"""layerbank.app.probes.word_views: view-by-view word states equal the all-in-memory ones, and the
token probe scores them the same (tiny random encoder, real CoNLL-2003 sentences)."""

from __future__ import annotations

import numpy as np
import pytest

from layerbank.app.probes import word_views as wv
from layerbank.app.probes.token_probe import run_token_probe
from layerbank.app.probes.word_features import SentencesNotExtracted, sentence_texts, word_states
from layerbank.app.probes.wordsets import read_wordset
from layerbank.cache.views import parse_view
from layerbank.workers.encoder import Encoder
from layerbank.workers.extract import extract
from tests.data_paths import CONLL2003

CONLL = CONLL2003


@pytest.fixture(scope="module")
def conll(tiny_model_dir, tmp_path_factory):
    from layerbank.cache.store import FeatureStore

    # max_length 24 cuts the longer sentences, so some words are not covered
    enc = Encoder.load(tiny_model_dir, device="cpu", max_length=24)
    train, valid = read_wordset(CONLL / "train.txt")[:120], read_wordset(CONLL / "valid.txt")[:60]
    store = FeatureStore(tmp_path_factory.mktemp("wv") / "data")
    extract(sentence_texts(train + valid), store, enc, job_id="wv", want_tokens=True)
    yield store, enc, train, valid
    store.close()


@pytest.mark.parametrize("mode", ["first", "mean"])
def test_each_view_read_from_the_store_equals_the_view_of_all_states_in_memory(conll, mode, monkeypatch):
    store, enc, train, _ = conll
    monkeypatch.setattr(wv, "CHUNK_BYTES", 4096)  # many chunks, each a few sentences
    full = word_states(store, enc.fingerprint, enc.config, train, mode=mode)
    lazy = wv.word_views(store, enc.fingerprint, enc.config, train, mode=mode)
    assert lazy.shape == full.states.shape == (full.states.shape[0], 3, 32)
    assert lazy.words == full.words and lazy.tags == full.tags
    np.testing.assert_array_equal(lazy.covered, full.covered)
    np.testing.assert_array_equal(lazy.truncated, full.truncated)
    assert 0 < (~lazy.covered).sum() < 0.5 * lazy.covered.size  # the cut is exercised, not everything
    for spec in ["layer:-1", "layer:0", "mean_all", "all_layers", "weighted:0.2,0.3,0.5"]:
        view = parse_view(spec)
        expected = view.apply(full.states[full.covered]).reshape(int(full.covered.sum()), -1)
        got = lazy.view_matrix(view, keep=full.covered)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, expected, err_msg=spec)
    np.testing.assert_array_equal(lazy.view_matrix(None), full.states)


def test_the_token_probe_scores_lazy_states_as_it_scores_states_in_memory(conll):
    store, enc, train, valid = conll
    fp, cfg = enc.fingerprint, enc.config
    views = ["layer:1", "mean_all", "scalar_mix"]
    kwargs = dict(views=views, mdl=True, mix_rounds=2, max_iter=50)
    old = run_token_probe(word_states(store, fp, cfg, train), word_states(store, fp, cfg, valid), **kwargs)
    new = run_token_probe(wv.word_views(store, fp, cfg, train), wv.word_views(store, fp, cfg, valid), **kwargs)
    assert [r["view"] for r in new["rows"]] == views
    assert new["n_words"] == old["n_words"] and new["n_uncovered"] == old["n_uncovered"]
    assert new["n_uncovered"]["train"] > 0 and new["hidden_size"] == 32
    for a, b in zip(old["rows"], new["rows"]):
        for key in ("f1", "precision", "recall", "word_accuracy", "control_f1", "selectivity"):
            assert a[key] == b[key], (a["view"], key)
        assert (a["mdl"] or {}).get("online_kbits") == (b["mdl"] or {}).get("online_kbits")


def test_sentences_not_extracted_are_refused_naming_the_first(conll):
    store, enc, train, _ = conll
    with pytest.raises(SentencesNotExtracted, match="1 of 2 sentences .* sentence 1, 'never stored here'"):
        wv.word_views(store, enc.fingerprint, enc.config, [train[0], ["never", "stored", "here"]])
    with pytest.raises(ValueError, match="unknown word mode 'last'"):
        wv.word_views(store, enc.fingerprint, enc.config, train[:2], mode="last")


def test_a_compact_view_is_the_stored_dtype_only_where_that_is_exact(conll):
    store, enc, train, _ = conll
    lazy = wv.word_views(store, enc.fingerprint, enc.config, train)
    assert lazy.store_dtype == np.float16  # the default storage dtype
    for spec, compact_dtype in [("layers:0,2", np.float16), ("layer:1", np.float16), ("all_layers", np.float16),
                                ("weighted:0.2,0.3,0.5", np.float32), ("mean_all", np.float32)]:
        view = parse_view(spec)
        wide = lazy.view_matrix(view, keep=lazy.covered)
        small = lazy.view_matrix(view, keep=lazy.covered, compact=True)
        assert small.dtype == compact_dtype, spec
        # a sum or a mean rounded to float16 would not be the view any more: those stay float32
        np.testing.assert_array_equal(small.astype(np.float32), wide, err_msg=spec)
    mean_mode = wv.word_views(store, enc.fingerprint, enc.config, train, mode="mean")
    assert mean_mode.view_matrix(parse_view("layers:0,2"), compact=True).dtype == np.float32

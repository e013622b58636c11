"""FeatureStore.read_tokens_many: batched token-level reads equal one-by-one reads."""

from __future__ import annotations

import numpy as np
import pytest

from workers.extract import extract

TEXTS = [f"sentence number {i} with {'many ' * (i % 5)}words" for i in range(60)]


@pytest.fixture
def stored(tiny_encoder, store):
    # small parts: the texts land in several shards
    summary = extract(TEXTS, store, tiny_encoder, job_id="tok", want_tokens=True, part_size=16)
    assert summary.shards_written == 4
    return store, summary.keys


def same(a, b) -> None:
    assert a is not None and b is not None
    np.testing.assert_array_equal(a.states, b.states)
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_array_equal(a.char_spans, b.char_spans)
    np.testing.assert_array_equal(a.word_ids, b.word_ids)


@pytest.mark.parametrize("layers", [None, [0], [-1, 0]])
def test_batched_rows_equal_single_reads_in_the_callers_order(stored, layers):
    store, keys = stored
    # reversed, with a repeat and an unknown key: order kept, repeats served, unknown None
    ask = keys[::-1] + [keys[3], "0" * 64]
    got = store.read_tokens_many(ask, layers)
    assert len(got) == len(ask) and got[-1] is None
    for key, rows in zip(ask[:-1], got[:-1]):
        same(rows, store.read_tokens(key, layers))
    h = 3 if layers is None else len(layers)
    assert got[0].states.shape[1:] == (h, 32)
    if layers == [-1, 0]:  # negative layers count from the end, as in views
        full = store.read_tokens(ask[0])
        np.testing.assert_array_equal(got[0].states, full.states[:, [2, 0]])


def test_sparse_rows_of_a_shard_are_read_one_by_one_with_the_same_result(stored):
    store, keys = stored
    entries = store.lookup(keys, need_tokens=True)
    shard = entries[keys[0]].shard
    in_shard = sorted((e.row, k) for k, e in entries.items() if e.shard == shard)
    ends = [in_shard[0][1], in_shard[-1][1]]  # first and last row: the span is mostly unwanted
    got = store.read_tokens_many(ends)
    for key, rows in zip(ends, got):
        same(rows, store.read_tokens(key))
        assert rows.ids[0] == 101 and rows.ids[-1] == 102  # [CLS] ... [SEP]: whole rows


def test_a_layer_that_does_not_exist_is_the_callers_error_and_quarantines_nothing(stored):
    store, keys = stored
    with pytest.raises(ValueError, match=r"layer 3 does not exist; this shard holds hidden states 0\.\.2"):
        store.read_tokens_many(keys, [3])
    with pytest.raises(ValueError, match="layer 7 does not exist"):
        store.read_tokens(keys[0], [7])
    with pytest.raises(ValueError, match="at least one hidden state"):
        store.read_tokens_many(keys, [])
    assert list(store.quarantine_dir.iterdir()) == []
    assert len(store.lookup(keys, need_tokens=True)) == len(set(keys))


def test_texts_stored_without_tokens_come_back_none(tiny_encoder, store):
    summary = extract(["pooled only"], store, tiny_encoder, job_id="pooled")
    assert store.read_tokens_many(summary.keys) == [None]

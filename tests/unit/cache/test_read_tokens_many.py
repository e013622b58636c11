"""FeatureStore.read_tokens_many: batched token-level reads equal one-by-one reads."""

from __future__ import annotations

import numpy as np
import pytest

from layerbank.cache.shard import ShardReader
from layerbank.workers.extract import extract

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


def test_rows_far_apart_are_read_as_separate_ranges_with_the_same_result(tiny_encoder, store):
    # 160 texts of ~12 tokens: ~1,900 token rows, more than one chunk (1,024 rows of 32 float16)
    texts = [f"text {i} " + "word " * 8 for i in range(160)]
    keys = extract(texts, store, tiny_encoder, job_id="far", want_tokens=True, part_size=256).keys
    entries = store.lookup(keys, need_tokens=True)
    by_row = sorted((e.row, k) for k, e in entries.items())
    ends = [by_row[0][1], by_row[-1][1], by_row[1][1]]  # rows 0, last, 1
    reader = store._reader(entries[keys[0]].shard)
    offsets = reader._open()["tokens/offsets"][:]
    pieces, _ = reader._runs(offsets, np.array([0, 1, len(by_row) - 1]), (1024, 32))
    assert len(pieces) == 2  # rows 0 and 1 merged, the last row apart
    got = store.read_tokens_many(ends)
    for key, rows in zip(ends, got):
        same(rows, store.read_tokens(key))
        assert rows.ids[0] == 101 and rows.ids[-1] == 102  # [CLS] ... [SEP]: whole rows


def test_runs_merge_rows_closer_than_a_chunk_and_place_each_row():
    offsets = np.array([0, 5, 9, 20, 100, 104])
    pieces, local = ShardReader._runs(offsets, np.array([0, 2, 4]), (10,))
    # rows 0 and 2 are 4 tokens apart (< 10): one range 0..20; row 4 (100..104) apart
    assert pieces == [(0, 20), (100, 104)]
    assert local.tolist() == [0, 9, 20]  # row 2 starts at 9 in the range, row 4 after 20 tokens
    pieces, local = ShardReader._runs(offsets, np.array([0, 2, 4]), (2,))
    assert pieces == [(0, 5), (9, 20), (100, 104)] and local.tolist() == [0, 5, 16]


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

"""layerbank.workers.extract.extract: only misses reach the encoder, and a re-run after
a crash finishes the job without storing anything twice.

``Encoder.calls`` counts forward passes; ``Encoder.encode`` is wrapped to
count the texts it was given, so "encoded once" is a number, not a hope.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from layerbank.cache.store import FeatureStore
from layerbank.workers.encoder import Encoder
from layerbank.workers.extract import Progress, Stopped, extract, plan_parts

TEXTS = [f"text number {i} " + "word " * (i % 5) for i in range(10)]


@pytest.fixture
def seen(tiny_encoder: Encoder, monkeypatch: pytest.MonkeyPatch) -> Counter:
    """Counts how many times each token sequence was encoded."""
    counts: Counter = Counter()
    real = tiny_encoder.encode

    def counting(batch, want_tokens=False):  # type: ignore[no-untyped-def]
        counts.update(tuple(ids) for ids in batch.input_ids)
        return real(batch, want_tokens=want_tokens)

    monkeypatch.setattr(tiny_encoder, "encode", counting)
    return counts


def catalog_keys(store: FeatureStore) -> list[str]:
    return [r[0] for r in store.catalog.conn().execute("SELECT key FROM entries")]


def test_first_run_encodes_everything_and_stores_the_encoders_numbers(
        store: FeatureStore, tiny_encoder: Encoder, seen: Counter) -> None:
    s = extract(TEXTS, store, tiny_encoder, job_id="j1")
    assert (s.texts, s.unique_texts, s.cache_hits, s.texts_encoded) == (10, 10, 0, 10)
    assert sum(seen.values()) == 10 and max(seen.values()) == 1
    assert s.tokens_encoded == sum(len(t) for t in seen)
    assert s.shards_written == 1 and s.bytes_written > 0
    # what was stored is what the encoder computes for each text alone (float16 rounding)
    alone = tiny_encoder.encode(tiny_encoder.tokenize(TEXTS))
    for pooling in ("mean", "cls", "max"):
        res = store.read_pooled(s.keys, pooling)
        assert res.found.all()
        np.testing.assert_allclose(res.data, alone.pooled[pooling], rtol=2e-3, atol=2e-3)
    assert sorted(catalog_keys(store)) == sorted(s.keys)


def test_cached_texts_are_not_encoded_again(store: FeatureStore, tiny_encoder: Encoder, seen: Counter) -> None:
    extract(TEXTS[:6], store, tiny_encoder, job_id="j1")
    calls = tiny_encoder.calls
    s = extract(TEXTS, store, tiny_encoder, job_id="j2")
    assert (s.cache_hits, s.texts_encoded) == (6, 4)
    assert sum(seen.values()) == 10 and max(seen.values()) == 1
    s3 = extract(TEXTS, store, tiny_encoder, job_id="j3")
    assert (s3.cache_hits, s3.texts_encoded, s3.shards_written) == (10, 0, 0)
    assert tiny_encoder.calls == calls + 1  # j2's one batch; j3 ran no forward pass
    assert s3.keys == s.keys


def test_duplicates_within_one_input_are_encoded_once(
        store: FeatureStore, tiny_encoder: Encoder, seen: Counter) -> None:
    texts = ["same", "other", "same", "same", "other", "third"]
    s = extract(texts, store, tiny_encoder, job_id="j1")
    assert (s.texts, s.unique_texts, s.texts_encoded) == (6, 3, 3)
    assert sum(seen.values()) == 3
    assert s.keys[0] == s.keys[2] == s.keys[3] and s.keys[1] == s.keys[4]
    res = store.read_pooled(s.keys, "mean")
    np.testing.assert_array_equal(res.data[0], res.data[3])
    assert len(catalog_keys(store)) == 3


def test_the_same_text_in_two_files_is_encoded_once(
        store: FeatureStore, tiny_encoder: Encoder, seen: Counter) -> None:
    a = extract(["shared text", "only in a"], store, tiny_encoder, job_id="file-a")
    b = extract(["only in b", "shared text"], store, tiny_encoder, job_id="file-b")
    assert b.cache_hits == 1 and b.texts_encoded == 1
    assert sum(seen.values()) == 3
    assert a.keys[0] == b.keys[1]
    assert sorted(catalog_keys(store)) == sorted({*a.keys, *b.keys})


def test_a_text_differing_by_a_space_is_another_text(store: FeatureStore, tiny_encoder: Encoder) -> None:
    s = extract(["a", " a", "a "], store, tiny_encoder, job_id="j")
    assert s.unique_texts == 3 and s.texts_encoded == 3


def test_a_rerun_after_a_crash_skips_committed_parts(
        store: FeatureStore, tiny_encoder: Encoder, seen: Counter) -> None:
    def crash_in_second_part(p: Progress) -> None:
        if p.done > 4:  # part 0 (4 texts) is committed; part 1 has started
            raise KeyboardInterrupt("worker killed")

    with pytest.raises(KeyboardInterrupt):
        extract(TEXTS, store, tiny_encoder, job_id="job", part_size=4, max_tokens=16,
                progress=crash_in_second_part)
    assert store.catalog.shard_names() == {"job-00000.h5"}
    assert not list(store.shard_dir.glob("*.tmp"))
    first_try = sum(seen.values())
    assert first_try > 4
    seen.clear()
    s = extract(TEXTS, store, tiny_encoder, job_id="job", part_size=4, max_tokens=16)
    assert s.cache_hits == 4 and s.texts_encoded == 6
    assert sum(seen.values()) == 6  # part 0 was not encoded again
    assert store.catalog.shard_names() == {"job-00000.h5", "job-00001.h5", "job-00002.h5"}
    keys = catalog_keys(store)
    assert len(keys) == len(set(keys)) == 10
    assert store.read_pooled(s.keys, "mean").found.all()


def test_parts_are_cut_before_the_lookup_so_a_part_keeps_its_name(
        store: FeatureStore, tiny_encoder: Encoder) -> None:
    texts = ["a", "bb", "ccc", "dddd", "eeeee", "bb"]  # one duplicate; lengths give the order
    plan = plan_parts(texts, store, tiny_encoder, job_id="j", part_size=2, want_tokens=False)
    assert [(p.name, p.texts) for p in plan.parts] == [
        ("j-00000", ["a", "bb"]), ("j-00001", ["ccc", "dddd"]), ("j-00002", ["eeeee"])]
    assert (plan.summary.texts, plan.summary.unique_texts, plan.summary.cache_hits) == (6, 5, 0)
    assert plan.summary.keys[1] == plan.summary.keys[5]
    extract(["ccc", "a"], store, tiny_encoder, job_id="other")
    again = plan_parts(texts, store, tiny_encoder, job_id="j", part_size=2, want_tokens=False)
    # "ccc" is stored now: part 1 shrinks but keeps its name; part 0 loses "a" and stays
    assert [(p.name, p.texts) for p in again.parts] == [
        ("j-00000", ["bb"]), ("j-00001", ["dddd"]), ("j-00002", ["eeeee"])]
    assert again.summary.cache_hits == 2 and set(again.hits) == {again.summary.keys[0], again.summary.keys[2]}


def test_a_rerun_rewrites_an_uncommitted_part_under_the_same_name(
        store: FeatureStore, tiny_encoder: Encoder) -> None:
    # the crash came after the file was renamed but before the catalog commit
    s = extract(TEXTS[:3], store, tiny_encoder, job_id="job")
    store.catalog.drop_shard("job-00000.h5")
    assert (store.shard_dir / "job-00000.h5").exists()
    s2 = extract(TEXTS[:3], store, tiny_encoder, job_id="job")
    assert s2.texts_encoded == 3 and s2.shards_written == 1
    assert sorted(p.name for p in store.shard_dir.iterdir()) == ["job-00000.h5"]
    assert store.read_pooled(s.keys, "cls").found.all()


def test_should_continue_false_stops_the_job_and_keeps_committed_parts(
        store: FeatureStore, tiny_encoder: Encoder) -> None:
    with pytest.raises(Stopped):
        extract(TEXTS, store, tiny_encoder, job_id="j", should_continue=lambda: False)
    assert store.catalog.stats()["keys"] == 0 and tiny_encoder.calls == 0

    # cancelled once part 0 is committed: part 1 was being encoded meanwhile (the writer
    # thread overlaps them) and is committed only if it was handed to the writer already;
    # part 2 never starts (it waits for the hand-over of part 1, which waits for part 0)
    with pytest.raises(Stopped):  # between parts or between batches of part 1
        extract(TEXTS, store, tiny_encoder, job_id="j2", part_size=4, max_tokens=16,
                should_continue=lambda: not store.is_committed("j2-00000"))
    names = store.catalog.shard_names()
    assert names in ({"j2-00000.h5"}, {"j2-00000.h5", "j2-00001.h5"})
    assert store.catalog.stats()["keys"] == 4 * len(names)
    s = extract(TEXTS, store, tiny_encoder, job_id="j2", part_size=4)
    assert s.cache_hits == 4 * len(names) and s.texts_encoded == 10 - 4 * len(names)


def test_progress_reports_every_text(store: FeatureStore, tiny_encoder: Encoder) -> None:
    reports: list[tuple[int, int]] = []
    extract(TEXTS, store, tiny_encoder, job_id="j", max_tokens=16,
            progress=lambda p: reports.append((p.done, p.total)))
    assert reports[0] == (0, 10) and reports[-1] == (10, 10)
    assert [d for d, _ in reports] == sorted(d for d, _ in reports)


def test_token_level_rows_are_stored_when_asked(store: FeatureStore, tiny_encoder: Encoder) -> None:
    texts = ["a b c", "hello world"]
    s = extract(texts, store, tiny_encoder, job_id="plain")
    assert store.read_tokens(s.keys[0]) is None
    calls = tiny_encoder.calls
    t = extract(texts, store, tiny_encoder, job_id="tok", want_tokens=True)
    assert t.texts_encoded == 2 and tiny_encoder.calls == calls + 1  # no tokens stored: misses
    rows = store.read_tokens(s.keys[1])
    assert rows is not None and rows.states.shape == (4, 3, 32)  # [CLS] hello world [SEP]
    assert rows.word_ids.tolist() == [-1, 0, 1, -1]
    again = extract(texts, store, tiny_encoder, job_id="tok2", want_tokens=True)
    plain = extract(texts, store, tiny_encoder, job_id="plain2")
    assert again.texts_encoded == plain.texts_encoded == 0
    assert tiny_encoder.calls == calls + 1


def test_truncated_texts_are_counted(store: FeatureStore, tiny_model_dir: str) -> None:
    enc = Encoder.load(tiny_model_dir, device="cpu", max_length=6)
    s = extract(["short", "one two three four five six seven"], store, enc, job_id="j")
    assert s.truncated == 1
    res = store.read_pooled(s.keys, "mean")
    assert [e.truncated for e in res.entries if e] == [False, True]
    assert [e.n_tokens for e in res.entries if e] == [3, 6]


def test_a_token_job_cuts_parts_by_a_bound_of_their_tokens(
        store: FeatureStore, tiny_encoder: Encoder, monkeypatch: pytest.MonkeyPatch) -> None:
    # a part's token states wait in memory for its shard write: the bound keeps a
    # token job's memory independent of its size (2,048 CoNLL sentences held 1 GB)
    import layerbank.workers.extract as ex

    per_token = 3 * 32 * 2  # tiny model: 3 hidden states x 32, float16
    monkeypatch.setattr(ex, "TOKEN_PART_BYTES", 20 * per_token)
    assert ex.token_part_limit(tiny_encoder) == 20
    texts = [" ".join(["word"] * n) for n in range(1, 9)]  # 4 .. 39 characters
    plan = plan_parts(texts, store, tiny_encoder, job_id="t", part_size=100, want_tokens=True)
    bounds = [sum(min(len(t) + 2, 512) for t in p.texts) for p in plan.parts]
    # bounds 6, 11, 16, 21, ...: "word" and "word word" share a part (17); from 16 on each
    # text is a part of its own, over the limit when it alone exceeds it (a part holds one text at least)
    assert bounds == [17, 16, 21, 26, 31, 36, 41]
    assert [p.name for p in plan.parts] == [f"t-{i:05d}" for i in range(7)]
    plain = plan_parts(texts, store, tiny_encoder, job_id="p", part_size=100, want_tokens=False)
    assert [len(p.texts) for p in plain.parts] == [8]  # pooled only: no token bound
    s = extract(texts, store, tiny_encoder, job_id="t", want_tokens=True, part_size=100)
    assert s.shards_written == len(plan.parts)
    for key, text in zip(s.keys, texts):
        rows = store.read_tokens(key)
        assert rows is not None and rows.states.dtype == np.float16
        assert rows.states.shape[0] <= ex.token_bound(text, 512)  # the bound holds


def test_token_states_past_float16_range_are_refused_not_stored_as_inf(
        store: FeatureStore, tiny_encoder: Encoder, monkeypatch: pytest.MonkeyPatch) -> None:
    # token rows are cast to float16 per batch now; a value float16 cannot hold stays
    # float32 so that the shard writer refuses it, as it does for pooled rows
    from layerbank.cache.shard import StorageRangeError

    real = tiny_encoder.encode

    def huge(batch, want_tokens=False):  # type: ignore[no-untyped-def]
        out = real(batch, want_tokens=want_tokens)
        out.tokens[0].states[1, -1, 0] = 70_000.0
        return out

    monkeypatch.setattr(tiny_encoder, "encode", huge)
    with pytest.raises(StorageRangeError, match="tokens/layer_2: values up to 7e"):
        extract(["a text", "another text"], store, tiny_encoder, job_id="big", want_tokens=True)
    assert store.catalog.stats()["keys"] == 0

"""Fairness: a huge request neither costs more than truncation keeps nor holds the encoder
against a small one (issue 16: 300 x 99,000 characters held it for 343 s, and a 1-text
miss sent meanwhile waited 342.9 s). Timing itself is measured in bench/fairness.py."""

from __future__ import annotations

import random

import pytest

from layerbank.cache.jobs import JobQueue
from layerbank.workers.jobs_registry import ENCODE_PRIORITY
from layerbank.workers.long_texts import CHARS_PER_TOKEN, head_for_tokens
from layerbank.workers.worker import Worker, WorkerOptions


def _words(n_chars: int, seed: int) -> str:
    rng = random.Random(seed)
    vocab = ["the", "encoder", "reads", "every", "layer", "once,", "and", "keeps", "it;", "naïve",
             "hidden-state", "probe", "x", "café", "antidisestablishmentarianism", "42", "\n", "\t"]
    out, size = [], 0
    while size < n_chars:
        w = rng.choice(vocab)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n_chars]


LONG = [_words(99_000, 1), _words(99_000, 2)[:-1] + "y",
        "a" * 20_000 + " tail words " * 2000,   # a prefix of one giant word: too few tokens
        "word " + "b" * 20_000 + " tail " * 2000,  # a prefix ("word") that holds too few tokens
        "word " * 30_000,                        # exactly at whitespace everywhere
        "x" * 99_000,                            # no whitespace at all
        _words(8_200, 3), _words(2_000, 4)]      # around and under the cut


@pytest.mark.parametrize("offsets", [False, True])
def test_long_texts_tokenize_exactly_as_if_whole(tiny_encoder, offsets: bool) -> None:  # type: ignore[no-untyped-def]
    enc = tiny_encoder
    max_len = int(enc.config.max_length)
    got = enc.tokenize(LONG, want_offsets=offsets)
    tok = enc.tokenizer
    for i, text in enumerate(LONG):
        want = tok(text, truncation=True, max_length=max_len, return_offsets_mapping=offsets,
                   add_special_tokens=enc.config.add_special_tokens)
        assert got.input_ids[i] == want["input_ids"], i
        whole = len(tok(text, add_special_tokens=enc.config.add_special_tokens)["input_ids"])
        assert got.truncated[i] == (whole > max_len), i
        if offsets:
            assert [tuple(o) for o in got.offsets[i]] == [tuple(o) for o in want["offset_mapping"]], i
            assert got.word_ids[i] == [-1 if w is None else w for w in want.word_ids()], i


def test_the_prefix_ends_at_whitespace_and_only_for_long_texts() -> None:
    assert head_for_tokens("short text", 512) is None
    text = _words(99_000, 5)
    head = head_for_tokens(text, 512)
    assert head is not None and len(head) <= 512 * CHARS_PER_TOKEN and text.startswith(head)
    assert text[len(head)].isspace()
    assert head_for_tokens("x" * 99_000, 512) is None  # nowhere to cut safely


def test_a_small_miss_runs_between_the_batches_of_a_huge_request(store, tiny_encoder) -> None:  # type: ignore[no-untyped-def]
    w = Worker(store, tiny_encoder, WorkerOptions(max_tokens=256, part_size=8))
    q: JobQueue = w.queue
    huge = q.submit("encode", {"texts": [_words(99_000, 10 + i) for i in range(24)]}, priority=ENCODE_PRIORITY)
    small = q.submit("encode", {"texts": ["one small miss"]}, priority=ENCODE_PRIORITY)
    w.run_job(q.claim(w.id, ["encode"], 30))  # type: ignore[arg-type]  # the huge one (submitted first)
    h, s = q.get(huge), q.get(small)
    assert h.state == s.state == "succeeded", (h, s)  # type: ignore[union-attr]
    # answered inside the huge request's job, not after it
    assert h.started < s.finished < h.finished  # type: ignore[union-attr, operator]
    assert h.result["texts_encoded"] == 24  # type: ignore[union-attr, index]



def test_a_cut_near_max_length_tokens_never_changes_the_kept_tokens(tiny_encoder, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # prefixes so tight that the cut falls among the tokens truncation keeps: cut inside
    # "playing", the prefix would end in "play ##i" where the whole text has "playing";
    # a cut at whitespace keeps every kept token the same
    from layerbank.workers import long_texts

    enc, tok = tiny_encoder, tiny_encoder.tokenizer
    max_len = int(enc.config.max_length)
    text = "playing " * (max_len * 4)
    want = tok(text, truncation=True, max_length=max_len, add_special_tokens=enc.config.add_special_tokens)
    for limit in range(len("playing ") * (max_len - 6), len("playing ") * (max_len + 2)):
        monkeypatch.setattr(long_texts, "CHARS_PER_TOKEN", limit / max_len)
        assert long_texts.head_for_tokens(text, max_len) is not None
        assert enc.tokenize([text]).input_ids[0] == want["input_ids"], limit


def test_a_small_miss_runs_while_a_huge_part_is_tokenized(store, tiny_encoder, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # tokenizing a part of 300 x 99,000 characters took seconds before its first batch;
    # the worker now looks for waiting misses between slices of it
    from layerbank.workers import extract

    per_text = int(tiny_encoder.config.max_length) * CHARS_PER_TOKEN  # what a long text costs
    monkeypatch.setattr(extract, "TOKENIZE_SLICE_CHARS", 2 * per_text)
    w = Worker(store, tiny_encoder, WorkerOptions(max_tokens=1 << 20, part_size=64))  # one batch
    q: JobQueue = w.queue
    calls: list[str] = []
    tokenize = tiny_encoder.tokenize

    def recording(texts, want_offsets=False):  # type: ignore[no-untyped-def]
        if texts == ["one small miss"]:
            calls.append("small")
        else:
            calls.append("huge")
            if calls.count("huge") == 1:  # the miss arrives once tokenizing has begun
                q.submit("encode", {"texts": ["one small miss"]}, priority=ENCODE_PRIORITY)
        return tokenize(texts, want_offsets=want_offsets)

    monkeypatch.setattr(tiny_encoder, "tokenize", recording)
    huge = q.submit("encode", {"texts": [_words(99_000, 30 + i) for i in range(12)]}, priority=ENCODE_PRIORITY)
    w.run_job(q.claim(w.id, ["encode"], 30))  # type: ignore[arg-type]
    assert q.get(huge).state == "succeeded"  # type: ignore[union-attr]
    assert calls.count("huge") > 2 and calls.count("small") == 1, calls
    assert calls[-1] == "huge" and calls.index("small") < len(calls) - 1, calls  # answered mid-tokenizing


@pytest.mark.parametrize("offsets", [False, True])
def test_tokenizing_in_slices_gives_what_one_call_gives(tiny_encoder, monkeypatch, offsets: bool) -> None:  # type: ignore[no-untyped-def]
    from layerbank.workers import extract

    monkeypatch.setattr(extract, "TOKENIZE_SLICE_CHARS", int(tiny_encoder.config.max_length) * CHARS_PER_TOKEN)
    checks: list[int] = []
    got = extract._tokenize_in_slices(tiny_encoder, LONG, offsets, lambda: checks.append(1) or True)
    want = tiny_encoder.tokenize(LONG, want_offsets=offsets)
    assert len(checks) >= 3  # it was cut
    assert got == want


def test_over_http_a_huge_request_passes_its_texts_in_a_file_and_removes_it(tiny_api_factory) -> None:  # type: ignore[no-untyped-def]
    # a 30 MB job row was read whole by the API's 2 ms poll and rewritten by every lease
    # renewal; the row now names a file, which is gone once the request is answered
    api = tiny_api_factory()
    texts = [_words(99_000, 70 + i) for i in range(11)]  # 1.09 M characters, 1.1 MB of JSON
    r = api.client.post("/v1/features", json={"texts": texts})
    assert r.status_code == 200, r.text
    assert len(r.json()["data"]) == 11 and r.json()["usage"]["tokens_computed"] > 0
    (job,) = api.worker.queue.list(kinds=["encode"])
    assert job.state == "succeeded" and "texts" not in job.payload, job.payload
    assert job.payload["texts_file"] == f"{job.id}.json"
    assert list((api.data_dir / "requests").iterdir()) == []

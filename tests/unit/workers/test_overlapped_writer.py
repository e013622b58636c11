"""The extraction's writer thread (workers/part_writer.py): part k is written while part
k + 1 is encoded, commits stay in part order, and a writer that fails mid-part fails the
job with its error, commits nothing of that part and nothing after it.

The overlap is asserted by the order of events (a write that waits for the next part's
encoding to start can only finish if the two overlap), and once by time with sleeps far
larger than the tiny model's work.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import layerbank.cache.shard as shard_mod
import layerbank.workers.extract as extract_mod
from layerbank.cache.store import FeatureStore
from layerbank.workers.encoder import Encoder
from layerbank.workers.extract import extract

TEXTS = [f"text {i} " + "word " * i for i in range(8)]  # lengths give the parts: 2 texts each


def part_of(texts: list[str]) -> int:
    return TEXTS.index(texts[0]) // 2


class Events:
    """A thread-safe log of (what, part)."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []
        self._lock = threading.Lock()
        self.encoding = [threading.Event() for _ in range(len(TEXTS) // 2)]
        self.encoded = [threading.Event() for _ in range(len(TEXTS) // 2)]

    def add(self, what: str, part: int) -> None:
        with self._lock:
            self.log.append((what, part))
        if what == "encode start":
            self.encoding[part].set()
        if what == "encode end":
            self.encoded[part].set()

    def at(self, what: str, part: int) -> int:
        return self.log.index((what, part))


def instrument(monkeypatch: pytest.MonkeyPatch, store: FeatureStore, events: Events, *,
               encode_s: float = 0.0, write: Any = None) -> list[str]:
    """Record when each part's encoding starts and its write starts and ends; ``write``
    (part, real_write) runs the write, slowly or not. Returns the written names in order."""
    real_encode, real_write = extract_mod._encode_part, store.write
    written: list[str] = []

    def encode_part(encoder: Encoder, texts: list[str], *args: Any) -> Any:
        events.add("encode start", part_of(texts))
        time.sleep(encode_s)
        try:
            return real_encode(encoder, texts, *args)
        finally:
            events.add("encode end", part_of(texts))

    def store_write(name: str, contents: Any, **kw: Any) -> int:
        part = int(name.rsplit("-", 1)[1])
        written.append(name)
        events.add("write start", part)
        try:
            return write(part, lambda: real_write(name, contents, **kw)) if write else real_write(name, contents, **kw)
        finally:
            events.add("write end", part)

    monkeypatch.setattr(extract_mod, "_encode_part", encode_part)
    monkeypatch.setattr(store, "write", store_write)
    return written


def test_part_k_plus_1_is_encoded_while_part_k_is_written(
        store: FeatureStore, tiny_encoder: Encoder, monkeypatch: pytest.MonkeyPatch) -> None:
    events = Events()

    def slow_write(part: int, do: Any) -> int:
        # a disk so slow that part k's write ends only once part k + 1's encoding has begun;
        # written in line with the forward pass, the wait would run out instead
        if part + 1 < len(events.encoding):
            events.encoding[part + 1].wait(timeout=5)
        return int(do())

    written = instrument(monkeypatch, store, events, write=slow_write)
    s = extract(TEXTS, store, tiny_encoder, job_id="job", part_size=2)
    for k in range(3):
        assert events.at("encode start", k + 1) < events.at("write end", k), events.log
    # one writer: commits in the order of the parts, every row back
    assert written == ["job-00000", "job-00001", "job-00002", "job-00003"]
    assert [e for e in events.log if e[0].startswith("write")] == [
        (w, k) for k in range(4) for w in ("write start", "write end")]
    assert (s.shards_written, s.texts_encoded) == (4, 8)
    assert store.read_pooled(s.keys, "mean").found.all()


def test_a_slow_disk_costs_the_larger_of_forward_and_write_not_their_sum(
        store: FeatureStore, tiny_encoder: Encoder, monkeypatch: pytest.MonkeyPatch) -> None:
    per_part = 0.4  # far above the tiny model's work per part, so the sleeps are the cost

    def slow_write(part: int, do: Any) -> int:
        time.sleep(per_part)
        return int(do())

    instrument(monkeypatch, store, Events(), encode_s=per_part, write=slow_write)
    t0 = time.perf_counter()
    extract(TEXTS, store, tiny_encoder, job_id="job", part_size=2)
    elapsed = time.perf_counter() - t0
    # in line: 4 encodes + 4 writes = 3.2 s of sleeps at least; overlapped: 5 x 0.4 = 2.0 s
    assert 5 * per_part <= elapsed < 8 * per_part, elapsed


class DiskGone(Exception):
    pass


def test_a_writer_failing_mid_part_fails_the_job_and_keeps_the_earlier_parts(
        store: FeatureStore, tiny_encoder: Encoder, monkeypatch: pytest.MonkeyPatch) -> None:
    events = Events()
    writing: list[int] = []
    real_cast = shard_mod._cast

    def cast(arr: Any, dtype: str, what: str) -> Any:
        # part 2 dies inside the HDF5 file: its temp file holds /keys already
        if writing[-1] == 2 and what == "pooled/cls":
            assert list(store.shard_dir.glob("*.tmp")), "the failure should come mid-file"
            # part 3 is encoded and being handed over when part 2 fails: it must not be written
            events.encoded[3].wait(timeout=5)
            time.sleep(0.2)
            raise DiskGone("the disk went away")
        return real_cast(arr, dtype, what)

    def write(part: int, do: Any) -> int:
        writing.append(part)
        return int(do())

    monkeypatch.setattr(shard_mod, "_cast", cast)
    written = instrument(monkeypatch, store, events, write=write)
    with pytest.raises(DiskGone, match="the disk went away"):
        extract(TEXTS, store, tiny_encoder, job_id="job", part_size=2)
    # nothing of part 2, nothing after it, the earlier parts committed in order
    assert written == ["job-00000", "job-00001", "job-00002"]
    assert store.catalog.shard_names() == {"job-00000.h5", "job-00001.h5"}
    assert sorted(p.name for p in store.shard_dir.iterdir()) == ["job-00000.h5", "job-00001.h5"]
    assert store.catalog.stats()["keys"] == 4
    # part 3 was encoded meanwhile, and never written
    assert ("encode end", 3) in events.log and ("write start", 3) not in events.log

    monkeypatch.setattr(shard_mod, "_cast", real_cast)
    again = extract(TEXTS, store, tiny_encoder, job_id="job", part_size=2)
    assert (again.cache_hits, again.texts_encoded) == (4, 4)
    assert written[3:] == ["job-00002", "job-00003"]  # the same names, so nothing twice
    assert store.read_pooled(again.keys, "mean").found.all()

"""layerbank.app.features_service: the one "read, encode the misses, read again" path.

A store held in a dict and an encoder that stores what it is given stand in for
the real ones (the HTTP, Bank and CLI tests run it with those); what a caller
relies on: rows in input order, each missing text encoded once, a row lost to
quarantine recomputed once, a second loss reported, and the same steps awaited.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from layerbank.app.features_service import TextsLost, TextSource, features_for, features_for_async
from layerbank.cache.catalog import Entry
from layerbank.cache.store import ReadResult


class Fake:
    def __init__(self, stored: dict[str, float], *, lose: int = 0, keys_known: bool = True) -> None:
        self.rows = {f"k:{t}": v for t, v in stored.items()}
        self.lose = lose  # reads that lose every freshly encoded row (a quarantined shard)
        self.keys_known = keys_known
        self.encoded: list[list[str]] = []
        self.reads: list[list[str]] = []

    def keys(self, texts: list[str]) -> list[str] | None:
        return [f"k:{t}" for t in texts] if self.keys_known else None

    def read(self, keys: list[str]) -> list[ReadResult]:
        self.reads.append(keys)
        fresh = {f"k:{t}" for batch in self.encoded for t in batch}
        if self.lose and self.encoded:
            self.lose -= 1
            for k in fresh:
                self.rows.pop(k, None)
        found = np.array([k in self.rows for k in keys])
        data = np.array([[self.rows.get(k, 0.0)] for k in keys], dtype=np.float32)
        entries = [Entry(k, "s", 0, len(k), False, False, ("mean",)) if k in self.rows else None for k in keys]
        return [ReadResult(data, found, entries)]

    def encode(self, texts: list[str], keys: list[str] | None) -> int:
        self.encoded.append(texts)
        self.keys_known = True  # the encoder loaded: its keys are known now
        new = [t for t in texts if f"k:{t}" not in self.rows]
        for t in new:
            self.rows[f"k:{t}"] = float(len(t))
        return len(new)

    def source(self) -> TextSource[list[ReadResult], int]:
        return TextSource(keys=self.keys, read=self.read, encode=self.encode)


def test_all_stored_reads_once_and_encodes_nothing() -> None:
    fake = Fake({"a": 1.0, "bb": 2.0})
    got = features_for(["bb", "a", "bb"], fake.source())
    assert got.results[0].data[:, 0].tolist() == [2.0, 1.0, 2.0]
    assert got.cached.tolist() == [True, True, True] and got.encoded == 0
    assert fake.encoded == [] and len(fake.reads) == 1


def test_only_the_misses_are_encoded_each_text_once_and_put_in_input_order() -> None:
    fake = Fake({"a": 1.0})
    got = features_for(["ccc", "a", "ccc", "dddd"], fake.source())
    assert fake.encoded == [["ccc", "dddd"]]
    assert fake.reads[1] == ["k:ccc", "k:ccc", "k:dddd"]  # only the misses are read again
    assert got.results[0].data[:, 0].tolist() == [3.0, 1.0, 3.0, 4.0]
    assert got.cached.tolist() == [False, True, False, False] and got.encoded == 2
    assert [e.key for e in got.entries] == got.keys


def test_a_row_lost_after_its_commit_is_encoded_again_once() -> None:
    fake = Fake({}, lose=1)
    got = features_for(["x", "y"], fake.source())
    assert fake.encoded == [["x", "y"], ["x", "y"]]
    assert got.results[0].found.all()


def test_rows_lost_twice_are_reported_not_answered_as_zeros() -> None:
    fake = Fake({"a": 1.0}, lose=2)
    with pytest.raises(TextsLost) as e:
        features_for(["a", "x", "y"], fake.source())
    assert e.value.lost == 2 and "2 texts could not be read back" in str(e.value)


def test_keys_that_need_the_encoder_are_made_after_it_ran() -> None:
    fake = Fake({"a": 1.0}, keys_known=False)
    got = features_for(["a", "b"], fake.source())
    assert fake.encoded == [["a", "b"]]  # everything handed over: the encoder skips the stored
    assert got.encoded == 1 and got.results[0].data[:, 0].tolist() == [1.0, 1.0]


def test_the_awaited_path_takes_the_same_steps() -> None:
    fake = Fake({"a": 1.0}, lose=1)

    async def read(keys: list[str]) -> list[ReadResult]:
        return fake.read(keys)

    async def encode(texts: list[str], keys: list[str] | None) -> int:
        return fake.encode(texts, keys)

    got = asyncio.run(features_for_async(["b", "a"], TextSource(keys=fake.keys, read=read, encode=encode)))
    assert fake.encoded == [["b"], ["b"]]
    assert got.results[0].data[:, 0].tolist() == [1.0, 1.0] and got.cached.tolist() == [False, True]

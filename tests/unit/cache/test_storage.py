"""The shard storage interface (cache/storage.py): one contract, checked on every registered
backend, and a store, its compaction and its clean-up that reach shards only through it."""

from __future__ import annotations

import io
import pickle
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from layerbank.cache.compact import compact
from layerbank.cache.keys import ExtractionConfig
from layerbank.cache.shard import CorruptShardError, ShardContents, ShardReader
from layerbank.cache.storage import ShardStorage, open_storage, register_storage, storage_names
from layerbank.cache.storage_local import LocalShardStorage
from layerbank.cache.store import FeatureStore


def rows(n: int, seed: int = 0, prefix: str = "k") -> ShardContents:
    rng = np.random.default_rng(seed)
    keys = [f"{prefix}{seed}-{i}".ljust(64, "0") for i in range(n)]
    return ShardContents(keys, np.arange(1, n + 1), np.zeros(n, bool),
                         {"mean": rng.standard_normal((n, 3, 4)).astype(np.float32)})


@pytest.fixture(params=storage_names())
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> ShardStorage:
    return open_storage(request.param, root=tmp_path / "data")


def test_local_is_the_default_and_an_unknown_name_says_which_exist(tmp_path: Path) -> None:
    assert "local" in storage_names()
    assert isinstance(FeatureStore(tmp_path / "a", catalog_url="").storage, LocalShardStorage)
    with pytest.raises(ValueError, match=r"unknown shard storage 's3'; known: .*local"):
        open_storage("s3", root=tmp_path)
    with pytest.raises(ValueError, match="registered already"):
        register_storage("local")(LocalShardStorage)


def test_a_written_shard_is_listed_and_reads_back_the_same_numbers(storage: ShardStorage) -> None:
    c = rows(5)
    c.attrs.update(model_fingerprint="m", extraction_config="{}")  # what FeatureStore.write adds
    n_bytes = storage.write("job-00000.h5", c, "float32")
    assert [(s.name, s.n_bytes, s.temp) for s in storage.list()] == [("job-00000.h5", n_bytes, False)]
    reader = storage.open("job-00000.h5")
    try:
        assert reader.read_keys() == c.keys
        assert reader.read_keys(np.array([3, 1, 3])) == [c.keys[3], c.keys[1], c.keys[3]]
        np.testing.assert_array_equal(reader.read_pooled(np.array([4, 0]), "mean"), c.pooled["mean"][[4, 0]])
        index = reader.read_index()
        assert (index.model, index.keys, index.n_tokens, index.has_tokens) == ("m", c.keys, [1, 2, 3, 4, 5], False)
    finally:
        reader.close()


def test_a_failed_write_leaves_nothing_not_even_a_temp_file(storage: ShardStorage) -> None:
    bad = rows(3)
    bad.pooled = {"mean": np.full((3, 3, 4), 1e6, np.float32)}  # past float16's range
    with pytest.raises(ValueError, match="overflow float16"):
        storage.write("job-00000.h5", bad, "float16")
    assert storage.list(temp=True) == []


def test_a_private_temp_write_replaces_the_shard_whole(storage: ShardStorage) -> None:
    storage.write("job-00000.h5", rows(2, seed=1), "float32")
    storage.write("job-00000.h5", rows(4, seed=2), "float32", private_temp=True)  # a retried part
    assert [s.name for s in storage.list(temp=True)] == ["job-00000.h5"]
    assert storage.open("job-00000.h5").read_keys() == rows(4, seed=2).keys


def test_delete_and_quarantine_say_whether_there_was_a_file(storage: ShardStorage) -> None:
    for name in ("a-00000.h5", "b-00000.h5"):
        storage.write(name, rows(1), "float32")
    assert storage.delete("a-00000.h5", written_before=time.time() - 3600) is False  # too young
    assert storage.delete("a-00000.h5") is True and storage.delete("a-00000.h5") is False
    assert storage.quarantine("b-00000.h5") is True and storage.quarantine("b-00000.h5") is False
    assert storage.list() == []
    free = storage.free_bytes()
    assert free is None or free > 0


def test_a_storage_travels_to_another_process_as_the_same_place(storage: ShardStorage) -> None:
    storage.write("job-00000.h5", rows(2), "float32")
    there = pickle.loads(pickle.dumps(storage))  # what Ray does to hand it to an actor
    assert type(there) is type(storage)
    assert there.open("job-00000.h5").read_keys() == rows(2).keys


def test_local_names_are_file_names_only(tmp_path: Path) -> None:
    s = LocalShardStorage(tmp_path)
    for bad in ("../x.h5", "", ".hidden.h5"):
        with pytest.raises(ValueError, match="bad shard name"):
            s.open(bad)
    assert not LocalShardStorage(tmp_path / "new", create=False).exists()
    assert not (tmp_path / "new").exists()  # looking makes no directory


class Recording(LocalShardStorage):
    """The local backend, noting every call: proves who goes through the interface."""

    name = "recording"
    calls: list[tuple[str, str]] = []

    def open(self, shard: str) -> Any:
        self.calls.append(("open", shard))
        return super().open(shard)

    def write(self, shard: str, contents: ShardContents, dtype: str, *, private_temp: bool = False) -> int:
        self.calls.append(("write", shard))
        return super().write(shard, contents, dtype, private_temp=private_temp)

    def list(self, *, temp: bool = False) -> Any:
        self.calls.append(("list", "temp" if temp else ""))
        return super().list(temp=temp)

    def delete(self, shard: str, *, written_before: float | None = None) -> bool:
        self.calls.append(("delete", shard))
        return super().delete(shard, written_before=written_before)

    def quarantine(self, shard: str) -> bool:
        self.calls.append(("quarantine", shard))
        return super().quarantine(shard)


def test_the_store_its_compaction_and_its_clean_up_go_through_the_storage(tmp_path: Path) -> None:
    rec = Recording(tmp_path / "data")
    store = FeatureStore(tmp_path / "data", catalog_url="", storage=rec)
    cfg = ExtractionConfig(storage_dtype="float32")
    for i in range(3):
        store.write(f"j{i}-00000", rows(2, seed=i), model="m", config=cfg)
    keys = [k for i in range(3) for k in rows(2, seed=i).keys]
    before = store.read_pooled(keys, "mean").data
    assert [c for c in rec.calls if c[0] == "write"] == [("write", f"j{i}-00000.h5") for i in range(3)]
    rec.calls.clear()
    summary = compact(store, max_rows=8)
    assert (summary.shards_merged, summary.shards_written) == (3, 1)
    merged = [s.name for s in rec.list()]
    assert len(merged) == 1 and merged[0].startswith("compact-")
    assert {("open", f"j{i}-00000.h5") for i in range(3)} | {("delete", f"j{i}-00000.h5") for i in range(3)} \
        <= set(rec.calls)
    np.testing.assert_array_equal(store.read_pooled(keys, "mean").data, before)  # what readers see: unchanged
    # a crash's leftovers: an uncommitted shard and a temp file, both removed through the storage
    rec.write("dead-00000.h5", rows(1, seed=9), "float32")
    (rec.shard_dir / "dead-00001.h5.tmp").write_bytes(b"half")
    rec.calls.clear()
    assert store.clean() == {"temp_files": 1, "uncommitted_shards": 1}
    assert ("list", "temp") in rec.calls and ("delete", "dead-00000.h5") in rec.calls
    # a damaged shard is quarantined by the storage, its keys reported missing
    (rec.shard_dir / merged[0]).write_bytes(b"\x89HDF damaged")
    store.close()
    store = FeatureStore(tmp_path / "data", catalog_url="", storage=rec)
    got = store.read_pooled(keys, "mean")
    assert not got.found.any() and ("quarantine", merged[0]) in rec.calls
    assert [p.name for p in rec.quarantine_dir.iterdir()] == [merged[0]]
    store.close()


def test_a_reader_of_rows_that_are_not_there_says_the_shard_is_damaged(storage: ShardStorage) -> None:
    storage.write("job-00000.h5", rows(2), "float32")
    with pytest.raises(CorruptShardError, match="past the 2 rows stored"):
        storage.open("job-00000.h5").read_keys(np.array([5]))


def test_a_reader_over_a_file_object_reads_what_the_file_holds(tmp_path: Path) -> None:
    # what a backend without local files hands ShardReader: range reads of a seekable object
    local = LocalShardStorage(tmp_path)
    c = rows(3)
    local.write("job-00000.h5", c, "float32")
    data = local.path("job-00000.h5").read_bytes()
    reader = ShardReader("mem://job-00000.h5", opener=lambda: io.BytesIO(data))
    assert reader.read_keys() == c.keys
    np.testing.assert_array_equal(reader.read_pooled(np.array([2]), "mean"), c.pooled["mean"][[2]])
    reader.close()

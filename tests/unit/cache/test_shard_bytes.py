"""The bytes of a shard and the words of its errors, as a user with h5py or a log sees
them: the chunk shapes docs/storage.md describes (about 64 KiB, at least one row),
the documented ``format_version``, float16 overflow refused with the fix, the file
fsynced under its temp name before the rename, and what a damaged read says.
Written for the mutants of cache/shard.py that bench/mutation.sh found surviving."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import h5py
import numpy as np
import pytest

from layerbank.cache import shard as shard_module
from layerbank.cache.shard import (
    CorruptShardError,
    ShardContents,
    ShardReader,
    StorageRangeError,
    TokenRows,
    _planned_bytes,
    write_shard,
)
from layerbank.cache.space import ShardWriteError


def contents(n: int, h: int, d: int, *, scale: float = 1.0) -> ShardContents:
    rng = np.random.default_rng(n)
    return ShardContents([f"{i:064x}" for i in range(n)], np.full(n, 3), np.zeros(n, bool),
                         {"mean": (scale * rng.standard_normal((n, h, d))).astype(np.float32)})


def chunks(path: Path) -> dict[str, tuple[int, ...]]:
    with h5py.File(path, "r") as f:
        out = {}
        f.visititems(lambda name, obj: out.__setitem__(name, obj.chunks) if isinstance(obj, h5py.Dataset) else None)
        assert all(f[name].fletcher32 for name in out)
        assert f.attrs["format_version"] == 1  # docs/storage.md, "File attributes"
        return out


def test_chunks_hold_about_64_kib_of_whole_rows(tmp_path: Path) -> None:
    write_shard(tmp_path / "s.h5", contents(2000, 7, 64), "float16")
    assert chunks(tmp_path / "s.h5") == {
        "keys": (1024,),              # 64 bytes a row: 65,536 / 64
        "n_tokens": (2000,),          # 4 bytes a row: all 2,000 rows fit in one chunk
        "truncated": (2000,),
        "pooled/mean": (73, 7, 64),   # 7 x 64 float16 = 896 bytes a row: 65,536 // 896
    }


def test_a_row_bigger_than_a_chunk_is_one_row_per_chunk(tmp_path: Path) -> None:
    write_shard(tmp_path / "s.h5", contents(3, 13, 3000), "float16")  # 78,000 bytes a row
    assert chunks(tmp_path / "s.h5")["pooled/mean"] == (1, 13, 3000)


def test_one_byte_rows_fill_a_whole_chunk(tmp_path: Path) -> None:
    write_shard(tmp_path / "s.h5", contents(40_000, 1, 1), "float16")
    got = chunks(tmp_path / "s.h5")
    assert got["truncated"] == (40_000,) and got["keys"] == (1024,) and got["pooled/mean"] == (32_768, 1, 1)


def test_float16_overflow_is_refused_with_the_fix_and_leaves_no_file(tmp_path: Path) -> None:
    big = contents(4, 2, 3, scale=1.0)
    big.pooled["mean"][2, 1, 0] = 123_456.0
    with pytest.raises(StorageRangeError) as e:
        write_shard(tmp_path / "s.h5", big, "float16")
    assert str(e.value) == ("pooled/mean: values up to 1.235e+05 overflow float16 (max 65504); "
                            "store this model with --storage-dtype float32")
    assert list(tmp_path.iterdir()) == []
    write_shard(tmp_path / "s.h5", big, "float32")  # what the message says to do
    assert ShardReader(tmp_path / "s.h5").read_pooled(np.array([2]), "mean")[0, 1, 0] == 123_456.0


def test_values_already_infinite_are_stored_as_they_are(tmp_path: Path) -> None:
    c = contents(2, 2, 3)
    c.pooled["mean"][0, 0, 0] = np.inf  # not an overflow of the cast: nothing to refuse
    write_shard(tmp_path / "s.h5", c, "float16")
    assert np.isinf(ShardReader(tmp_path / "s.h5").read_pooled(np.array([0]), "mean")[0, 0, 0])


def test_the_file_is_synced_under_its_temp_name_then_renamed_and_the_directory_synced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[tuple[str, list[str]]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), sorted(p.name for p in tmp_path.iterdir())))
        real_fsync(fd)

    monkeypatch.setattr(shard_module.os, "fsync", fsync)
    n_bytes = write_shard(tmp_path / "job-00000.h5", contents(3, 2, 3), "float16")
    assert synced == [(str(tmp_path / "job-00000.h5.tmp"), ["job-00000.h5.tmp"]),  # complete, not yet visible
                      (str(tmp_path), ["job-00000.h5"])]                           # the rename made durable
    assert n_bytes == (tmp_path / "job-00000.h5").stat().st_size


def test_an_empty_shard_is_refused_in_words(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as e:
        write_shard(tmp_path / "s.h5", ShardContents([], np.zeros(0), np.zeros(0, bool), {}), "float16")
    assert str(e.value) == "a shard needs at least one row"


def test_a_damaged_read_names_the_file_the_dataset_and_the_cause(tmp_path: Path) -> None:
    path = tmp_path / "s.h5"
    write_shard(path, contents(3, 2, 3), "float16")
    with h5py.File(path, "r") as f:
        off = f["pooled/mean"].id.get_chunk_info(0).byte_offset
    with open(path, "r+b") as fh:
        fh.seek(off + 2)
        fh.write(b"\xde\xad\xbe\xef")
    with pytest.raises(CorruptShardError) as e:
        ShardReader(path).read_pooled(np.array([0]), "mean")
    assert e.value.path == str(path)
    assert str(e.value).startswith(f"shard {path} is damaged: pooled/mean: OSError: ")
    assert "checksum" in str(e.value).lower() or "filter" in str(e.value).lower()


def _with_tokens(n_texts: int, tokens_each: int) -> ShardContents:
    rng = np.random.default_rng(1)
    c = contents(n_texts, 4, 96)
    c.tokens = [TokenRows(rng.standard_normal((tokens_each, 4, 96)).astype(np.float32),
                          np.arange(tokens_each, dtype=np.int32), np.zeros((tokens_each, 2), np.int32),
                          np.arange(tokens_each, dtype=np.int32)) for _ in range(n_texts)]
    return c


@pytest.mark.parametrize(("n_texts", "tokens_each"), [(1, 300), (40, 120)])
def test_a_shard_with_tokens_is_planned_as_an_upper_bound(tmp_path: Path, n_texts: int, tokens_each: int) -> None:
    """The disk check (cache/space.py) trusts this bound: under it, a nearly full disk
    fails mid-write, which HDF5 does not survive."""
    c = _with_tokens(n_texts, tokens_each)
    real = write_shard(tmp_path / "s.h5", c, "float16")
    planned = _planned_bytes(c, "float16")
    assert real <= planned <= real * 1.5 + 160 * 1024, (real, planned)


def test_a_write_that_meets_a_full_disk_says_so_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills after the check (another writer): HDF5's error becomes the one
    full-disk error, whether the file was begun or not, with the original as its cause."""
    def no_room(*args: object, **kw: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    for where in ("File", "_dataset"):  # before the temp file exists, and half-way through it
        with monkeypatch.context() as m:
            m.setattr(shard_module.h5py if where == "File" else shard_module, where, no_room)
            with pytest.raises(ShardWriteError) as e:
                write_shard(tmp_path / "job-00000.h5", contents(3, 2, 3), "float16")
        assert e.value.errno == errno.ENOSPC and isinstance(e.value.__cause__, OSError)
        assert str(e.value).startswith("no space left on device while writing shard job-00000.h5: it needs about ")
        assert list(tmp_path.iterdir()) == []


def test_mismatched_rows_are_refused_in_words(tmp_path: Path) -> None:
    c = contents(3, 4, 5)
    c.pooled["cls"] = c.pooled["mean"][:2]
    with pytest.raises(ValueError) as e:
        write_shard(tmp_path / "s.h5", c, "float16")
    assert str(e.value) == "pooled/cls has 2 rows, expected 3"


def test_rows_read_from_the_middle_of_a_shard_are_those_rows(tmp_path: Path) -> None:
    c = contents(10, 2, 3)
    write_shard(tmp_path / "s.h5", c, "float32")
    r = ShardReader(tmp_path / "s.h5")
    for rows in ([3, 4, 5], [5, 3, 4, 4], [1, 9]):  # dense (one block read) and sparse
        np.testing.assert_array_equal(r.read_pooled(np.array(rows), "mean"), c.pooled["mean"][rows])
    with pytest.raises(CorruptShardError) as e:  # a catalog row past the end is damage, in words
        r.read_pooled(np.array([4, 10]), "mean")
    assert str(e.value) == (f"shard {tmp_path / 's.h5'} is damaged: pooled/mean: IndexError: "
                            "row 10 is past the 10 rows stored")


def test_a_reader_keeps_one_open_file_and_reopens_after_close(tmp_path: Path) -> None:
    write_shard(tmp_path / "s.h5", contents(4, 2, 3), "float16")
    r = ShardReader(tmp_path / "s.h5")
    r.read_pooled(np.array([0]), "mean")
    first = r._file
    r.read_pooled(np.array([1]), "mean")
    assert r._file is first and first is not None and first.id.valid
    r.close()
    assert r._file is None and not first.id.valid  # the file itself was closed, not only forgotten
    assert r.read_pooled(np.array([2]), "mean").shape == (1, 2, 3)


def test_poolings_come_from_the_attribute_or_in_an_old_shard_from_the_datasets(tmp_path: Path) -> None:
    c = contents(2, 2, 3)
    c.pooled["max"] = c.pooled["mean"].copy()
    write_shard(tmp_path / "s.h5", c, "float16")
    assert ShardReader(tmp_path / "s.h5").poolings() == ("mean", "max")  # the order it was written in
    with h5py.File(tmp_path / "s.h5", "r+") as f:
        del f.attrs["poolings"]  # written before shards recorded it
    assert ShardReader(tmp_path / "s.h5").poolings() == ("mean", "max")
    (tmp_path / "bad.h5").write_bytes(b"not HDF5")
    with pytest.raises(CorruptShardError, match=r"is damaged: open: OSError"):
        ShardReader(tmp_path / "bad.h5").poolings()


def test_token_layers_are_checked_against_what_the_shard_holds(tmp_path: Path) -> None:
    c = _with_tokens(2, 3)  # 4 hidden states
    write_shard(tmp_path / "s.h5", c, "float32")
    r = ShardReader(tmp_path / "s.h5")
    for layers, want in (([0], [0]), ([-4], [0]), ([-1, 3], [3, 3]), (None, [0, 1, 2, 3])):
        got = r.read_tokens(1, layers)
        np.testing.assert_array_equal(got.states, c.tokens[1].states[:, want])  # type: ignore[index]
    with pytest.raises(ValueError) as e:
        r.read_tokens(0, [])
    assert str(e.value) == "layers must name at least one hidden state (or be None for all)"
    for bad in (4, -5, True):
        with pytest.raises(ValueError) as e:
            r.read_tokens(0, [bad])
        assert str(e.value) == (f"layer {bad!r} does not exist; this shard holds hidden states 0..3 "
                                "(negative indices count from the last)")


def test_token_rows_read_together_are_each_rows_own_tokens(tmp_path: Path) -> None:
    """Rows closer than a chunk are read as one range and cut apart again; rows far apart
    are separate ranges (cache/shard.py ``_runs``): either way each row gets its own tokens."""
    rng = np.random.default_rng(3)
    lengths = [int(x) for x in rng.integers(1, 200, size=40)]
    c = contents(40, 4, 96)
    c.tokens = [TokenRows(rng.standard_normal((n, 4, 96)).astype(np.float32), rng.integers(0, 30000, n).astype(np.int32),
                          rng.integers(0, 500, (n, 2)).astype(np.int32), rng.integers(-1, 50, n).astype(np.int32))
                for n in lengths]
    write_shard(tmp_path / "s.h5", c, "float32")
    r = ShardReader(tmp_path / "s.h5")
    rows = [31, 0, 1, 5, 30, 39, 5, 2, 17]
    for layers in (None, [2, 0]):
        got = r.read_tokens_many(rows, layers)
        want_layers = [0, 1, 2, 3] if layers is None else layers
        assert len(got) == len(rows)
        for row, t in zip(rows, got):
            want = c.tokens[row]
            np.testing.assert_array_equal(t.states, want.states[:, want_layers])
            np.testing.assert_array_equal(t.ids, want.ids)
            np.testing.assert_array_equal(t.char_spans, want.char_spans)
            np.testing.assert_array_equal(t.word_ids, want.word_ids)
    assert r.read_tokens_many([], None) == []
    with pytest.raises(CorruptShardError) as e:
        r.read_tokens_many([40])
    assert str(e.value) == f"shard {tmp_path / 's.h5'} is damaged: row 40 is past the token offsets"
    with pytest.raises(CorruptShardError):  # a negative row (a mangled catalog) is damage too
        r.read_tokens_many([3, -1])


def _flip_chunk(path: Path, dataset: str) -> None:
    with h5py.File(path, "r") as f:
        off = f[dataset].id.get_chunk_info(0).byte_offset
    with open(path, "r+b") as fh:
        fh.seek(off + 1)
        fh.write(b"\xde\xad\xbe\xef")


@pytest.mark.parametrize(("dataset", "read", "what"), [
    ("keys", lambda r: r.read_keys(), "keys"),
    ("tokens/offsets", lambda r: r.read_tokens(0), "tokens"),
    ("tokens/layer_1", lambda r: r.read_tokens(0, [1]), "tokens"),
])
def test_a_damaged_read_names_what_it_was_reading(tmp_path: Path, dataset: str, read, what: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "s.h5"
    write_shard(path, _with_tokens(3, 5), "float32")
    _flip_chunk(path, dataset)
    with pytest.raises(CorruptShardError) as e:
        read(ShardReader(path))
    assert str(e.value).startswith(f"shard {path} is damaged: {what}: OSError: ")


def test_token_reads_of_a_shard_without_tokens_say_so(tmp_path: Path) -> None:
    write_shard(tmp_path / "s.h5", contents(2, 2, 3), "float16")
    with pytest.raises(CorruptShardError) as e:
        ShardReader(tmp_path / "s.h5").read_tokens(0)
    assert str(e.value).startswith(f"shard {tmp_path / 's.h5'} is damaged: no token-level states: KeyError: ")


def test_token_state_overflow_names_the_layer(tmp_path: Path) -> None:
    c = _with_tokens(2, 3)
    c.tokens[1].states[0, 2, 5] = -99_999.0  # type: ignore[index]
    with pytest.raises(StorageRangeError) as e:
        write_shard(tmp_path / "s.h5", c, "float16")
    assert str(e.value).startswith("tokens/layer_2: values up to 1e+05 overflow float16 (max 65504); ")


def test_damage_met_while_listing_poolings_or_verifying_names_that_read(tmp_path: Path) -> None:
    from .test_shard_damage import flip_header

    old = tmp_path / "old.h5"  # written before shards recorded their poolings: the group is read
    write_shard(old, contents(3, 2, 3), "float16")
    with h5py.File(old, "r+") as f:
        del f.attrs["poolings"]
    flip_header(old, "pooled")
    with pytest.raises(CorruptShardError) as e:
        ShardReader(old).poolings()
    assert str(e.value) == (f"shard {old} is damaged: poolings: KeyError: "
                            "'Unable to synchronously open object (bad object header version number)'")

    chunk = tmp_path / "chunk.h5"  # a checksum fails in one dataset: verify names the dataset
    write_shard(chunk, contents(3, 2, 3), "float16")
    _flip_chunk(chunk, "pooled/mean")
    with pytest.raises(CorruptShardError) as e:
        ShardReader(chunk).verify()
    assert str(e.value).startswith(f"shard {chunk} is damaged: pooled/mean: OSError: ")

    header = tmp_path / "header.h5"  # an object that cannot be opened: the walk itself fails
    write_shard(header, contents(3, 2, 3), "float16")
    flip_header(header, "keys")
    with pytest.raises(CorruptShardError) as e:
        ShardReader(header).verify()
    assert str(e.value) == (f"shard {header} is damaged: structure: RuntimeError: "
                            "Object visitation failed (bad object header version number)")


def test_closing_twice_is_harmless(tmp_path: Path) -> None:
    write_shard(tmp_path / "s.h5", contents(2, 2, 3), "float16")
    r = ShardReader(tmp_path / "s.h5")
    r.close()  # never opened
    r.read_pooled(np.array([0]), "mean")
    r.close()
    r.close()
    assert r._file is None


def test_a_forked_child_leaves_the_parents_file_alone_and_opens_its_own(tmp_path: Path) -> None:
    """HDF5 handles must not cross a fork: close() in the child forgets the inherited
    handle without closing it, the child's next read opens its own file, and the
    parent's handle still reads afterwards."""
    import json

    c = contents(4, 2, 3)
    write_shard(tmp_path / "s.h5", c, "float32")
    r = ShardReader(tmp_path / "s.h5")
    want = r.read_pooled(np.array([3, 1]), "mean")
    inherited = r._file
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running pytest's exit handlers
        status = 1
        try:
            os.close(read_end)
            r.close()
            report = {"forgotten": r._file is None, "inherited_still_open": bool(inherited.id.valid)}
            got = r.read_pooled(np.array([3, 1]), "mean")
            report.update(same_rows=bool(np.array_equal(got, want)), own_file=r._file is not inherited,
                          owner_is_child=r._pid == os.getpid())
            r.close()
            report["own_file_closed"] = r._file is None
            os.write(write_end, json.dumps(report).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        report = json.loads(fh.read() or b"{}")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert report == {"forgotten": True, "inherited_still_open": True, "same_rows": True,
                      "own_file": True, "owner_is_child": True, "own_file_closed": True}
    assert r._file is inherited and inherited.id.valid  # the parent's handle, untouched
    np.testing.assert_array_equal(r.read_pooled(np.array([3, 1]), "mean"), want)

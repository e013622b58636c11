"""layerbank.cache.shard: the bytes on disk match docs/storage.md, writes are all or
nothing, and a damaged file is an error, never a wrong number.

The expected layout is read from the table in docs/storage.md, so the doc a
user opens with h5py and the file layerbank writes cannot drift apart.
"""

from __future__ import annotations

import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from layerbank.cache.shard import (
    FORMAT_VERSION,
    CorruptShardError,
    ShardContents,
    ShardReader,
    TokenRows,
    write_shard,
)

DOC = Path(__file__).resolve().parents[3] / "docs" / "storage.md"
N, H, D = 5, 3, 4
TOKENS_PER_TEXT = [3, 1, 4, 2, 5]
T = sum(TOKENS_PER_TEXT)


def documented_layout(dtype: str) -> dict[str, tuple[str, str]]:
    """``{dataset: (shape, dtype)}`` from the layout table in docs/storage.md, for a shard
    stored as ``dtype`` (rows marked "int8 shards only" belong to int8 shards alone)."""
    rows = re.findall(r"^\| `(/[\w/{}]+)` \| `\[([^\]]*)\]` \| `?([\w ]+?)`? \| ([^|]*)\|",
                      DOC.read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert rows, "docs/storage.md has no layout table"
    return {name: (shape, dt) for name, shape, dt, what in rows
            if dtype == "int8" or not what.strip().startswith("int8 shards only")}


def expected_datasets(dtype: str, tokens: bool) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    sizes = {"n": N, "H": H, "d": D, "T": T, "n + 1": N + 1, "2": 2}
    out = {}
    for name, (shape, dt) in documented_layout(dtype).items():
        if name.startswith("/tokens/") and not tokens:
            continue
        dims = tuple(sizes[s.strip()] for s in shape.split(","))
        np_dtype = np.dtype(dtype if dt == "storage dtype" else dt)
        if "{i}" in name:
            out.update({name.replace("{i}", str(i))[1:]: (dims, np_dtype) for i in range(H)})
        elif "{pooling}" in name:  # one per pooling the shard holds: make_contents' three
            out.update({name.replace("{pooling}", p)[1:]: (dims, np_dtype) for p in ("mean", "cls", "max")})
        else:
            out[name[1:]] = (dims, np_dtype)
    return out


def make_contents(seed: int = 0, tokens: bool = True, n: int = N) -> ShardContents:
    rng = np.random.default_rng(seed)
    keys = [f"{i:064x}" for i in range(seed * 1000, seed * 1000 + n)]
    pooled = {p: rng.normal(size=(n, H, D)).astype(np.float32) for p in ("mean", "cls", "max")}
    rows = None
    if tokens:
        rows = []
        for t in TOKENS_PER_TEXT[:n]:
            rows.append(TokenRows(rng.normal(size=(t, H, D)).astype(np.float32),
                                  rng.integers(0, 30000, size=t).astype(np.int32),
                                  np.stack([np.arange(t), np.arange(t) + 1], axis=1).astype(np.int32),
                                  np.array([-1] + list(range(t - 1)), dtype=np.int32)))
    return ShardContents(keys, np.array(TOKENS_PER_TEXT[:n], dtype=np.int32),
                         np.array([True, False, False, True, False][:n]), pooled, rows,
                         {"model_fingerprint": "local:abc", "extraction_config": '{"x":1}'})


def all_datasets(f: h5py.File) -> dict[str, h5py.Dataset]:
    out: dict[str, h5py.Dataset] = {}
    f.visititems(lambda name, obj: out.__setitem__(name, obj) if isinstance(obj, h5py.Dataset) else None)
    return out


@pytest.mark.parametrize("dtype", ["float16", "float32"])  # int8 shards: test_int8_storage.py
@pytest.mark.parametrize("tokens", [True, False])
def test_written_shard_is_exactly_the_documented_layout(tmp_path: Path, dtype: str, tokens: bool) -> None:
    c = make_contents(tokens=tokens)
    path = tmp_path / "job-00000.h5"
    n_bytes = write_shard(path, c, dtype)
    assert n_bytes == path.stat().st_size > 0
    with h5py.File(path, "r") as f:
        found = all_datasets(f)
        want = expected_datasets(dtype, tokens)
        assert sorted(found) == sorted(want)
        for name, (shape, dt) in want.items():
            ds = found[name]
            assert ds.shape == shape, name
            assert ds.dtype == dt, name
            assert ds.fletcher32, f"{name} lacks the fletcher32 checksum"
            assert ds.chunks is not None, f"{name} is not chunked"
            assert ds.dtype.kind != "O", f"{name} is a variable-length type"
        assert dict(f.attrs) == {"format_version": FORMAT_VERSION, "model_fingerprint": "local:abc",
                                 "extraction_config": '{"x":1}', "poolings": "mean,cls,max"}
        # the values, as a plain-h5py user reads them
        assert [k.decode() for k in f["keys"][:]] == c.keys
        np.testing.assert_array_equal(f["n_tokens"][:], TOKENS_PER_TEXT)
        np.testing.assert_array_equal(f["truncated"][:], [1, 0, 0, 1, 0])
        tol = 1e-3 if dtype == "float16" else 0
        for p in ("mean", "cls", "max"):
            np.testing.assert_allclose(f[f"pooled/{p}"][:], c.pooled[p], rtol=tol, atol=tol)
        if tokens:
            off = f["tokens/offsets"][:]
            np.testing.assert_array_equal(off, np.concatenate([[0], np.cumsum(TOKENS_PER_TEXT)]))
            for i, rows in enumerate(c.tokens or []):
                a, b = off[i], off[i + 1]
                for layer in range(H):
                    np.testing.assert_allclose(f[f"tokens/layer_{layer}"][a:b], rows.states[:, layer],
                                               rtol=tol, atol=tol)
                np.testing.assert_array_equal(f["tokens/ids"][a:b], rows.ids)
                np.testing.assert_array_equal(f["tokens/char_spans"][a:b], rows.char_spans)
                np.testing.assert_array_equal(f["tokens/word_ids"][a:b], rows.word_ids)
    assert list(tmp_path.iterdir()) == [path], "a .tmp file was left behind"


def test_reader_returns_rows_in_any_order_with_repeats(tmp_path: Path) -> None:
    c = make_contents(tokens=True)
    write_shard(tmp_path / "s.h5", c, "float32")
    r = ShardReader(tmp_path / "s.h5")
    rows = np.array([4, 0, 4, 2])
    np.testing.assert_array_equal(r.read_pooled(rows, "cls"), c.pooled["cls"][rows])
    assert r.read_keys() == c.keys
    t = r.read_tokens(2, layers=[2, 0])
    np.testing.assert_array_equal(t.states, c.tokens[2].states[:, [2, 0]])  # type: ignore[index]
    np.testing.assert_array_equal(t.word_ids, c.tokens[2].word_ids)  # type: ignore[index]
    r.close()


def test_sparse_row_reads_match(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    n = 400
    pooled = {p: rng.normal(size=(n, H, D)).astype(np.float32) for p in ("mean", "cls", "max")}
    c = ShardContents([f"{i:064x}" for i in range(n)], np.ones(n, np.int32), np.zeros(n, bool), pooled)
    write_shard(tmp_path / "s.h5", c, "float32")
    r = ShardReader(tmp_path / "s.h5")
    rows = np.array([399, 3, 200, 3])  # 3 distinct rows spread over 397: point selection
    np.testing.assert_array_equal(r.read_pooled(rows, "max"), pooled["max"][rows])
    r.close()


def test_mismatched_rows_leave_neither_the_file_nor_the_tmp(tmp_path: Path) -> None:
    c = make_contents(tokens=False)
    c.pooled["max"] = c.pooled["max"][:3]
    path = tmp_path / "job-00000.h5"
    with pytest.raises(ValueError, match="pooled/max has 3 rows, expected 5"):
        write_shard(path, c, "float16")
    assert list(tmp_path.iterdir()) == []


def test_a_failure_mid_write_keeps_an_earlier_file_intact(tmp_path: Path) -> None:
    # a re-run rewriting the same name must not destroy the first good copy
    path = tmp_path / "job-00000.h5"
    good = make_contents(tokens=False)
    write_shard(path, good, "float32")
    bad = make_contents(seed=2, tokens=False)
    bad.pooled["cls"] = bad.pooled["cls"][:1]
    with pytest.raises(ValueError):
        write_shard(path, bad, "float32")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job-00000.h5"]
    assert ShardReader(path).read_keys() == good.keys


def test_an_empty_shard_is_refused(tmp_path: Path) -> None:
    c = ShardContents([], np.zeros(0, np.int32), np.zeros(0, bool),
                      {p: np.zeros((0, H, D), np.float32) for p in ("mean", "cls", "max")})
    with pytest.raises(ValueError, match="at least one row"):
        write_shard(tmp_path / "e.h5", c, "float16")
    assert list(tmp_path.iterdir()) == []


def flip_bytes_in(path: Path, dataset: str, n: int = 4) -> None:
    """Flip ``n`` bytes in the middle of ``dataset``'s first chunk on disk."""
    with h5py.File(path, "r") as f:
        dsid = f[dataset].id
        # chunked datasets have no single data offset (get_offset() is None);
        # the first chunk's byte range comes from the chunk index
        offset = dsid.get_offset()
        if offset is None:
            info = dsid.get_chunk_info(0)
            offset, size = info.byte_offset, info.size
        else:
            size = dsid.get_storage_size()
    with open(path, "r+b") as fh:
        fh.seek(offset + size // 2)
        data = fh.read(n)
        fh.seek(offset + size // 2)
        fh.write(bytes(b ^ 0xFF for b in data))


@pytest.mark.parametrize("dataset, read", [
    ("pooled/mean", lambda r: r.read_pooled(np.array([0, 1]), "mean")),
    ("keys", lambda r: r.read_keys()),
    ("tokens/layer_1", lambda r: r.read_tokens(0)),
])
def test_flipped_bytes_make_the_read_raise(tmp_path: Path, dataset: str, read) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "s.h5"
    write_shard(path, make_contents(tokens=True), "float16")
    flip_bytes_in(path, dataset)
    with h5py.File(path, "r") as f:  # the damage is inside the data, not the metadata
        assert f[dataset].shape[0] > 0
    r = ShardReader(path)
    with pytest.raises(CorruptShardError) as e:
        read(r)
    assert str(path) in str(e.value) and "damaged" in str(e.value)
    assert isinstance(e.value, OSError)
    r.close()
    with pytest.raises(CorruptShardError):
        ShardReader(path).verify()


def test_verify_passes_on_an_intact_shard(tmp_path: Path) -> None:
    write_shard(tmp_path / "s.h5", make_contents(tokens=True), "float16")
    ShardReader(tmp_path / "s.h5").verify()


def test_a_file_that_is_not_hdf5_is_a_corrupt_shard(tmp_path: Path) -> None:
    (tmp_path / "s.h5").write_bytes(b"not an hdf5 file at all" * 10)
    with pytest.raises(CorruptShardError):
        ShardReader(tmp_path / "s.h5").read_keys()


def test_reading_tokens_from_a_shard_without_them_is_a_clear_error(tmp_path: Path) -> None:
    write_shard(tmp_path / "s.h5", make_contents(tokens=False), "float16")
    with pytest.raises(CorruptShardError, match="no token-level states"):
        ShardReader(tmp_path / "s.h5").read_tokens(0)

"""HDF5 shards: write-once files of pooled (and optionally token-level) states.

Layout (documented for users in docs/storage.md)::

    /keys               [n]          S64   hex sha256 key of each row
    /n_tokens           [n]          int32 tokens the encoder saw (after truncation)
    /truncated          [n]          uint8 1 when the text was cut at max_length
    /pooled/{mean,cls,max} [n, H, d] float16|float32|int8, H = L + 1 hidden states
                                     (one dataset per pooling the shard holds;
                                     attribute ``poolings`` lists them)
    /pooled/{pooling}_scale [n, H]   float32, int8 shards only: one scale per row
                                     per hidden state (cache/int8.py)
    /pooled/{pooling}_centres [G, H, d] float16 (float32 where float16 overflows), int8
                                     shards only: the per-dimension centres rows are coded
                                     around (G: 1, or one per shard compacted into this one)
    /pooled/{pooling}_centre_of [n]  int32, int8 shards only: each row's centre
    /tokens/offsets     [n + 1]      int64 row i owns token rows offsets[i]:offsets[i+1]
    /tokens/layer_{i}   [T, d]       token states of hidden state i
    /tokens/ids         [T]          int32 token ids
    /tokens/char_spans  [T, 2]       int32 character (start, end) in the text
    /tokens/word_ids    [T]          int32 tokenizer word id, -1 for special tokens
    /tokens/scale_{i}   [T]          float32, int8 shards only: scale of each token row

Every dataset is chunked and carries the fletcher32 checksum filter, so a
flipped byte on disk is an error on read, never a wrong number.

Writing is write-once: ``<name>.h5.tmp`` is written, flushed, fsynced and
closed, then ``os.replace``d to ``<name>.h5`` (atomic on POSIX), and the
directory is fsynced. A crash leaves at most a ``.tmp`` file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import h5py
import numpy as np

from .int8 import Int8Rows, centre_names, dequantize, quantize, scale_name
from .poolings import DEFAULT_POOLINGS, POOLING_NAMES, parse_poolings
from .space import ShardWriteError, as_write_error, check_room, estimate_bytes

__all__ = ["ShardContents", "TokenRows", "write_shard", "ShardReader", "ShardIndex", "CorruptShardError",
           "FORMAT_VERSION", "POOLINGS", "StorageRangeError", "ShardWriteError", "StoredShard", "fsync_dir"]

FORMAT_VERSION = 1
POOLINGS = parse_poolings(DEFAULT_POOLINGS)  # what a shard holds unless the poolings setting says otherwise
_CHUNK_BYTES = 64 * 1024  # small chunks: a one-row read decompresses little


class CorruptShardError(OSError):
    """A shard whose checksum or structure failed on read."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(f"shard {os.fspath(path)} is damaged: {reason}")
        self.path = os.fspath(path)
        self.reason = reason


# What h5py raises when a file is damaged depends on which structure was hit:
# a failed chunk checksum or a cut file is an OSError, a mangled object header a
# KeyError ("bad object header version number"), a mangled dataspace or datatype
# a ValueError, IndexError, TypeError or RuntimeError. All of them mean the same
# to a reader, so they are translated here, once (see ``_damage``).
_DAMAGE_ERRORS = (OSError, KeyError, ValueError, IndexError, TypeError, RuntimeError)


@contextmanager
def _damage(path: str, what: str) -> Iterator[None]:
    """Turn any error h5py raises while reading ``what`` into a CorruptShardError."""
    try:
        yield
    except CorruptShardError:
        raise
    except _DAMAGE_ERRORS as e:
        raise CorruptShardError(path, f"{what}: {type(e).__name__}: {e}") from e


@dataclass
class TokenRows:
    """Token-level states of one text: states [t, H, d] plus alignment arrays.

    ``scales`` [t, H] only while an int8 extraction holds its rows quantised (``states``
    int8) until the shard write; rows read back are always dequantised (float)."""

    states: np.ndarray
    ids: np.ndarray
    char_spans: np.ndarray
    word_ids: np.ndarray
    scales: np.ndarray | None = None


@dataclass
class ShardContents:
    """What one shard holds, in memory, before it is written."""

    keys: list[str]
    n_tokens: np.ndarray
    truncated: np.ndarray
    # pooling -> [n, H, d] (Int8Rows: as an int8 shard holds them); a Mapping so that a
    # dict[str, np.ndarray] is accepted (dict is invariant in its values)
    pooled: Mapping[str, np.ndarray | Int8Rows]
    tokens: list[TokenRows] | None = None
    attrs: dict[str, str | int] = field(default_factory=dict)


@dataclass(frozen=True)
class StoredShard:
    """One file a shard storage holds (cache/storage.py): ``name`` as the catalog lists it
    (``job-00000.h5``), or a temp file's (``job-00000.h5.tmp``) when ``temp``; ``mtime`` in
    seconds since the epoch."""

    name: str
    n_bytes: int
    mtime: float
    temp: bool = False


@dataclass
class ShardIndex:
    """What the catalog needs to register a shard, read from the shard alone (``layerbank repair``)."""

    model: str
    config: str
    keys: list[str]
    n_tokens: list[int]
    truncated: list[bool]
    has_tokens: bool


class StorageRangeError(ValueError):
    """Values that the storage dtype cannot hold (float16 overflows past 65,504)."""


def _cast(arr: np.ndarray, dtype: str, what: str) -> np.ndarray:
    """Cast to the storage dtype, refusing values it would turn into inf.

    Some encoders have hidden states past float16's range; storing them as
    inf would serve wrong numbers later, so the write fails with the fix.
    """
    with np.errstate(over="ignore"):
        out = np.asarray(arr, dtype=dtype)
    if out.dtype == np.float16 and not np.isfinite(out).all() and np.isfinite(arr).all():
        peak = float(np.abs(arr).max())
        raise StorageRangeError(f"{what}: values up to {peak:.4g} overflow float16 (max 65504); "
                                "store this model with --storage-dtype float32")
    return out


def _quantized(arr: np.ndarray | Int8Rows, what: str, centred: bool = False) -> Int8Rows:
    """Rows as an int8 shard stores them; non-finite values refused like float16's overflow."""
    if isinstance(arr, Int8Rows):
        return arr
    try:
        return quantize(arr, centred=centred)
    except ValueError as e:
        raise StorageRangeError(f"{what}: {e}; store this model with --storage-dtype float32") from None


def _write_stored(group: h5py.Group, name: str, arr: np.ndarray | Int8Rows, dtype: str, what: str) -> None:
    """One dataset in the storage dtype; an int8 one with its scales beside it."""
    if dtype == "int8":
        # pooled rows are coded around the shard's per-dimension centre: a pooled vector
        # shares a few huge dimensions across texts (cls of inner layers), which a
        # per-row scale alone rounded the differences between texts away with
        # (docs/storage.md "int8"); token rows arrive quantised, per row
        rows = _quantized(arr, what, centred=what.startswith("pooled/"))
        _dataset(group, name, rows.q)
        _dataset(group, scale_name(name), rows.scale)
        if rows.centres is not None and rows.centre_of is not None:
            centres, centre_of = centre_names(name)
            _dataset(group, centres, rows.centres)
            _dataset(group, centre_of, rows.centre_of)
        return
    if isinstance(arr, Int8Rows):
        raise TypeError(f"{what}: int8 rows cannot be written to a {dtype} shard")
    _dataset(group, name, _cast(arr, dtype, what))


def _blocks(rows: np.ndarray | Int8Rows) -> int:
    """How many centres a block of pooled rows carries (compaction stacks them)."""
    return len(rows.centres) if isinstance(rows, Int8Rows) and rows.centres is not None else 1


def _rows_per_chunk(row_bytes: int, n: int) -> int:
    return max(1, min(n, _CHUNK_BYTES // max(1, row_bytes)))


def _dataset(group: h5py.Group, name: str, data: np.ndarray) -> None:
    chunk = (_rows_per_chunk(int(np.prod(data.shape[1:], dtype=np.int64)) * data.itemsize,
                             data.shape[0]),) + data.shape[1:]
    group.create_dataset(name, data=data, chunks=chunk, fletcher32=True)


def write_shard(path: str | os.PathLike[str], contents: ShardContents, dtype: str) -> int:
    """Write ``contents`` to ``path`` atomically; return the bytes on disk.

    The final name appears only once the file is complete and on disk.
    """
    final = Path(path)
    tmp = final.with_name(final.name + ".tmp")
    n = len(contents.keys)
    if n == 0:
        raise ValueError("a shard needs at least one row")
    # HDF5 cannot recover from a disk that fills mid-write: refuse before starting
    need = _planned_bytes(contents, dtype)
    check_room(tmp, need)
    try:
        with h5py.File(tmp, "w") as f:
            _dataset(f, "keys", np.array(contents.keys, dtype="S64"))
            _dataset(f, "n_tokens", np.asarray(contents.n_tokens, dtype=np.int32))
            _dataset(f, "truncated", np.asarray(contents.truncated, dtype=np.uint8))
            pooled = f.create_group("pooled")
            for name, arr in contents.pooled.items():
                if arr.shape[0] != n:
                    raise ValueError(f"pooled/{name} has {arr.shape[0]} rows, expected {n}")
                _write_stored(pooled, name, arr, dtype, f"pooled/{name}")
            if contents.tokens is not None:
                _write_tokens(f.create_group("tokens"), contents.tokens, dtype)
            f.attrs["format_version"] = FORMAT_VERSION
            f.attrs["poolings"] = ",".join(contents.pooled)
            for k, v in contents.attrs.items():
                f.attrs[k] = v
            f.flush()
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        full = as_write_error(e, tmp, need) if isinstance(e, (OSError, RuntimeError)) else None
        if full is not None and full is not e:
            raise full from e
        raise
    fsync_dir(final.parent)
    return final.stat().st_size


def _planned_bytes(contents: ShardContents, dtype: str) -> int:
    """Upper bound of the file's size (cache/space.py), known before writing."""
    item, n = np.dtype(dtype).itemsize, len(contents.keys)
    int8 = dtype == "int8"  # plus one float32 scale per vector
    sizes = [64 * n, 4 * n, n]  # one per dataset: keys, n_tokens, truncated, ...
    for a in contents.pooled.values():
        sizes += [int(np.prod(a.shape, dtype=np.int64)) * item]
        sizes += [int(np.prod(a.shape[:-1], dtype=np.int64)) * 4] if int8 else []
        # centred int8: a row's centre index, and centres tables (one per block compacted)
        sizes += [4 * n, int(np.prod(a.shape[1:], dtype=np.int64)) * 4 * _blocks(a)] if int8 else []
    if contents.tokens:
        t = sum(r.states.shape[0] for r in contents.tokens)
        n_states, d = contents.tokens[0].states.shape[1:3]
        sizes += [t * d * item] * n_states + [4 * t, 8 * t, 4 * t, 8 * (n + 1)]
        sizes += [4 * t] * n_states if int8 else []
    # the last chunk of a dataset is stored whole; chunks hold half to all of _CHUNK_BYTES
    padding = sum(min(s, _CHUNK_BYTES) for s in sizes)
    chunks = sum(2 * s // _CHUNK_BYTES + 1 for s in sizes)
    return estimate_bytes(sizes + [padding], chunks)


def _write_tokens(group: h5py.Group, tokens: list[TokenRows], dtype: str) -> None:
    counts = np.array([t.states.shape[0] for t in tokens], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    _dataset(group, "offsets", offsets)
    n_states = tokens[0].states.shape[1]
    for i in range(n_states):
        what = f"tokens/layer_{i}"
        states = np.concatenate([t.states[:, i] for t in tokens])
        if all(t.scales is not None for t in tokens):  # quantised per batch already (workers/extract.py)
            rows: np.ndarray | Int8Rows = Int8Rows(states, np.concatenate([t.scales[:, i] for t in tokens]))  # type: ignore[index]  # all set
        elif states.dtype == np.int8:
            raise ValueError(f"{what}: int8 token states without their scales")
        else:
            rows = states
        _write_stored(group, f"layer_{i}", rows, dtype, what)
    _dataset(group, "ids", np.concatenate([t.ids for t in tokens]).astype(np.int32))
    spans = np.concatenate([t.char_spans.reshape(-1, 2) for t in tokens]).astype(np.int32)
    _dataset(group, "char_spans", spans)
    _dataset(group, "word_ids", np.concatenate([t.word_ids for t in tokens]).astype(np.int32))


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink in ``directory`` durable (the directory entry itself)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ShardReader:
    """Read-only, lazily opened handle on one committed shard.

    The file is opened on first read and the handle belongs to the process
    that opened it: after a fork the child opens its own (HDF5 handles must
    not cross a fork). ``opener``: for a storage without local files, returns
    a seekable binary file object (range reads) that h5py opens instead of
    ``path``, which then only names the shard in errors.
    """

    def __init__(self, path: str | os.PathLike[str], *, opener: Callable[[], IO[bytes]] | None = None) -> None:
        self.path = os.fspath(path)
        self._opener = opener
        self._file: h5py.File | None = None
        self._pid = -1

    def _open(self) -> h5py.File:
        if self._file is None or self._pid != os.getpid():
            with _damage(self.path, "open"):
                self._file = h5py.File(self._opener() if self._opener else self.path, "r")
            self._pid = os.getpid()
        return self._file

    def close(self) -> None:
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = None

    def _read_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (any order, repeats allowed) of dataset ``name``."""
        uniq, inverse = np.unique(rows, return_inverse=True)  # sorted, as h5py needs
        with _damage(self.path, name):
            # opening the dataset reads its object header: damage there is damage too
            ds = self._open()[name]
            lo, hi = int(uniq[0]), int(uniq[-1]) + 1
            if hi > ds.shape[0]:
                raise IndexError(f"row {hi - 1} is past the {ds.shape[0]} rows stored")
            if len(uniq) * 4 >= hi - lo:
                # dense: one contiguous read beats point selections by far
                block = ds[lo:hi]
                data = block[uniq - lo]
            else:
                data = ds[uniq]
        return data[inverse]

    def read_pooled(self, rows: np.ndarray, pooling: str) -> np.ndarray:
        """[len(rows), H, d] pooled states, as stored (float16 or float32); an int8 shard's
        dequantised to float32."""
        got = self.read_pooled_stored(rows, pooling)
        return got.values() if isinstance(got, Int8Rows) else got

    def read_pooled_stored(self, rows: np.ndarray, pooling: str) -> np.ndarray | Int8Rows:
        """The rows exactly as stored, an int8 shard's with their scales (compaction copies
        them bit for bit)."""
        name, idx = f"pooled/{pooling}", np.asarray(rows, dtype=np.int64)
        data = self._read_rows(name, idx)
        if data.dtype != np.int8:
            return data
        scale = self._read_rows(scale_name(name), idx)
        centres, centre_of = centre_names(name)
        with _damage(self.path, centres):
            table = self._open().get(centres)
            if table is None:  # an int8 shard written before pooled rows were centred
                return Int8Rows(data, scale)
            return Int8Rows(data, scale, table[:], self._read_rows(centre_of, idx))

    def poolings(self) -> tuple[str, ...]:
        """The poolings this shard holds: its ``poolings`` attribute, or, in a shard
        written before shards recorded it, the ``/pooled/*`` datasets it has."""
        with _damage(self.path, "poolings"):
            f = self._open()
            attr = f.attrs.get("poolings")
            if attr is not None:
                return tuple(p for p in str(attr).split(",") if p)
            return tuple(p for p in POOLING_NAMES if p in f["pooled"])

    def read_keys(self, rows: np.ndarray | Sequence[int] | None = None) -> list[str]:
        """The keys of ``rows`` (any order, repeats allowed), or of every row."""
        if rows is not None:
            return [k.decode() for k in self._read_rows("keys", np.asarray(rows, dtype=np.int64))]
        with _damage(self.path, "keys"):
            return [k.decode() for k in self._open()["keys"][:]]

    def read_index(self) -> ShardIndex:
        """Keys, token counts, truncation flags, model and config: enough to re-index the shard."""
        with _damage(self.path, "index"):
            f = self._open()
            index = ShardIndex(str(f.attrs["model_fingerprint"]), str(f.attrs["extraction_config"]),
                               [k.decode() for k in f["keys"][:]], np.asarray(f["n_tokens"][:]).tolist(),
                               np.asarray(f["truncated"][:]).astype(bool).tolist(), "tokens" in f)
            has_pooled = "pooled" in f
        if not (len(index.keys) == len(index.n_tokens) == len(index.truncated)) or not has_pooled:
            raise CorruptShardError(self.path, "keys, n_tokens and truncated disagree in length, "
                                    "or no pooled states")
        return index

    @staticmethod
    def _token_layers(n_states: int, layers: list[int] | None) -> list[int]:
        """Resolve ``layers`` (negative counts from the end) against the ``n_states`` stored.

        A layer the shard does not hold is the caller's mistake, so it is a
        ValueError, not a CorruptShardError (which would quarantine a sound shard).
        """
        if layers is None:
            return list(range(n_states))
        if len(layers) == 0:
            raise ValueError("layers must name at least one hidden state (or be None for all)")
        out = []
        for k in layers:
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not -n_states <= k < n_states:
                raise ValueError(f"layer {k!r} does not exist; this shard holds hidden states "
                                 f"0..{n_states - 1} (negative indices count from the last)")
            out.append(int(k) % n_states)
        return out

    @staticmethod
    def _runs(offsets: np.ndarray, uniq: np.ndarray,
              chunks: tuple[int, ...] | None) -> tuple[list[tuple[int, int]], np.ndarray]:
        """Token ranges to read for sorted rows ``uniq``, and where each row starts in their concatenation.

        Rows closer than one chunk are read as one range: the chunk between
        them is decompressed either way, and one read of a range costs far
        less than one read per row.
        """
        gap = chunks[0] if chunks else 0
        starts, ends = offsets[uniq], offsets[uniq + 1]
        pieces: list[tuple[int, int]] = []
        local = np.empty(len(uniq), dtype=np.int64)
        size = 0
        for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
            if pieces and a - pieces[-1][1] <= gap:
                local[i] = size - (pieces[-1][1] - pieces[-1][0]) + (a - pieces[-1][0])
                size += b - pieces[-1][1]
                pieces[-1] = (pieces[-1][0], b)
            else:
                local[i] = size
                size += b - a
                pieces.append((a, b))
        return pieces, local

    def read_tokens(self, row: int, layers: list[int] | None = None) -> TokenRows:
        """Token-level states of one row: states [t, len(layers), d]."""
        return self.read_tokens_many([row], layers)[0]

    def read_tokens_many(self, rows: Sequence[int] | np.ndarray, layers: list[int] | None = None) -> list[TokenRows]:
        """Token-level states of many rows (any order, repeats allowed), in ``rows`` order.

        Each dataset is read in few ranges (rows less than a chunk apart are
        merged), not row by row: thousands of one-row reads cost far more.
        """
        with _damage(self.path, "no token-level states"):
            g = self._open()["tokens"]
        with _damage(self.path, "tokens"):
            n_states = sum(1 for k in g if k.startswith("layer_"))
            offsets = g["offsets"][:]
        resolved = self._token_layers(n_states, layers)
        idx = np.asarray(rows, dtype=np.int64)
        if idx.size == 0:
            return []
        if idx.min() < 0 or idx.max() >= len(offsets) - 1:
            raise CorruptShardError(self.path, f"row {int(idx.max())} is past the token offsets")
        uniq = np.unique(idx)
        lengths = offsets[uniq + 1] - offsets[uniq]

        def block(name: str) -> np.ndarray:
            ds = g[name]
            if len(pieces) == 1:
                return ds[pieces[0][0] : pieces[0][1]]
            return np.concatenate([ds[a:b] for a, b in pieces])

        with _damage(self.path, "tokens"):
            first = g[f"layer_{resolved[0]}"]
            pieces, local = self._runs(offsets, uniq, first.chunks)
            size = sum(b - a for a, b in pieces)
            # filled layer by layer: one [t, L, d] array, no second copy as np.stack makes
            int8 = first.dtype == np.int8  # dequantised here, so readers see float32
            states = np.empty((size, len(resolved), first.shape[1]),
                              dtype=np.float32 if int8 else first.dtype)
            for j, i in enumerate(resolved):
                layer = block(f"layer_{i}")
                states[:, j] = dequantize(layer, block(f"scale_{i}")) if int8 else layer
            ids, spans, word_ids = block("ids"), block("char_spans"), block("word_ids")
        pos = np.searchsorted(uniq, idx)
        out = []
        for a, n in zip(local[pos].tolist(), lengths[pos].tolist()):
            out.append(TokenRows(states[a : a + n], ids[a : a + n], spans[a : a + n], word_ids[a : a + n]))
        return out

    def verify(self) -> None:
        """Read every dataset once so that any checksum failure surfaces."""
        def visit(name: str, obj: object) -> None:
            if isinstance(obj, h5py.Dataset):
                with _damage(self.path, name):
                    obj[()]

        with _damage(self.path, "structure"):
            self._open().visititems(visit)

"""cache/space.py: the size a shard is checked against is an upper bound close to the
real size, and a shard that does not fit says, in numbers a person can read, how much
it needs and how much there is."""

from __future__ import annotations

import errno
import resource
from pathlib import Path

import numpy as np
import pytest

from layerbank.cache.shard import ShardContents, _planned_bytes, write_shard
from layerbank.cache.space import ShardWriteError, _size, check_room, estimate_bytes


@pytest.mark.parametrize("n,close", [(64, False), (2048, True)])
def test_the_planned_size_is_an_upper_bound_within_a_few_percent(tmp_path: Path, n: int, close: bool) -> None:
    rng = np.random.default_rng(0)
    c = ShardContents([f"{i:064x}" for i in range(n)], np.full(n, 5), np.zeros(n, bool),
                      {p: rng.standard_normal((n, 7, 64)).astype(np.float32) for p in ("mean", "cls", "max")})
    real = write_shard(tmp_path / "s.h5", c, "float16")
    planned = _planned_bytes(c, "float16")
    assert real <= planned, (real, planned)
    if close:  # a shard of useful size: within a few percent (2.5% measured here)
        assert planned <= real * 1.03, (real, planned)


def test_estimate_adds_chunk_overhead_and_metadata() -> None:
    assert estimate_bytes([1000, 24], 3) == 1024 + 3 * 96 + 64 * 1024
    assert estimate_bytes([], 0) == 64 * 1024


@pytest.mark.parametrize("n,text", [(0, "0 bytes"), (1023, "1,023 bytes"), (1024, "1.0 KiB"),
                                    (1536, "1.5 KiB"), (5 * 2**20, "5.0 MiB"), (3 * 2**30, "3.0 GiB"),
                                    (5000 * 2**30, "5,000.0 GiB")])
def test_sizes_read_as_a_person_would_write_them(n: int, text: str) -> None:
    assert _size(n) == text


def test_no_room_names_the_shard_the_need_and_what_is_free(tmp_path: Path) -> None:
    with pytest.raises(ShardWriteError) as e:
        check_room(tmp_path / "job-00003.h5.tmp", 2**62)
    assert e.value.errno == errno.ENOSPC and e.value.failure_type == "storage"
    msg = str(e.value)
    assert msg.startswith("no space left on device while writing shard job-00003.h5: it needs about ")
    assert f"free in {tmp_path}; free some space and run the job again (nothing was committed)" in msg
    assert e.value.message == msg


def test_a_file_size_limit_is_named(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024 * 1024, hard))
    try:
        with pytest.raises(ShardWriteError) as e:
            check_room(tmp_path / "j-00000.h5.tmp", 2 * 1024 * 1024)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert e.value.errno == errno.EFBIG
    assert str(e.value) == ("file too large while writing shard j-00000.h5: it needs about 2.0 MiB, and this "
                            "process may write files of at most 1.0 MiB (ulimit -f); raise the limit or make "
                            "shards smaller (--part-size), then run the job again")
    check_room(tmp_path / "j-00000.h5.tmp", 1024)  # fits: no error


def test_a_quota_is_named_as_a_quota(tmp_path: Path) -> None:
    from layerbank.cache.space import _message

    msg = _message(errno.EDQUOT, tmp_path / "q-00001.h5.tmp", 3 * 2**20)
    assert msg.startswith("disk quota exceeded while writing shard q-00001.h5: it needs about 3.0 MiB, ")
    gone = _message(errno.ENOSPC, tmp_path / "missing" / "q-00001.h5.tmp", 10)  # free space unknown
    assert "10 bytes, unknown free in" in gone

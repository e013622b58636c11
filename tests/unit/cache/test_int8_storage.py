"""The int8 storage dtype (cache/int8.py, docs/storage.md): rows within their documented
error of float32 (each value within max|x| / 254 of its row's hidden state), keyed apart
from float16 and float32 rows, laid out as int8 data with float32 scales beside it (both
checksummed), dequantised on read, and copied bit for bit by compaction.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from layerbank.cache.compact import compact
from layerbank.cache.int8 import quantize
from layerbank.cache.keys import ExtractionConfig
from layerbank.cache.shard import ShardReader
from layerbank.cache.store import FeatureStore
from layerbank.workers.encoder import Encoder
from layerbank.workers.extract import extract

from .test_shard_damage import flip_chunk

TEXTS = ["the film is a charming journey .", "dull", "an utterly , thoroughly forgettable mess !",
         "it 's fine , i guess , if you like that sort of thing ."]
DTYPES = ("float32", "float16", "int8")


def bound(x: np.ndarray) -> np.ndarray:
    """The documented error: half a step, step = max|x| / 127 over each vector (last axis);
    plus float32's own rounding of q * scale."""
    peak = np.abs(x).max(axis=-1, keepdims=True)
    return peak / 254 * (1 + 1e-6) + np.finfo(np.float32).eps * np.abs(x)


@pytest.fixture
def encoders(tiny_model_dir: str) -> dict[str, Encoder]:
    return {dt: Encoder.load(tiny_model_dir, device="cpu", storage_dtype=dt) for dt in DTYPES}


def test_int8_rows_are_within_their_documented_error_of_float32_rows(
        store: FeatureStore, encoders: dict[str, Encoder]) -> None:
    got = {dt: extract(TEXTS, store, enc, job_id=dt, want_tokens=True) for dt, enc in encoders.items()}
    for pooling in ("mean", "cls", "max"):
        x = store.read_pooled(got["float32"].keys, pooling)
        q = store.read_pooled(got["int8"].keys, pooling)
        assert x.found.all() and q.found.all() and q.data.dtype == np.float32
        err = np.abs(q.data - x.data)
        assert (err <= bound(x.data)).all(), float((err / bound(x.data)).max())
        assert err.max() > 0  # quantised for real, not float32 under another name
    for a, b in zip(store.read_tokens_many(got["float32"].keys), store.read_tokens_many(got["int8"].keys)):
        assert a is not None and b is not None and b.states.dtype == np.float32
        assert (np.abs(b.states - a.states) <= bound(a.states)).all()
        assert (a.ids == b.ids).all() and (a.word_ids == b.word_ids).all()


def test_the_three_dtypes_are_three_keys_and_three_sets_of_rows(
        store: FeatureStore, encoders: dict[str, Encoder]) -> None:
    first = extract(TEXTS, store, encoders["float16"], job_id="f16")
    others = {dt: extract(TEXTS, store, encoders[dt], job_id=dt) for dt in ("int8", "float32")}
    # rows of another dtype are no hit: each dtype encodes the texts once, under keys of its own
    assert all(s.cache_hits == 0 and s.texts_encoded == len(TEXTS) for s in others.values())
    keys = [first.keys, others["int8"].keys, others["float32"].keys]
    assert len({k for ks in keys for k in ks}) == 3 * len(TEXTS)
    assert extract(TEXTS, store, encoders["int8"], job_id="again").cache_hits == len(TEXTS)
    assert '"storage_dtype":"int8"' in encoders["int8"].config.canonical()
    with pytest.raises(ValueError, match="storage_dtype must be one of"):
        ExtractionConfig(storage_dtype="int4")


def test_an_int8_shard_holds_int8_data_and_float32_scales(
        store: FeatureStore, encoders: dict[str, Encoder]) -> None:
    extract(TEXTS, store, encoders["int8"], job_id="q", want_tokens=True)
    extract(TEXTS, store, encoders["float16"], job_id="h", want_tokens=True)
    n, h, d = len(TEXTS), encoders["int8"].info["n_hidden_states"], encoders["int8"].info["hidden_size"]
    with h5py.File(store.shard_dir / "q-00000.h5", "r") as q, h5py.File(store.shard_dir / "h-00000.h5", "r") as f:
        t = q["tokens/ids"].shape[0]
        for p in ("mean", "cls", "max"):
            data, scale = q[f"pooled/{p}"], q[f"pooled/{p}_scale"]
            assert (data.dtype, data.shape, scale.dtype, scale.shape) == (np.int8, (n, h, d), np.float32, (n, h))
            assert data.fletcher32 and scale.fletcher32 and data.chunks and scale.chunks
            # what a plain h5py reader does with them: q * scale + the row's centre
            centres, centre_of = q[f"pooled/{p}_centres"], q[f"pooled/{p}_centre_of"]
            assert centres.shape == (1, h, d) and centre_of[:].tolist() == [0] * n
            assert np.allclose(data[:] * scale[:][..., None] + centres[:][centre_of[:]].astype(np.float32),
                               ShardReader(q.filename).read_pooled(np.arange(n), p))
            # bytes on disk (one chunk each here, + its 4-byte checksum): d + 4 per vector against
            # float16's 2 d (about half for any real width: 388 against 768 at d = 384)
            assert data.id.get_storage_size() == n * h * d + 4
            assert scale.id.get_storage_size() == n * h * 4 + 4
            assert f[f"pooled/{p}"].id.get_storage_size() == n * h * d * 2 + 4
        for i in range(h):
            assert (q[f"tokens/layer_{i}"].dtype, q[f"tokens/layer_{i}"].shape) == (np.int8, (t, d))
            assert (q[f"tokens/scale_{i}"].dtype, q[f"tokens/scale_{i}"].shape) == (np.float32, (t,))
            assert q[f"tokens/scale_{i}"].fletcher32
        assert q.attrs["poolings"] == "mean,cls,max"
        assert '"storage_dtype":"int8"' in q.attrs["extraction_config"]


def test_a_damaged_scale_is_caught_by_its_checksum(
        store: FeatureStore, encoders: dict[str, Encoder]) -> None:
    s = extract(TEXTS, store, encoders["int8"], job_id="q")
    flip_chunk(store.shard_dir / "q-00000.h5", "pooled/mean_scale")
    res = store.read_pooled(s.keys, "mean")
    assert not res.found.any()  # never wrong numbers: the keys are misses, the shard set aside
    assert (store.quarantine_dir / "q-00000.h5").exists()
    assert store.catalog.counter("quarantined_shards") == 1


def test_compaction_copies_int8_rows_and_scales_bit_for_bit(
        store: FeatureStore, encoders: dict[str, Encoder]) -> None:
    keys = [extract([t], store, encoders["int8"], job_id=f"j{i}").keys[0] for i, t in enumerate(TEXTS)]
    before = store.read_pooled(keys, "max").data
    assert compact(store, max_rows=8).shards_merged == len(TEXTS)
    (name,) = store.catalog.shard_names()
    stored = ShardReader(store.shard_dir / name).read_pooled_stored(np.arange(len(TEXTS)), "max")
    assert stored.q.dtype == np.int8  # type: ignore[union-attr]
    assert np.array_equal(store.read_pooled(keys, "max").data, before)


def test_quantize_edges() -> None:
    zeros = quantize(np.zeros((2, 3, 4), np.float32))
    assert not zeros.q.any() and not zeros.scale.any()
    x = np.array([[-2.0, 1.0, 0.5, 2.0]], np.float32)
    r = quantize(x)
    assert r.q.tolist() == [[-127, 64, 32, 127]] and r.scale.tolist() == [pytest.approx(2 / 127)]
    with pytest.raises(ValueError, match="non-finite"):
        quantize(np.array([[1.0, np.inf]], np.float32))


def test_non_finite_rows_are_refused_at_the_write(store: FeatureStore, tmp_path: Path) -> None:
    from layerbank.cache.shard import ShardContents, StorageRangeError, write_shard

    rows = np.full((1, 2, 3), np.nan, np.float32)
    with pytest.raises(StorageRangeError, match="pooled/mean: non-finite"):
        write_shard(tmp_path / "x.h5", ShardContents(["k" * 64], np.array([3]), np.array([False]),
                                                     {"mean": rows}), "int8")
    assert not list(tmp_path.glob("x.h5*"))


def test_int8_is_taken_wherever_float16_and_float32_are(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from layerbank.app.api.settings import Settings
    from layerbank.app.cli.main import build_parser
    from layerbank.linear_probe.standardize import Standardizer

    monkeypatch.setenv("LAYERBANK_STORAGE_DTYPE", "int8")
    assert Settings().storage_dtype == "int8"
    args = build_parser().parse_args(["extract", str(tmp_path / "t.txt"), "--storage-dtype", "int8"])
    assert args.storage_dtype == "int8"
    # the probes' noise floor: int8 rows are read as floats, judged by float16's step
    x = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
    x[:, 1] = 3.0
    assert Standardizer("int8").fit(x).n_dropped == Standardizer("float16").fit(x).n_dropped == 1

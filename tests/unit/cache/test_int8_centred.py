"""The centred int8 encoding (cache/int8.py, docs/storage.md "int8"): each value within
max|x - c| / 254 of float32 (c: its block's stored per-dimension centre), so what tells
nearly identical rows apart survives where a per-row scale rounds it away; blocks
concatenated (compaction) decode bit for bit as before.
"""

from __future__ import annotations

import numpy as np
import pytest

from layerbank.cache.int8 import Int8Rows, concat, dequantize, quantize
from layerbank.cache.store import FeatureStore
from layerbank.workers.encoder import Encoder
from layerbank.workers.extract import extract

TEXTS = ["the film is a charming journey .", "dull", "an utterly , thoroughly forgettable mess !",
         "it 's fine , i guess , if you like that sort of thing .", "a", "b c d e f g"]


def centred_bound(x: np.ndarray, rows: Int8Rows) -> np.ndarray:
    """The documented error: half a step around the row's centre as stored,
    step = max|x - c| / 127 over each vector; plus float32's rounding of c + q * scale."""
    assert rows.centres is not None and rows.centre_of is not None
    c = rows.centres.astype(np.float32)[rows.centre_of]
    peak = np.abs(x - c).max(axis=-1, keepdims=True)
    return peak / 254 * (1 + 1e-6) + 2 * np.finfo(np.float32).eps * (np.abs(x) + np.abs(c))


def like_cls_of_an_inner_layer(n: int, seed: int = 0) -> np.ndarray:
    """[n, 2, 64] rows as all-MiniLM-L6-v2's cls of h_1..h_5 look: one vector for every text
    with a dimension near 8 ("massive activation"), texts differing by about 1e-3."""
    rng = np.random.default_rng(seed)
    common = rng.normal(0, 0.05, size=(2, 64)).astype(np.float32)
    common[:, 7] = [8.1, -9.7]
    return (common + rng.normal(0, 1e-3, size=(n, 2, 64))).astype(np.float32)


def test_centred_rows_are_within_their_documented_error_of_float32_rows(
        store: FeatureStore, tiny_model_dir: str) -> None:
    enc = Encoder.load(tiny_model_dir, device="cpu", storage_dtype="float32")
    keys = extract(TEXTS, store, enc, job_id="f32").keys
    for x in [store.read_pooled(keys, p).data for p in ("mean", "cls", "max")] + [like_cls_of_an_inner_layer(50)]:
        rows = quantize(x, centred=True)
        assert rows.q.dtype == np.int8 and rows.scale.shape == x.shape[:-1]
        assert rows.centres is not None and rows.centres.shape == (1, *x.shape[1:])
        assert rows.centres.dtype == np.float16
        err = np.abs(rows.values() - x)
        assert (err <= centred_bound(x, rows)).all(), float((err / centred_bound(x, rows)).max())
        assert err.max() > 0  # quantised for real


def _tracking(decoded: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per dimension, the correlation across texts of decoded and float32 values (0 where
    the decoded values are one number for every text: nothing of the differences kept)."""
    a, b = decoded - decoded.mean(0), x - x.mean(0)
    norm = np.sqrt((a * a).sum(0) * (b * b).sum(0))
    return np.where(norm > 0, (a * b).sum(0) / np.where(norm > 0, norm, 1), 0.0)


def test_centring_keeps_what_tells_nearly_equal_rows_apart() -> None:
    x = like_cls_of_an_inner_layer(200)
    # per row, the dimension near 8 sets a step of 8 / 127, 60x what tells texts apart:
    # most dimensions decode to one number for every text
    assert np.median(_tracking(quantize(x).values(), x)) < 0.5
    # around the centre, the step follows the differences between texts
    assert np.median(_tracking(quantize(x, centred=True).values(), x)) > 0.9999
    assert (np.abs(quantize(x, centred=True).values() - x) < x.std(axis=0).min() / 20).all()


def test_concatenated_blocks_decode_bit_for_bit() -> None:
    """What compaction does: rows of several shards, each coded around its own centre (or
    per row, in a shard written before centring), in one shard, and a subset read back."""
    blocks = [quantize(like_cls_of_an_inner_layer(5, 1), centred=True), quantize(like_cls_of_an_inner_layer(3, 2)),
              quantize(like_cls_of_an_inner_layer(4, 3), centred=True)]
    merged = concat(blocks)
    assert merged.q.shape[0] == len(merged) == 12 and merged.centres is not None
    assert np.array_equal(merged.values(), np.concatenate([b.values() for b in blocks]))
    assert merged.centre_of is not None and merged.centre_of.tolist() == [0] * 5 + [1] * 3 + [2] * 4
    # a reader's subset: rows gathered with their centre index, the centres table whole
    rows = np.array([11, 0, 6, 6])
    got = dequantize(merged.q[rows], merged.scale[rows], merged.centres, merged.centre_of[rows])
    assert np.array_equal(got, merged.values()[rows])
    # merged again (a second compaction): still the same numbers
    again = concat([merged, blocks[0]])
    assert np.array_equal(again.values(), np.concatenate([merged.values(), blocks[0].values()]))
    # per-row blocks alone stay per row
    assert concat([blocks[1], blocks[1]]).centres is None


def test_centred_edges() -> None:
    one = np.array([[[0.3, -2.0, 1e-4]]], np.float32)  # a one-row block: the centre is the row
    rows = quantize(one, centred=True)
    assert (np.abs(rows.values() - one) <= centred_bound(one, rows)).all()
    zeros = quantize(np.zeros((2, 3, 4), np.float32), centred=True)
    assert not zeros.values().any()
    huge = np.array([[1e6, 1.0], [1e6 + 64, 2.0]], np.float32)  # a centre past float16's range
    rows = quantize(huge, centred=True)
    assert rows.centres is not None and rows.centres.dtype == np.float32
    assert (np.abs(rows.values() - huge) <= centred_bound(huge, rows)).all()
    with pytest.raises(ValueError, match="non-finite"):
        quantize(np.array([[1.0, np.nan], [0.0, 1.0]], np.float32), centred=True)
    with pytest.raises(ValueError, match="centre_of"):
        dequantize(rows.q, rows.scale, rows.centres)


def test_an_int8_shard_holds_its_pooled_rows_centred(store: FeatureStore, tiny_model_dir: str) -> None:
    import h5py

    from layerbank.cache.int8 import centre_names

    encoders = {dt: Encoder.load(tiny_model_dir, device="cpu", storage_dtype=dt) for dt in ("float32", "int8")}
    got = {dt: extract(TEXTS, store, enc, job_id=dt) for dt, enc in encoders.items()}
    with h5py.File(store.shard_dir / "int8-00000.h5", "r") as f:
        # the shard's rows in the order of the texts (extraction batches them by length)
        stored_keys = [k.decode() for k in f["keys"][:]]
        order = [stored_keys.index(k) for k in got["int8"].keys]
        for p in ("mean", "cls", "max"):
            centres, centre_of = (f[n] for n in centre_names(f"pooled/{p}"))
            assert centres.fletcher32 and centre_of.fletcher32
            stored = Int8Rows(f[f"pooled/{p}"][:], f[f"pooled/{p}_scale"][:], centres[:], centre_of[:])
            x = store.read_pooled(got["float32"].keys, p).data
            assert np.array_equal(store.read_pooled(got["int8"].keys, p).data, stored.values()[order])
            assert (np.abs(stored.values()[order] - x) <= centred_bound(x, stored)).all()  # x in text order; one centre

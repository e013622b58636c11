"""Precision modes (issue 9): how each mode resolves, that the mode is part of
the cache key, and how far bf16 rows are from fp32 ones.

CPUs are simulated through ``speed_warning``'s ``cpu_flags`` (the CPU's flags
decide nothing else) and CUDA through ``torch.cuda.is_bf16_supported``, so
the resolution table is tested whatever machine runs the suite. The tolerance test runs the bundled model on a few
texts (about 2 s): the tolerance it asserts is the one docs/precision.md
documents.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from layerbank.cache.fingerprint import default_model_path
from layerbank.cache.shard import POOLINGS
from layerbank.cache.store import FeatureStore
from layerbank.workers.encoder import Encoder
from layerbank.workers.extract import extract
from layerbank.workers.precision import autocast_dtype, precision_table, resolve_precision, speed_warning

# a CPU with AVX-512 but neither AVX-512 BF16 nor AMX (e.g. Skylake-SP)
PLAIN_CPU = {"fpu", "sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl"}

# docs/precision.md, "Tolerance": per stored vector, |bf16 - fp32| / |fp32|
BF16_MAX_RELATIVE = 0.02
BF16_MEDIAN_RELATIVE = 0.005


def test_auto_on_a_cpu_follows_the_measurement_and_is_fp32_until_measured() -> None:
    # the CPU's flags (AMX or not) decide nothing: the calibration does
    # (workers/engines/choice.py; tests/unit/workers/test_precision_calibration.py)
    assert resolve_precision("auto", "cpu") == "fp32"
    assert resolve_precision("auto", "cpu", measured="bf16") == "bf16"
    assert resolve_precision("auto", "cpu", measured="fp32") == "fp32"
    assert resolve_precision("bf16", "cpu") == "bf16"  # still there when asked


def test_bf16_on_a_cpu_without_amx_comes_with_a_speed_warning() -> None:
    no_amx = PLAIN_CPU | {"avx512_bf16"}
    assert speed_warning("bf16", "cpu", cpu_flags=no_amx) == (
        "precision bf16 on a CPU without AMX: extraction measured 0.37-0.68x the speed of fp32 on "
        "one such CPU and 2.2-3.5x on another (docs/precision.md); --precision auto measures which "
        "is faster here")
    assert speed_warning("bf16", "cpu", cpu_flags=no_amx | {"amx_bf16"}) is None
    assert speed_warning("fp32", "cpu", cpu_flags=no_amx) is None
    assert speed_warning("bf16", "cuda", cpu_flags=no_amx) is None


def test_default_is_fp32_on_cpu_even_where_bf16_is_available() -> None:
    assert resolve_precision("default", "cpu") == "fp32"


def test_explicit_modes_are_kept_on_cpu_and_fp16_is_refused() -> None:
    assert resolve_precision("fp32", "cpu") == "fp32"
    assert resolve_precision("bf16", "cpu") == "bf16"
    with pytest.raises(ValueError, match="precision fp16 needs a CUDA device; on CPU use bf16 or fp32"):
        resolve_precision("fp16", "cpu")
    with pytest.raises(ValueError, match="precision must be one of default, auto, fp32, bf16, fp16, "
                                         "got 'half'"):
        resolve_precision("half", "cpu")


@pytest.mark.parametrize(("bf16_ok", "expected"), [(True, "bf16"), (False, "fp16")])
def test_default_and_auto_on_cuda_follow_bfloat16_support(
        monkeypatch: pytest.MonkeyPatch, bf16_ok: bool, expected: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16_ok)
    assert resolve_precision("default", "cuda") == expected
    assert resolve_precision("auto", "cuda:0") == expected
    assert resolve_precision("fp16", "cuda") == "fp16"
    assert resolve_precision("fp32", "cuda") == "fp32"


def test_the_table_says_what_each_mode_becomes_and_the_encoder_publishes_it(
        tiny_encoder: Encoder) -> None:
    assert precision_table("cpu") == {
        "default": "fp32", "auto": "fp32", "fp32": "fp32", "bf16": "bf16", "fp16": None}
    modes = tiny_encoder.info["precision_modes"]
    assert modes["default"] == modes["fp32"] == "fp32" and modes["fp16"] is None
    assert (autocast_dtype("fp32"), autocast_dtype("bf16"), autocast_dtype("fp16")) == (
        None, torch.bfloat16, torch.float16)


def test_bf16_and_fp32_requests_for_the_same_text_are_two_cache_entries(
        tiny_model_dir: str, store: FeatureStore) -> None:
    fp32 = Encoder.load(tiny_model_dir, device="cpu", precision="fp32")
    bf16 = Encoder.load(tiny_model_dir, device="cpu", precision="bf16")
    assert (fp32.config.precision, bf16.config.precision) == ("fp32", "bf16")
    texts = ["The cat sat on the mat.", "Unbelievably, don't stop!"]
    a = extract(texts, store, fp32, job_id="fp32")
    b = extract(texts, store, bf16, job_id="bf16")
    assert set(a.keys).isdisjoint(b.keys)
    assert (b.cache_hits, b.texts_encoded, bf16.calls) == (0, 2, 1)  # fp32 rows did not answer
    assert store.catalog.stats()["keys"] == 4
    # each mode is then answered from its own entries, without the model
    again = extract(texts, store, fp32, job_id="fp32-again")
    assert (again.cache_hits, again.keys, fp32.calls) == (2, a.keys, 1)
    # an encoder switched to bf16 shares the weights and makes the bf16 keys
    switched = fp32.with_precision("bf16")
    assert switched.model is fp32.model and switched.config == bf16.config
    assert extract(texts, store, switched, job_id="switched").cache_hits == 2
    assert fp32.with_precision("default") is fp32
    # the numbers really differ (so one must not answer for the other), but not by much
    x = store.read_pooled(a.keys, "mean").data
    y = store.read_pooled(b.keys, "mean").data
    assert not np.array_equal(x, y)
    np.testing.assert_allclose(y, x, rtol=0.1, atol=0.05)


def test_bf16_rows_of_the_bundled_model_are_within_the_documented_tolerance(tmp_path) -> None:  # type: ignore[no-untyped-def]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # shared machine: one thread is the fastest there
    try:
        fp32 = Encoder.load(default_model_path(), device="cpu", precision="fp32")
        bf16 = fp32.with_precision("bf16")
        texts = ["The film is a charming, funny and moving portrait of a family.",
                 "Oil prices rose sharply on Tuesday after the storm shut refineries in the Gulf.",
                 "It #39;s over. I #39;m leaving you for another browser.",
                 "a", "Scientists go back to the drawing board in the search for dark matter."]
        store = FeatureStore(tmp_path / "data")
        a = extract(texts, store, fp32, job_id="fp32")
        b = extract(texts, store, bf16, job_id="bf16")
        for pooling in POOLINGS:
            x = store.read_pooled(a.keys, pooling).data  # [5, 7, 384], float16 storage
            y = store.read_pooled(b.keys, pooling).data
            assert x.shape == y.shape == (5, 7, 384)
            rel = np.linalg.norm(y - x, axis=-1) / np.linalg.norm(x, axis=-1)
            assert rel.max() < BF16_MAX_RELATIVE, (pooling, float(rel.max()))
            assert np.median(rel) < BF16_MEDIAN_RELATIVE, (pooling, float(np.median(rel)))
            assert rel.max() > 1e-3, pooling  # bf16 really ran: float16 storage alone is <= 4e-4
        store.close()
    finally:
        torch.set_num_threads(threads)


def test_rows_past_float16_range_are_refused_not_stored_as_inf(
        tiny_encoder: Encoder, store: FeatureStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # pooled rows are cast to the float16 storage dtype in extraction (a fast
    # torch cast); a value past 65,504 must still be refused by the writer
    from layerbank.cache.shard import StorageRangeError

    real = tiny_encoder.encode

    def huge(batch, want_tokens=False):  # type: ignore[no-untyped-def]
        out = real(batch, want_tokens=want_tokens)
        out.pooled["max"][0, -1, 0] = 70_000.0
        return out

    monkeypatch.setattr(tiny_encoder, "encode", huge)
    with pytest.raises(StorageRangeError, match="overflow float16"):
        extract(["a text", "another text"], store, tiny_encoder, job_id="big")
    assert store.catalog.stats()["keys"] == 0
    # just under the limit is stored, rounded as float16 rounds it (65,000 -> 64,992)
    monkeypatch.setattr(tiny_encoder, "encode", lambda b, want_tokens=False: _with_max(real(b), 65_000.0))
    s = extract(["a text", "another text"], store, tiny_encoder, job_id="ok")
    rows = store.read_pooled(s.keys, "max").data
    assert rows[:, -1, 0].max() == 64_992.0 and np.isfinite(rows).all()


def _with_max(out, value: float):  # type: ignore[no-untyped-def]
    out.pooled["max"][0, -1, 0] = value
    return out

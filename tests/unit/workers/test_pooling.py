"""The pooling functions next to the encoder: one per registered name, each
equal to a plain numpy computation over the real tokens, with right or left
padding; the encoder stores the poolings it is set to, and a text stored
without one of them is encoded again, once, into a shard that holds them all."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from layerbank.cache.poolings import POOLING_NAMES
from layerbank.cache.store import FeatureStore
from layerbank.workers.encoder import Encoder
from layerbank.workers.extract import extract
from layerbank.workers.pooling import POOL_FUNCTIONS, pool_hidden_states


def _reference() -> dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]:
    """name -> f(states [t, d] of ONE text's real tokens in order, positions) -> [d]."""
    return {
        "mean": lambda x, pos: x.mean(axis=0),
        "cls": lambda x, pos: x[0],
        "max": lambda x, pos: x.max(axis=0),
        "last_token": lambda x, pos: x[-1],
    }


REFERENCE = _reference()


def test_every_registered_pooling_has_a_function_and_nothing_else_does() -> None:
    assert tuple(POOL_FUNCTIONS) == POOLING_NAMES
    assert set(REFERENCE) == set(POOLING_NAMES), "every pooling needs a reference computation in this test"


def _batch(padding_side: str) -> tuple[list[torch.Tensor], torch.Tensor, list[np.ndarray]]:
    """3 hidden states of 3 texts (5, 2 and 4 real tokens), padded to 5 on ``padding_side``;
    padding positions hold huge values, so any pooling that reads them shows."""
    rng = np.random.default_rng(0)
    lengths, t, d = [5, 2, 4], 5, 6
    real = [rng.normal(size=(3, n, d)).astype(np.float32) for n in lengths]
    states = np.full((3, len(lengths), t, d), 1e4, dtype=np.float32)
    mask = np.zeros((len(lengths), t), dtype=np.int64)
    for i, n in enumerate(lengths):
        sl = slice(0, n) if padding_side == "right" else slice(t - n, t)
        states[:, i, sl] = real[i]
        mask[i, sl] = 1
    return [torch.from_numpy(s) for s in states], torch.from_numpy(mask), real


# cls is position 0 by definition (the encoder pads on the right), so it is checked on right padding only
@pytest.mark.parametrize(("name", "padding_side"), [(n, side) for n in POOLING_NAMES for side in ("right", "left")
                                                    if (n, side) != ("cls", "left")])
def test_each_pooling_equals_numpy_over_the_real_tokens(name: str, padding_side: str) -> None:
    hidden, mask, real = _batch(padding_side)
    out = pool_hidden_states(hidden, mask, padded=True, names=[name]).numpy()
    assert out.shape == (1, 3, 3, 6)
    for i, x in enumerate(real):
        for layer in range(3):
            want = REFERENCE[name](x[layer], np.arange(x.shape[1]))
            np.testing.assert_allclose(out[0, i, layer], want, rtol=1e-5, atol=1e-5)


def test_pool_hidden_states_keeps_the_order_of_names() -> None:
    hidden, mask, _ = _batch("right")
    both = pool_hidden_states(hidden, mask, names=("max", "mean")).numpy()
    np.testing.assert_array_equal(both[0], pool_hidden_states(hidden, mask, names=["max"]).numpy()[0])
    np.testing.assert_array_equal(both[1], pool_hidden_states(hidden, mask, names=["mean"]).numpy()[0])


def test_the_encoder_stores_the_poolings_it_is_set_to(tiny_model_dir: str, store: FeatureStore) -> None:
    enc = Encoder.load(tiny_model_dir, device="cpu", poolings="max,mean")
    assert enc.poolings == ("max", "mean") and enc.info["poolings"] == ["max", "mean"]
    out = enc.encode(enc.tokenize(["one text", "and a second, longer text"]))
    assert list(out.pooled) == ["max", "mean"]
    extract(["one text"], store, enc, job_id="j")
    (shard,) = store.catalog.shard_names()
    assert store.catalog.shard_info(shard)["poolings"] == ("max", "mean")  # type: ignore[index]


def test_a_text_stored_without_a_pooling_is_encoded_again_only_when_that_pooling_is_set(
        tiny_model_dir: str, store: FeatureStore) -> None:
    texts = ["stored before", "max was", "set here"]
    old = Encoder.load(tiny_model_dir, device="cpu", poolings="mean,cls")
    first = extract(texts, store, old, job_id="old")
    assert first.texts_encoded == 3
    keys = first.keys
    mean_before = store.read_pooled(keys, "mean").data

    # the same poolings again: every text is a hit
    again = Encoder.load(tiny_model_dir, device="cpu", poolings="mean,cls")
    assert extract(texts, store, again, job_id="again").cache_hits == 3 and again.calls == 0
    # mean is read from the store; max is a miss, not an error
    assert store.read_pooled(keys, "max").found.tolist() == [False] * 3

    new = Encoder.load(tiny_model_dir, device="cpu", poolings="mean,cls,max")
    second = extract(texts, store, new, job_id="new")
    assert (second.cache_hits, second.texts_encoded, second.shards_written) == (0, 3, 1)
    third = extract(texts, store, new, job_id="third")
    assert (third.cache_hits, third.texts_encoded) == (3, 0)
    got = store.read_pooled(keys, "max")
    assert got.found.all()
    direct = new.encode(new.tokenize(texts))
    np.testing.assert_allclose(got.data, direct.pooled["max"], rtol=2e-3, atol=2e-3)  # float16 storage
    np.testing.assert_array_equal(store.read_pooled(keys, "mean").data, mean_before)

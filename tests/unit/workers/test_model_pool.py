"""Several encoders in one worker (workers/model_pool.py): loaded on first use,
the least recently used unloaded to stay within the memory budget, the
default and the models running jobs hold never unloaded."""

from __future__ import annotations

import os
from typing import Any

import pytest

from layerbank.workers.encoder import Encoder
from layerbank.workers.model_pool import ModelPool, ServedModel, UnknownModel, encoder_bytes
from layerbank.workers.model_source import locate_model
from tests.tiny_models import save_tiny_bert


@pytest.fixture(scope="module")
def other_dirs(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Three more tiny models, each with weights (and so a fingerprint) of its own."""
    return [save_tiny_bert(tmp_path_factory.mktemp(f"other{i}"), seed=10 + i, hidden=32 + 16 * i, layers=2)
            for i in range(3)]


def make_pool(default: Encoder, dirs: list[str], budget: int | None) -> tuple[ModelPool, list[Any]]:
    registered: list[Any] = []

    def load(entry: ServedModel) -> Encoder:
        return Encoder.load(entry.spec, device="cpu")

    pool = ModelPool(default, [ServedModel(locate_model(d), d) for d in dirs], load=load,
                     budget_bytes=budget, on_load=registered.append)
    return pool, registered


def test_a_model_loads_on_first_use_and_is_registered(tiny_encoder: Encoder, other_dirs: list[str]) -> None:
    pool, registered = make_pool(tiny_encoder, other_dirs[:1], None)
    assert pool.loads == 0 and pool.get() is tiny_encoder and pool.get(None) is tiny_encoder
    enc = pool.get(other_dirs[0])
    assert enc.fingerprint != tiny_encoder.fingerprint and enc.info["hidden_size"] == 32
    assert registered == [enc] and pool.loads == 1
    # by fingerprint or folder name: the same encoder, not a second load
    assert pool.get(enc.fingerprint) is enc and pool.get(os.path.basename(other_dirs[0])) is enc
    assert pool.loads == 1
    desc = {d["fingerprint"]: d for d in pool.describe()}
    assert desc[enc.fingerprint]["loaded"] and desc[enc.fingerprint]["registered"]
    assert desc[tiny_encoder.fingerprint]["default"]


def test_an_unknown_model_is_refused_naming_what_is_served(tiny_encoder: Encoder,
                                                            other_dirs: list[str]) -> None:
    pool, _ = make_pool(tiny_encoder, other_dirs[:1], None)
    with pytest.raises(UnknownModel, match=r"this worker serves .*/other0\d+' .*, not 'bert-large'$"):
        pool.get("bert-large")


def test_least_recently_used_is_unloaded_to_stay_within_the_budget(tiny_encoder: Encoder,
                                                                    other_dirs: list[str]) -> None:
    a, b, c = other_dirs
    sizes = [encoder_bytes(Encoder.load(d, device="cpu")) for d in other_dirs]
    # room for the default and the two largest, not for all three (slack: a model's weight files,
    # what the pool makes room for before loading it, hold a few bytes more than its tensors)
    budget = encoder_bytes(tiny_encoder) + sizes[1] + sizes[2] + sizes[0] // 2
    assert budget < encoder_bytes(tiny_encoder) + sum(sizes)
    pool, _ = make_pool(tiny_encoder, other_dirs, budget)
    enc_a = pool.get(a)
    pool.get(b)
    assert pool.get(a) is enc_a  # a is now the most recently used; b the least
    pool.get(c)
    fps = {d: locate_model(d).fingerprint for d in other_dirs}
    assert list(pool.loaded) == [fps[a], fps[c]], "b, the least recently used, was unloaded"
    assert pool.used_bytes <= budget and pool.unloads == 1
    pool.get(b)  # back again: loaded anew, and a (now the least recent) goes
    assert list(pool.loaded) == [fps[c], fps[b]] and pool.loads == 4 and pool.unloads == 2
    assert pool.get() is tiny_encoder  # the default is never unloaded
    desc = {d["fingerprint"]: d for d in pool.describe()}
    assert not desc[fps[a]]["loaded"] and desc[fps[a]]["registered"], "unloaded, its config still known"


def test_a_model_a_running_job_holds_is_not_unloaded(tiny_encoder: Encoder, other_dirs: list[str]) -> None:
    a, b, _ = other_dirs
    pool, _ = make_pool(tiny_encoder, [a, b], 1)  # a budget nothing fits: only one other at a time
    enc_a = pool.get(a)
    pool.get(b, keep={enc_a.fingerprint})
    assert enc_a.fingerprint in pool.loaded, "held by a job: kept, over the budget for a while"
    pool.get(b)  # the job is over: back within the budget at the next use
    assert list(pool.loaded) == [locate_model(b).fingerprint]
    pool.get(a)
    assert list(pool.loaded) == [enc_a.fingerprint] and pool.unloads == 2

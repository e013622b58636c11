"""A Ray encoder actor confirms the model's fingerprint at load as the worker's pool does
(issue 25 item 2), and a warm pool is replaced when the served model's files changed.

The actor's check (workers/backends/ray_actor.py ``ShardEncoder.__init__``) is
``Encoder.load``'s: the fingerprint of the files (``model_fingerprint``: size and
mtime of each file, the contents hashed when those change), the weights owned,
the files confirmed unchanged after the load; then the actor refuses weights
whose fingerprint is not the one the driver made the keys with. Run here
without Ray (the actor class is plain Python until ``ray.remote`` wraps it).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from layerbank.cache.fingerprint import model_fingerprint
from layerbank.cache.store import FeatureStore
from layerbank.workers.backends.ray_actor import ShardEncoder
from layerbank.workers.backends.ray_backend import encoder_spec
from layerbank.workers.encoder import Encoder
from tests.tiny_models import save_tiny_bert


@pytest.fixture(scope="module")
def two_weights(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two tiny models of one shape and other weights (weight files of the same size)."""
    a = Path(save_tiny_bert(tmp_path_factory.mktemp("actor_a"), seed=31, hidden=32, layers=2))
    b = Path(save_tiny_bert(tmp_path_factory.mktemp("actor_b"), seed=32, hidden=32, layers=2))
    return a, b


def _overwrite_in_place(target: Path, source: Path) -> None:
    """``cat source > target``: same inode, same size, other bytes."""
    data = source.read_bytes()
    with open(target, "r+b") as f:
        f.write(data)
        f.truncate()


def test_an_actor_refuses_weights_other_than_the_drivers(two_weights: tuple[Path, Path], tmp_path: Path,
                                                          store: FeatureStore) -> None:
    a, b = two_weights
    served = tmp_path / "served"
    shutil.copytree(a, served)
    spec = encoder_spec(Encoder.load(os.fspath(served), device="cpu"))  # what the driver's keys are for
    actor = ShardEncoder(spec, store.storage, None, threads=1)
    assert actor.encoder.fingerprint == spec["fingerprint"] == model_fingerprint(os.fspath(a))

    _overwrite_in_place(served / "model.safetensors", b / "model.safetensors")  # a node's files change
    with pytest.raises(RuntimeError, match="install the same model on every node") as e:
        ShardEncoder(spec, store.storage, None, threads=1)
    assert spec["fingerprint"] in str(e.value) and model_fingerprint(os.fspath(b)) in str(e.value)

    _overwrite_in_place(served / "model.safetensors", a / "model.safetensors")  # restored: loads again
    assert ShardEncoder(spec, store.storage, None, threads=1).encoder.fingerprint == spec["fingerprint"]


def test_a_warm_pool_is_replaced_when_the_models_fingerprint_changed(
        two_weights: tuple[Path, Path], tmp_path: Path, store: FeatureStore, monkeypatch: Any) -> None:
    """The worker's pool confirms the files at every job and hands the job the encoder of the
    new fingerprint; the Ray backend must not keep actors that hold the old weights."""
    pytest.importorskip("ray")  # RayBackend asks for the extra when it is made
    import layerbank.workers.backends.ray_backend as ray_backend
    import layerbank.workers.backends.ray_pool as ray_pool
    from layerbank.workers.backends import RayBackend

    started: list[Any] = []

    class FakePool:  # records what the backend asks for; no Ray
        def __init__(self, spec: dict[str, Any], *args: Any, **kwargs: Any) -> None:
            self.spec, self.closed = spec, False
            started.append(self)

        def start(self) -> None:
            pass

        def close(self) -> None:
            self.closed = True

    monkeypatch.setattr(ray_pool, "EncoderPool", FakePool)
    monkeypatch.setattr(ray_backend, "connect", lambda address: False)
    a, b = two_weights
    served = tmp_path / "served"
    shutil.copytree(a, served)
    old = Encoder.load(os.fspath(served), device="cpu")
    backend = RayBackend(store, old)
    first = backend.start(old)
    assert backend.start(old) is first  # same weights: the warm actors are kept
    _overwrite_in_place(served / "model.safetensors", b / "model.safetensors")
    new = Encoder.load(os.fspath(served), device="cpu")  # what ModelPool.confirm loads again
    second = backend.start(new)
    assert first.closed and second is not first
    assert (first.spec["fingerprint"], second.spec["fingerprint"]) == (
        model_fingerprint(os.fspath(a)), model_fingerprint(os.fspath(b)))

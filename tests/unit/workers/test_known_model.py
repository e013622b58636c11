"""The catalog makes the encoder's keys without the encoder (layerbank.workers.known_model).

The contract that makes a cached run safe to answer without torch: for
every setting, the config predicted from the registered model info is the
config ``Encoder.load`` makes, byte for byte (so the keys are the same).
Where it cannot be sure, it says so (None) and the caller loads the encoder.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from layerbank.cache.catalog import Catalog
from layerbank.workers.encoder import Encoder
from layerbank.workers.known_model import expected_config, known_model


def _register(catalog: Catalog, enc: Encoder) -> None:
    # what LocalExtractor.open and the worker store
    catalog.register_model(enc.fingerprint, enc.name, {**enc.info, "config": enc.config.canonical()})


@pytest.mark.parametrize("opts", [
    {},
    {"max_length": 16},
    {"max_length": 10_000},  # past the model's 64 positions: capped, as the encoder does
    {"storage_dtype": "float32"},
    {"precision": "bf16"},
    {"precision": "fp32", "max_length": 8, "storage_dtype": "float32"},
])
def test_the_predicted_config_is_the_one_the_encoder_makes(tiny_model_dir: str, tiny_encoder: Encoder,
                                                           tmp_path: Path, opts: dict) -> None:
    catalog = Catalog(tmp_path / "catalog.sqlite")
    _register(catalog, tiny_encoder)  # registered once, with the default settings
    loaded = Encoder.load(tiny_model_dir, device="cpu", **opts)
    ref = known_model(catalog, tiny_model_dir, tiny_encoder.fingerprint, device="cpu", **opts)
    assert ref is not None
    assert ref.config.canonical() == loaded.config.canonical()
    assert ref.fingerprint == loaded.fingerprint
    assert ref.n_hidden_states == 3 and ref.info["max_length"] == loaded.config.max_length


def test_a_model_never_registered_is_unknown(tiny_encoder: Encoder, tmp_path: Path) -> None:
    catalog = Catalog(tmp_path / "catalog.sqlite")
    assert known_model(catalog, "m", tiny_encoder.fingerprint, device="cpu") is None


def test_what_cannot_be_known_without_torch_is_left_to_the_encoder(tiny_encoder: Encoder) -> None:
    info = {**tiny_encoder.info}
    assert expected_config(info, device="cpu") == tiny_encoder.config
    assert expected_config(info, device="cuda") is None  # registered on the CPU
    assert expected_config(info, device="cpu", precision="fp16") is None  # the encoder says why
    assert expected_config(info, device="cpu", max_length=1) is None  # a bad option: same
    info.pop("model_max_length")  # a catalog row from before the field existed
    assert expected_config(info, device="cpu") is None


def test_cpu_auto_precision_is_known_only_from_a_measured_registration(
        tiny_model_dir: str, tiny_encoder: Encoder, tmp_path: Path) -> None:
    # auto is measured at load on a CPU (bf16 against fp32, stored in the data directory):
    # a row registered without that measurement cannot say what auto resolves to
    catalog = Catalog(tmp_path / "catalog.sqlite")
    _register(catalog, tiny_encoder)
    assert known_model(catalog, tiny_model_dir, tiny_encoder.fingerprint, device="cpu",
                       precision="auto") is None
    measured = Encoder.load(tiny_model_dir, device="cpu", precision="auto", data_dir=tmp_path / "data")
    _register(catalog, measured)
    ref = known_model(catalog, tiny_model_dir, measured.fingerprint, device="cpu", precision="auto")
    again = Encoder.load(tiny_model_dir, device="cpu", precision="auto", data_dir=tmp_path / "data")
    assert ref is not None and again.info["precision_choice"]["reused"]
    assert ref.config.canonical() == measured.config.canonical() == again.config.canonical()

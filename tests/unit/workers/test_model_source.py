"""Locating a model without torch and without waiting on a network (layerbank.workers.model_source)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from layerbank.workers.model_source import DEFAULT_MODEL_NAME, ModelLoadError, locate_model


def test_no_name_is_the_embedded_model_with_its_layer_count() -> None:
    src = locate_model(None)
    assert src.display_name == DEFAULT_MODEL_NAME and src.directory is not None
    assert src.n_hidden_states() == 7  # all-MiniLM-L6-v2: 6 layers + embeddings


def test_a_local_directory_gives_its_layer_count(tiny_model_dir: str) -> None:
    src = locate_model(tiny_model_dir)
    assert src.name == tiny_model_dir and src.n_hidden_states() == 3
    assert src.fingerprint.startswith("local:")


def test_a_missing_path_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as e:
        locate_model(str(tmp_path / "nope"))
    missing = str(tmp_path / "nope")
    assert str(e.value) == f"cannot load model {missing!r}: there is no model directory at that path"


def _hub(monkeypatch: pytest.MonkeyPatch, cache: Path, endpoint: str, offline: bool = False) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)


def test_a_hub_id_in_the_local_cache_is_found_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snap = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"num_hidden_layers": 4}))
    (tmp_path / "hub" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--tiny" / "refs" / "main").write_text("abc123")
    _hub(monkeypatch, tmp_path / "hub", "http://127.0.0.1:9")  # unreachable: must not be asked
    src = locate_model("org/tiny")
    assert src.from_hf_cache and src.directory == snap and src.n_hidden_states() == 5
    assert src.fingerprint == "hub:org/tiny@main"  # the same keys as when it came from the hub


def test_an_uncached_hub_id_with_the_hub_unreachable_fails_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _hub(monkeypatch, tmp_path / "empty", "http://127.0.0.1:9")  # port 9: connection refused
    t0 = time.perf_counter()
    with pytest.raises(ModelLoadError) as e:
        locate_model("bert-base-uncased")
    assert time.perf_counter() - t0 < 5
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("cannot load model 'bert-base-uncased': not a local directory, "
                                              f"not in the Hugging Face cache ({tmp_path / 'empty'})")
    assert "http://127.0.0.1:9) cannot be reached" in msg
    for how in ("--model /path/to/model", "HF_HOME", "HF_HUB_OFFLINE=1"):
        assert how in msg


def test_offline_mode_does_not_even_try_the_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _hub(monkeypatch, tmp_path / "empty", "http://127.0.0.1:9", offline=True)
    with pytest.raises(ModelLoadError, match="and HF_HUB_OFFLINE is set; give a local directory"):
        locate_model("bert-base-uncased")


def test_a_cached_hub_model_loads_with_the_hub_unreachable(tiny_model_dir: str, tmp_path: Path) -> None:
    # a Hugging Face cache laid out as the hub client writes it, holding the tiny model
    import os
    import shutil
    import subprocess
    import sys

    repo = tmp_path / "hf" / "hub" / "models--org--tiny"
    shutil.copytree(tiny_model_dir, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_ENDPOINT="http://127.0.0.1:9")
    code = ("from layerbank.workers.encoder import Encoder; e = Encoder.load('org/tiny', device='cpu'); "
            "print(e.fingerprint, e.info['n_hidden_states'], e.encode(e.tokenize(['a text'])).n_tokens[0])")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["hub:org/tiny@main", "3", "4"]  # [CLS] a text [SEP]
    assert "127.0.0.1:9" not in r.stderr  # the hub was never asked (it used to retry for 31 s)

"""layerbank.cache.keys and layerbank.cache.fingerprint: what identifies a stored row.

The key is recomputed here with hashlib from its documented definition
(docs/storage.md), so a change to the byte layout, which would orphan every
stored row, fails this test.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerbank.cache.fingerprint import model_fingerprint
from layerbank.cache.keys import ExtractionConfig, text_key


def documented_key(fingerprint: str, config_json: str, text: str) -> str:
    """sha256(len(fp) ":" fp "|" len(cfg) ":" cfg "|" text), all UTF-8, lengths in bytes."""
    fp = fingerprint.encode("utf-8")
    cfg = config_json.encode("utf-8")
    data = b"%d:%s|%d:%s|%s" % (len(fp), fp, len(cfg), cfg, text.encode("utf-8"))
    return hashlib.sha256(data).hexdigest()


def test_key_is_sha256_of_the_length_prefixed_triple() -> None:
    cfg = ExtractionConfig(max_length=512)
    fp = "local:0123456789abcdef0123456789abcdef"
    key = text_key(fp, cfg, "Grüße, world")
    assert key == documented_key(fp, cfg.canonical(), "Grüße, world")
    assert len(key) == 64 and int(key, 16) >= 0
    # a config given as its canonical JSON makes the same key
    assert text_key(fp, cfg.canonical(), "Grüße, world") == key


def test_canonical_config_is_sorted_compact_json_of_every_field() -> None:
    cfg = ExtractionConfig(max_length=128, truncation_side="left", storage_dtype="float32",
                           precision="bf16")
    assert cfg.canonical() == ('{"add_special_tokens":true,"max_length":128,"precision":"bf16",'
                               '"storage_dtype":"float32","truncation_side":"left"}')
    assert ExtractionConfig.from_json(cfg.canonical()) == cfg


@pytest.mark.parametrize("change", [
    {"max_length": 128}, {"truncation_side": "left"}, {"add_special_tokens": False},
    {"storage_dtype": "float32"}, {"precision": "bf16"},
])
def test_every_config_field_changes_the_key(change: dict) -> None:
    base = ExtractionConfig(max_length=512)
    other = dataclasses.replace(base, **change)
    assert text_key("m", base, "a text") != text_key("m", other, "a text")


def test_model_fingerprint_changes_the_key() -> None:
    cfg = ExtractionConfig(max_length=512)
    assert text_key("hub:a@main", cfg, "t") != text_key("hub:a@v2", cfg, "t")


@pytest.mark.parametrize("a, b", [(" a", "a"), ("a ", "a"), ("a\n", "a"), ("A", "a"),
                                  ("caf\u00e9", "cafe\u0301"),  # NFC vs NFD: not normalised
                                  ("a  b", "a b"), ("", " ")])
def test_text_is_hashed_exactly_as_given(a: str, b: str) -> None:
    cfg = ExtractionConfig(max_length=512)
    assert text_key("m", cfg, a) != text_key("m", cfg, b)


def test_lone_surrogates_hash_without_error() -> None:
    # such strings arrive from JSON ("\ud800"); they must not crash key making
    k = text_key("m", ExtractionConfig(), "\ud800x")
    assert k != text_key("m", ExtractionConfig(), "x")


@pytest.mark.parametrize("bad", [{"truncation_side": "middle"}, {"storage_dtype": "int4"},
                                 {"precision": "fp8"}, {"max_length": 1}])
def test_invalid_configs_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        ExtractionConfig(**bad)


def test_separator_inside_a_part_cannot_shift_the_boundary() -> None:
    cfg = "{}"
    assert text_key("a|1:b", cfg, "c") != text_key("a", cfg, "1:b|c")
    assert text_key("a", "x|y", "z") != text_key("a", "x", "y|z")


parts = st.text(alphabet=st.sampled_from("ab|:1 \u00e9"), max_size=6)


@settings(max_examples=500, deadline=None)
@given(st.tuples(parts, parts, parts), st.tuples(parts, parts, parts))
def test_distinct_triples_never_share_a_key(t1: tuple, t2: tuple) -> None:
    # a tiny alphabet full of separators makes near-collisions likely to be tried
    if t1 != t2:
        assert text_key(*t1) != text_key(*t2)
    else:
        assert text_key(*t1) == text_key(*t2)


@settings(max_examples=200, deadline=None)
@given(st.text(), st.text(), st.text())
def test_key_matches_the_documented_definition(fp: str, cfg: str, text: str) -> None:
    assert text_key(fp, cfg, text) == documented_key(fp, cfg, text)


# -- model fingerprints -------------------------------------------------------

def _fake_model(d: Path, weights: bytes, config: dict) -> Path:
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    (d / "model.safetensors").write_bytes(weights)
    (d / "README.md").write_text("not part of the model")
    return d


def test_local_fingerprint_follows_weights_and_config_not_other_files(tmp_path: Path) -> None:
    a = _fake_model(tmp_path / "a", b"\x00" * 64, {"hidden_size": 8})
    b = _fake_model(tmp_path / "b", b"\x00" * 64, {"hidden_size": 8})
    c = _fake_model(tmp_path / "c", b"\x00" * 63 + b"\x01", {"hidden_size": 8})
    d = _fake_model(tmp_path / "d", b"\x00" * 64, {"hidden_size": 16})
    fa = model_fingerprint(str(a))
    assert fa.startswith("local:") and len(fa) == len("local:") + 32
    assert model_fingerprint(str(b)) == fa  # same files elsewhere: same model, same keys
    assert model_fingerprint(str(c)) != fa
    assert model_fingerprint(str(d)) != fa
    (a / "README.md").write_text("edited")
    assert model_fingerprint(str(a)) == fa


def test_retraining_in_place_changes_the_fingerprint(tmp_path: Path) -> None:
    a = _fake_model(tmp_path / "a", b"\x00" * 64, {"hidden_size": 8})
    before = model_fingerprint(str(a))
    (a / "model.safetensors").write_bytes(b"\x01" * 80)
    assert model_fingerprint(str(a)) != before


def test_hub_fingerprint_is_name_and_revision(tmp_path: Path) -> None:
    assert model_fingerprint("bert-base-uncased") == "hub:bert-base-uncased@main"
    assert model_fingerprint("org/model", "abc123") == "hub:org/model@abc123"

"""A model's sentence-transformers recipe: read from its files (cache/sentence_recipe.py)
and served by ``/v1/embeddings`` from the stored rows (app/api/embedding_recipe.py),
on the tiny random encoder with recipe files written next to it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from layerbank.cache.sentence_recipe import read_recipe

ST = "sentence_transformers.models."


def _write(root: Path, modules: list[str] | None, pooling: dict | None = None) -> Path:
    for f in ("modules.json", "1_Pooling/config.json"):
        (root / f).unlink(missing_ok=True)
    if modules is not None:
        entries = [{"idx": i, "name": str(i), "path": {"Pooling": "1_Pooling", "Normalize": "2_Normalize",
                                                      "Dense": "2_Dense"}.get(k, ""), "type": ST + k}
                   for i, k in enumerate(modules)]
        (root / "modules.json").write_text(json.dumps(entries))
    if pooling is not None:
        (root / "1_Pooling").mkdir(exist_ok=True)
        (root / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return root


@pytest.mark.parametrize(("pooling", "want"), [
    ({"word_embedding_dimension": 32, "pooling_mode_mean_tokens": True}, "mean"),
    ({"word_embedding_dimension": 32, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False},
     "cls"),
    ({"pooling_mode_max_tokens": True}, "max"),
    ({"pooling_mode_lasttoken": True, "include_prompt": True}, "last_token"),
    ({"embedding_dimension": 32, "pooling_mode": "cls"}, "cls"),  # sentence-transformers >= 5's format
    ({"embedding_dimension": 32, "pooling_mode": ["lasttoken"]}, "last_token"),
])
def test_each_pooling_mode_maps_to_a_stored_pooling(tmp_path: Path, pooling: dict, want: str) -> None:
    r = read_recipe(_write(tmp_path, ["Transformer", "Pooling", "Normalize"], pooling))
    assert r is not None
    assert (r["view"], r["pooling"], r["normalize"], r["usable"], r["reason"]) == \
        ("layer:-1", want, True, True, None)
    assert r["files"] == [str(tmp_path / "modules.json"), str(tmp_path / "1_Pooling" / "config.json")]
    without = read_recipe(_write(tmp_path, ["Transformer", "Pooling"], pooling))
    assert without is not None and without["normalize"] is False


def test_what_stored_rows_cannot_give_is_said(tmp_path: Path) -> None:
    assert read_recipe(tmp_path) is None and read_recipe(None) is None  # no modules.json: no recipe
    mean = {"pooling_mode_mean_tokens": True}
    cases = [
        (["Transformer", "Pooling", "Dense", "Normalize"], mean, "modules.json holds Dense besides"),
        (["Transformer", "Pooling"], {"pooling_mode_weightedmean_tokens": True},
         "pooling 'weightedmean' is not one layerbank stores"),
        (["Transformer", "Pooling"], {"pooling_mode_mean_sqrt_len_tokens": True},
         "pooling 'mean_sqrt_len_tokens' is not one layerbank stores"),
        (["Transformer", "Pooling"], {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True},
         "turns on 2 poolings (cls, mean)"),
        (["Transformer", "Pooling"], None, "the recipe cannot be read"),
        (["Transformer", "Normalize"], None, "modules.json has no Pooling module"),
    ]
    for modules, pooling, reason in cases:
        r = read_recipe(_write(tmp_path, modules, pooling))
        assert r is not None and r["usable"] is False, modules
        assert reason in r["reason"], (modules, r["reason"])
    (tmp_path / "modules.json").write_text("{not json")
    r = read_recipe(tmp_path)
    assert r is not None and r["usable"] is False and "cannot be read" in r["reason"]


def test_notes_say_what_still_differs(tmp_path: Path) -> None:
    _write(tmp_path, ["Transformer", "Pooling"], {"pooling_mode_mean_tokens": True, "include_prompt": False})
    (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 128, "do_lower_case": true}')
    (tmp_path / "config_sentence_transformers.json").write_text('{"default_prompt_name": "query"}')
    notes = read_recipe(tmp_path)["notes"]  # type: ignore[index]
    assert any("max_seq_length=128" in n for n in notes)
    assert any("lower-cases" in n for n in notes)
    assert any("default prompt 'query' is not prepended" in n for n in notes)
    assert any("include_prompt is false" in n for n in notes)


@pytest.fixture(scope="module")
def tiny_model_dir(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny encoder copied, so that each test writes the recipe it needs beside it
    (the encoder reads it when it loads: tiny_api_factory loads one per app)."""
    out = tmp_path_factory.mktemp("tiny-recipe") / "model"
    shutil.copytree(tiny_model_dir, out)
    return str(out)


def _rows(body: dict) -> np.ndarray:
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float32)


def _features(c, texts: list[str], view: str, pooling: str) -> np.ndarray:  # type: ignore[no-untyped-def]
    return _rows(c.post("/v1/features", json={"texts": texts, "view": view, "pooling": pooling}).json())


def test_the_route_serves_the_recipe_from_stored_rows(tiny_api_factory, tiny_model_dir: str) -> None:  # type: ignore[no-untyped-def]
    _write(Path(tiny_model_dir), ["Transformer", "Pooling", "Normalize"],
           {"word_embedding_dimension": 32, "pooling_mode_cls_token": True})
    api = tiny_api_factory()
    c, texts = api.client, ["a first text", "and a second one"]
    r = c.post("/v1/embeddings", json={"input": texts})
    assert r.status_code == 200, r.text
    calls = api.worker.encoder.calls
    got = _rows(r.json())
    want = _features(c, texts, "layer:-1", "cls")  # the same stored rows: no second encoder pass
    assert api.worker.encoder.calls == calls
    np.testing.assert_allclose(got, want / np.linalg.norm(want, axis=1, keepdims=True), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    from sentence_transformers import SentenceTransformer  # what the recipe means, computed its own way

    st = SentenceTransformer(tiny_model_dir, device="cpu").encode(texts, convert_to_numpy=True)
    assert (np.sum(got * st, axis=1) / np.linalg.norm(st, axis=1)).min() >= 0.999
    # /v1/features keeps its default (layer:-2, mean, unnormalised)
    f = c.post("/v1/features", json={"texts": texts}).json()
    assert (f["view"], f["pooling"]) == ("layer:-2", "mean")
    # each part overridden alone
    raw = _rows(c.post("/v1/embeddings", json={"input": texts, "normalize": False}).json())
    np.testing.assert_array_equal(raw, want)
    mean0 = _rows(c.post("/v1/embeddings", json={"input": texts, "view": "layer:0", "pooling": "mean"}).json())
    w0 = _features(c, texts, "layer:0", "mean")
    np.testing.assert_allclose(mean0, w0 / np.linalg.norm(w0, axis=1, keepdims=True), rtol=1e-6, atol=1e-7)
    e = c.get("/info").json()["models"][0]["embeddings"]
    assert (e["view"], e["pooling"], e["normalize"], e["source"]) == \
        ("layer:-1", "cls", True, "sentence-transformers recipe")
    assert e["files"][0] == str(Path(tiny_model_dir) / "modules.json")


def test_without_a_recipe_the_documented_default(tiny_api_factory, tiny_model_dir: str) -> None:  # type: ignore[no-untyped-def]
    _write(Path(tiny_model_dir), None)
    api = tiny_api_factory()
    c, texts = api.client, ["no recipe here"]
    got = _rows(c.post("/v1/embeddings", json={"input": texts}).json())
    np.testing.assert_array_equal(got, _features(c, texts, "layer:-2", "mean"))
    e = c.get("/info").json()["models"][0]["embeddings"]
    assert (e["view"], e["pooling"], e["normalize"], e["source"]) == ("layer:-2", "mean", False, "server default")
    assert "ships no sentence-transformers recipe" in e["why"]
    norm = _rows(c.post("/v1/embeddings", json={"input": texts, "normalize": True}).json())
    np.testing.assert_allclose(np.linalg.norm(norm, axis=1), 1.0, atol=1e-6)


def test_a_recipe_whose_pooling_is_not_stored_is_a_422_naming_the_setting(  # type: ignore[no-untyped-def]
        tiny_api_factory, tiny_model_dir: str) -> None:
    _write(Path(tiny_model_dir), ["Transformer", "Pooling"], {"pooling_mode_lasttoken": True})
    c = tiny_api_factory().client  # stores mean, cls, max
    r = c.post("/v1/embeddings", json={"input": ["a text"]})
    assert r.status_code == 422
    err = r.json()["error"]
    assert err["param"] == "pooling" and "--poolings mean,cls,max,last_token" in err["message"], err
    assert c.post("/v1/embeddings", json={"input": ["a text"], "pooling": "mean"}).status_code == 200


def test_a_recipe_whose_pooling_is_stored_is_served(  # type: ignore[no-untyped-def]
        tiny_api_factory, tiny_model_dir: str) -> None:
    # a test of its own: in the PostgreSQL pass a test's apps share one schema (and its job
    # queue), so a second app beside the first would be a replica with other shards and poolings
    _write(Path(tiny_model_dir), ["Transformer", "Pooling"], {"pooling_mode_lasttoken": True})
    c2 = tiny_api_factory(poolings="mean,last_token").client
    ok = c2.post("/v1/embeddings", json={"input": ["a text"]})
    assert ok.status_code == 200, ok.text
    np.testing.assert_array_equal(_rows(ok.json()), _features(c2, ["a text"], "layer:-1", "last_token"))


def test_token_ids_are_a_422_that_names_the_langchain_setting(tiny_api) -> None:  # type: ignore[no-untyped-def]
    for ids in ([101, 2023, 102], [[101, 2023, 102], [7, 8]]):
        r = tiny_api.client.post("/v1/embeddings", json={"input": ids})
        assert r.status_code == 422
        err = r.json()["error"]
        assert "token ids are not accepted" in err["message"], err
        assert "check_embedding_ctx_length=False" in err["message"]
        assert (err["param"], err["code"]) == ("input", "validation")

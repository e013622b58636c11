"""Where a model's sentence-transformers recipe is read from: its own directory, or, for a
hub model that ``from_pretrained`` downloaded without them, the few recipe files fetched
into the hub cache (``hf_hub_download`` stubbed here: no network in unit tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import huggingface_hub
import pytest
from huggingface_hub.errors import EntryNotFoundError

from layerbank.cache.sentence_recipe import read_recipe
from layerbank.workers.model_source import ModelSource, recipe_directory


def test_a_local_model_is_read_where_it_is(tmp_path: Path) -> None:
    assert recipe_directory(ModelSource(str(tmp_path), "m", tmp_path)) == tmp_path


def test_a_hub_model_fetches_its_recipe_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = {"modules.json": json.dumps([{"path": "", "type": "sentence_transformers.models.Transformer"},
                                       {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                                       {"path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]),
           "1_Pooling/config.json": json.dumps({"pooling_mode_cls_token": True})}
    asked: list[str] = []

    def download(repo_id: str, filename: str, **_: Any) -> str:
        asked.append(filename)
        if filename not in hub:
            raise EntryNotFoundError(f"{filename} not in {repo_id}")
        out = tmp_path / "snapshot" / filename
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(hub[filename])
        return str(out)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    found = recipe_directory(ModelSource("org/model", "org/model", None))
    assert found == tmp_path / "snapshot"
    assert asked == ["modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
                     "1_Pooling/config.json"]
    r = read_recipe(found)
    assert r is not None and (r["pooling"], r["normalize"], r["usable"]) == ("cls", True, True)

    hub.pop("modules.json")  # a model without a recipe: none, and no error
    assert recipe_directory(ModelSource("org/plain", "org/plain", None)) is None

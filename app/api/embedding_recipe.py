"""What ``/v1/embeddings`` answers for a model: its own sentence embedding
when it ships a sentence-transformers recipe, else the server's default.

An embedding client (the OpenAI SDK, LangChain, llama-index) expects the
vector the model was trained to give: for the bundled all-MiniLM-L6-v2 the
last layer, mean-pooled, L2-normalised, what ``SentenceTransformer.encode``
returns. ``/v1/features`` is a research route and keeps the server's default
view (``layer:-2``, mean, unnormalised). The recipe is read when the worker
loads the model (layerbank.cache.sentence_recipe) and registered with it;
a catalog row registered before recipes were recorded is read here from the
model's directory, when this host has it (JSON only, no torch).

Precedence, field by field: the request's ``view`` / ``pooling`` /
``normalize`` (layerbank extensions), then the recipe, then the server's
default (``normalize`` false).

Example::

    choice = choose(model.info, settings, view=None, pooling=None, normalize=None)
    (choice.view, choice.pooling, choice.normalize)   # ('layer:-1', 'mean', True)
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

from layerbank.app.api.errors import InvalidInput
from layerbank.app.api.settings import Settings
from layerbank.cache.sentence_recipe import read_recipe

__all__ = ["EmbeddingChoice", "choose", "describe", "model_recipe"]

RECIPE = "sentence-transformers recipe"
DEFAULT = "server default"


@dataclass(frozen=True)
class EmbeddingChoice:
    view: str
    pooling: str
    normalize: bool
    source: str  # RECIPE or DEFAULT: where the parts the request left out came from


@functools.lru_cache(maxsize=32)
def _read_path(path: str) -> dict[str, Any] | None:
    return read_recipe(path) if os.path.isdir(path) else None


def model_recipe(info: dict[str, Any]) -> dict[str, Any] | None:
    """The recipe the worker registered for this model (None: it ships none)."""
    if "sentence_recipe" in info:
        recipe = info["sentence_recipe"]
        return recipe if isinstance(recipe, dict) else None
    return _read_path(str(info.get("path") or ""))  # a row from before recipes were recorded


def describe(info: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """``/info``'s ``embeddings`` for one model: what ``/v1/embeddings`` answers and why."""
    recipe = model_recipe(info)
    default = {"view": settings.default_view, "pooling": settings.default_pooling, "normalize": False}
    if recipe is None:
        return {**default, "source": DEFAULT, "files": [],
                "why": "the model ships no sentence-transformers recipe (modules.json)"}
    if not recipe.get("usable"):
        return {**default, "source": DEFAULT, "files": recipe.get("files", []),
                "why": f"its sentence-transformers recipe is not served: {recipe.get('reason')}"}
    out = {"view": recipe["view"], "pooling": recipe["pooling"], "normalize": bool(recipe["normalize"]),
           "source": RECIPE, "files": recipe.get("files", []), "notes": recipe.get("notes", [])}
    if recipe["pooling"] not in settings.pooling_names:
        out["why"] = (f"this server does not store {recipe['pooling']} pooling; /v1/embeddings refuses "
                      "requests that do not choose a pooling until it does (--poolings)")
    return out


def choose(info: dict[str, Any], settings: Settings, *, view: str | None, pooling: str | None,
           normalize: bool | None) -> EmbeddingChoice:
    """The view, pooling and normalisation one request gets; 422 when the recipe's pooling
    is not stored and the request does not name another."""
    d = describe(info, settings)
    if d["source"] == RECIPE and pooling is None and d["pooling"] not in settings.pooling_names:
        raise InvalidInput(f"pooling: this model's sentence-transformers recipe pools with {d['pooling']}, "
                           f"which this server does not store (it stores {', '.join(settings.pooling_names)}); "
                           f"start it with --poolings {','.join((*settings.pooling_names, d['pooling']))}, "
                           "or send pooling= (and normalize=) to choose", field="pooling")
    return EmbeddingChoice(view if view is not None else d["view"],
                           pooling if pooling is not None else d["pooling"],
                           normalize if normalize is not None else d["normalize"], d["source"])

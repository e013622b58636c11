"""Reading a model's tokenizer and weights, and what the encoder says of them.

Shared by the encoder's usual load (workers/encoder.py) and the start on a
checked ONNX export (workers/quick_start.py), which reads the tokenizer now
and the weights only on first use. Each read fails in one line
(``ModelLoadError``), never with a library's traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from layerbank.cache.fingerprint import model_fingerprint
from layerbank.cache.keys import ExtractionConfig
from layerbank.cache.poolings import parse_poolings
from layerbank.cache.sentence_recipe import read_recipe

from .model_pool import own_weights
from .model_source import ModelLoadError, recipe_directory
from .precision import precision_table

__all__ = ["TORCH_FACTS", "encoder_info", "extraction_config", "model_files", "model_max_length",
           "read_model", "read_tokenizer"]

# what the encoder learns of its model from the torch weights; an ONNX check records them
# (workers/engines/onnx.py), so a start on that export needs no torch model
TORCH_FACTS = ("num_layers", "n_hidden_states", "hidden_size", "n_params", "n_bias_params",
               "model_max_length", "architecture", "regimes_layout")


def model_files(source: Any) -> str:
    """What transformers reads the model from: found in the local Hugging Face cache, its
    snapshot directory, so nothing asks the hub (local_files_only still let a lookup of
    adapter_config.json retry for 31 s with the hub unreachable); the fingerprint stays the hub id's."""
    return str(source.directory) if source.from_hf_cache else str(source.name)


def read_tokenizer(files: str, name: str, trust_remote_code: bool) -> Any:
    """The model's fast tokenizer; ModelLoadError in one line when it has none or cannot be read."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(files, use_fast=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"cannot load model {name!r}: {e}") from e
    if not getattr(tok, "is_fast", False):
        raise ModelLoadError(f"model {name!r} has no fast tokenizer; layerbank needs one "
                             "for character offsets and word ids (give a directory with its "
                             "tokenizer.json, or install sentencepiece so transformers can "
                             "convert it)")
    return tok


def read_model(files: str, name: str, fingerprint: str, dev: torch.device, trust_remote_code: bool) -> Any:
    """The model's weights, frozen, on ``dev``; ModelLoadError when they cannot be read or
    are not the ones ``fingerprint`` hashed (rewritten meanwhile)."""
    from transformers import AutoModel  # transformers' modeling code: ~3 s of imports on 2 cores

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if dev.type == "cuda":
        kwargs["attn_implementation"] = "sdpa"
    try:
        model = AutoModel.from_pretrained(files, **kwargs)
    except (OSError, ValueError, KeyError) as e:
        raise ModelLoadError(f"cannot load model {name!r}: {e}") from e
    model.eval().requires_grad_(False).to(dev)
    if dev.type == "cpu":  # loaded weights are a view of the mapped file: own them (model_pool.py)
        own_weights(model)
    if model_fingerprint(str(name)) != fingerprint:  # rewritten while it loaded: which weights?
        raise ModelLoadError(f"cannot load model {name!r}: its files changed while it loaded; load it again")
    return model


def extraction_config(max_length: int | None, model_max: int, truncation_side: str, storage_dtype: str,
                      precision: str) -> ExtractionConfig:
    return ExtractionConfig(max_length=min(max_length or model_max, model_max),
                            truncation_side=truncation_side, storage_dtype=storage_dtype, precision=precision)


def encoder_info(source: Any, facts: dict[str, Any], cfg: ExtractionConfig, dev: torch.device,
                 storage_dtype: str, poolings: str | Sequence[str], *, described: bool) -> dict[str, Any]:
    """What /info and the catalog say of an encoder; ``facts``: what its torch weights tell."""
    name = str(source.name)
    return {"name": name if described else "all-MiniLM-L6-v2 (embedded)", "path": name,
            **{k: facts[k] for k in TORCH_FACTS if k != "regimes_layout"},
            "max_length": cfg.max_length, "device": dev.type, "precision": cfg.precision,
            "precision_modes": precision_table(dev), "storage_dtype": storage_dtype,
            "poolings": list(parse_poolings(poolings)),
            # what /v1/embeddings answers by default (layerbank.cache.sentence_recipe)
            "sentence_recipe": read_recipe(recipe_directory(source)),
            "regimes_layout": facts["regimes_layout"]}


def model_max_length(model: Any, tok: Any) -> int:
    """The longest input the model can take (position embeddings, tokenizer)."""
    candidates = [getattr(model.config, "max_position_embeddings", None)]
    tmax = getattr(tok, "model_max_length", None)
    if tmax and tmax < 1_000_000:
        candidates.append(tmax)
    vals = [int(c) for c in candidates if c]
    m = min(vals) if vals else 512
    # RoBERTa-style models reserve two positions for the padding offset
    if getattr(model.config, "model_type", "") in ("roberta", "xlm-roberta", "camembert") and m > 512:
        m -= 2
    return m

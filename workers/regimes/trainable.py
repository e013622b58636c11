"""Training regimes: which encoder parameters train, and how many there are.

A regime decides what changes when a head is trained on a frozen BERT-family
encoder. ``configure`` applies it in place (``requires_grad`` flags, and for
``lora`` adapter layers injected with ``peft``) and returns how many encoder
parameters now train; ``expected_trainable`` derives the same number by hand
from the model config, so the two can be checked against each other.

    frozen   nothing in the encoder trains (the head is a probe on features)
    bitfit   every bias term (attention, feed-forward and LayerNorm biases)
    lora     LoRA rank r on the query and value projections: L x 2 x 2 x d x r
    top_k    embeddings and the first N layers frozen, layers N..L-1 train
    gradual  everything, unfrozen from the top (the schedule is finetune's)
    full     everything

The BERT pooler (dense + tanh over [CLS]) is never trained: the head reads the
mean-pooled last hidden state, so the pooler gets no gradient, and counting it
as "trainable" would overstate what a task must store. Counts exclude the
classification head; callers add ``head_params``.

Example::

    >>> n = configure(model, "lora")
    >>> n == expected_trainable("lora", model.config)
    True
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from torch import nn

__all__ = [
    "LORA_RANK",
    "REGIMES",
    "TRAINED_REGIMES",
    "configure",
    "default_top_k",
    "encoder_params",
    "expected_trainable",
    "gradual_groups",
    "head_params",
]

REGIMES = ("frozen", "bitfit", "lora", "top_k", "gradual", "full")
TRAINED_REGIMES = REGIMES[1:]
LORA_RANK = 8
# peft's module names for the query and value projections, by model family.
_LORA_TARGETS = {"distilbert": ["q_lin", "v_lin"]}
_DEFAULT_LORA_TARGETS = ["query", "value"]
_LAYER = re.compile(r"(?:^|\.)layers?\.(\d+)\.")


def _config(model: nn.Module) -> Any:
    return model.config  # type: ignore[union-attr]  # a transformers PreTrainedModel


def _is_pooler(name: str) -> bool:
    return name.startswith("pooler.") or ".pooler." in name


def _layer_index(name: str) -> int | None:
    match = _LAYER.search(name)
    return int(match.group(1)) if match else None


def _is_embedding(name: str) -> bool:
    return name.startswith("embeddings.") or ".embeddings." in name


def _named(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """Every parameter the forward pass uses (the pooler excluded)."""
    return ((n, p) for n, p in model.named_parameters() if not _is_pooler(n))


def default_top_k(config: Any) -> int:
    """How many bottom layers ``top_k`` freezes when the request names none."""
    return int(config.num_hidden_layers) // 2


def _check_top_k(top_k: int | None, n_layers: int) -> int:
    n = n_layers // 2 if top_k is None else int(top_k)
    if not 0 <= n <= n_layers:
        raise ValueError(f"top_k must be in 0..{n_layers} (layers to freeze), got {n}")
    return n


def configure(
    model: nn.Module, regime: str, top_k: int | None = None, lora_rank: int = LORA_RANK
) -> int:
    """Set which parameters of ``model`` (a bare encoder) train; return their count.

    Mutates ``model`` in memory only (for ``lora`` it injects adapter layers);
    nothing is written to disk. ``top_k`` is the number of bottom layers to
    freeze (default half). For ``gradual`` this sets the final, fully unfrozen
    state; the training loop freezes and unfreezes along the schedule.
    """
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; expected one of {REGIMES}")
    n_layers = int(_config(model).num_hidden_layers)
    frozen_below = _check_top_k(top_k, n_layers)
    for _, param in model.named_parameters():
        param.requires_grad_(False)
    if regime == "lora":
        from peft import LoraConfig, inject_adapter_in_model

        targets = _LORA_TARGETS.get(_config(model).model_type, _DEFAULT_LORA_TARGETS)
        # In-place injection (not get_peft_model) keeps the encoder's own class
        # and parameter names, so every regime is handled the same way.
        lora = LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=0.1,
                          target_modules=targets, bias="none")
        inject_adapter_in_model(lora, model)
    for name, param in _named(model):
        layer = _layer_index(name)
        if regime == "bitfit":
            train = name.endswith(".bias") and "lora_" not in name
        elif regime == "lora":
            train = "lora_" in name
        elif regime == "top_k":
            train = layer is not None and layer >= frozen_below
        else:  # gradual, full: everything; frozen: nothing
            train = regime != "frozen"
        param.requires_grad_(train)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def encoder_params(model: nn.Module) -> int:
    """Parameters of the encoder as used (pooler and any adapters excluded)."""
    return sum(p.numel() for n, p in _named(model) if "lora_" not in n)


def head_params(hidden_size: int, n_classes: int) -> int:
    """Weights and biases of the linear head on the pooled state."""
    return hidden_size * n_classes + n_classes


def gradual_groups(model: nn.Module) -> list[list[nn.Parameter]]:
    """Encoder parameters in unfreezing order: top layer first, embeddings last."""
    n_layers = int(_config(model).num_hidden_layers)
    groups: list[list[nn.Parameter]] = [[] for _ in range(n_layers + 1)]
    for name, param in _named(model):
        layer = _layer_index(name)
        if layer is not None:
            groups[n_layers - 1 - layer].append(param)
        elif _is_embedding(name):
            groups[n_layers].append(param)
        else:
            raise ValueError(f"parameter {name!r} is in no layer and not an embedding")
    return groups


def expected_trainable(
    regime: str, config: Any, top_k: int | None = None, lora_rank: int = LORA_RANK
) -> int:
    """Hand-derived trainable encoder parameters of a BERT encoder, from its config.

    With V vocab, P positions, T token types, d hidden, I intermediate, L layers:
    embeddings (V + P + T) d + 2d (LayerNorm); a layer 4(d^2 + d) for Q, K, V
    and the attention output, 2d LayerNorm, (dI + I) + (Id + d) feed-forward,
    2d LayerNorm. Biases: d in the embeddings' LayerNorm, per layer 4d
    (Q, K, V, output) + d (LayerNorm) + I + d (feed-forward) + d (LayerNorm).
    LoRA: per layer 2 projections x 2 matrices (r x d and d x r).
    """
    V, P, T = config.vocab_size, config.max_position_embeddings, config.type_vocab_size
    d, inter, L = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    embeddings = (V + P + T) * d + 2 * d
    layer = 4 * (d * d + d) + 2 * d + (d * inter + inter) + (inter * d + d) + 2 * d
    if regime == "frozen":
        return 0
    if regime == "bitfit":
        return d + L * (4 * d + d + inter + d + d)
    if regime == "lora":
        return L * 2 * 2 * d * lora_rank
    if regime == "top_k":
        return (L - _check_top_k(top_k, L)) * layer
    if regime in ("gradual", "full"):
        return embeddings + L * layer
    raise ValueError(f"unknown regime {regime!r}; expected one of {REGIMES}")

"""Training regimes: which encoder parameters train, and how many there are.

A regime decides what changes when a head is trained on a frozen encoder.
``configure`` applies it in place (``requires_grad`` flags, and for ``lora``
adapter layers injected with ``peft``) and returns how many encoder
parameters now train; ``expected_trainable`` derives the same number by hand
from the model config (``formulas``), or, for a family with no formula, from
the module tree (``tree_trainable``), so the two can be checked against each
other. Where the layers, embeddings and query/value projections are comes
from the family's layout (``families.describe``): BERT's names are one case.

    frozen   nothing in the encoder trains (the head is a probe on features)
    bitfit   every bias term (attention, feed-forward and LayerNorm biases)
    bitfit_query  the biases of the attention query projections only (BitFit's
             smallest variant: L x d for BERT; ModernBERT has none)
    lora     LoRA rank r on the family's query and value projections
             (ModernBERT: its fused Wqkv): L x 2 x 2 x d x r
    top_k    embeddings and the first N layers frozen, layers N..L-1 train
             (and what sits above the last layer, e.g. ModernBERT's final_norm)
    gradual  everything, unfrozen from the top (the schedule is finetune's)
    full     everything

ALBERT shares one layer across all positions: ``top_k`` trains it when
N < L, ``gradual`` thaws it in one step, then the embeddings (families.py).
The pooler (dense + tanh over [CLS]) is never trained: the head reads the
mean-pooled last hidden state, so the pooler gets no gradient, and counting
it as "trainable" would overstate what a task must store. Counts exclude
the classification head; callers add ``head_params``. A model whose layers
or projections cannot be found raises ``families.UnmappableModel`` (one
line naming what is missing) before anything is changed.

Example::

    >>> n = configure(model, "lora")
    >>> n == expected_trainable("lora", model.config)
    True
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch import nn

from layerbank.regime_names import REGIMES, TRAINED_REGIMES
from layerbank.workers.regimes.families import Layout, describe, require
from layerbank.workers.regimes.formulas import formula

__all__ = [
    "LORA_RANK",
    "REGIMES",
    "TRAINED_REGIMES",
    "configure",
    "default_top_k",
    "depth_groups",
    "encoder_params",
    "expected_trainable",
    "gradual_groups",
    "head_params",
    "tree_trainable",
]

LORA_RANK = 8  # REGIMES, TRAINED_REGIMES: layerbank.regime_names (torch-free, shared with the HTTP layer)


def _named(model: nn.Module, layout: Layout) -> Iterator[tuple[str, nn.Parameter]]:
    """Every parameter the forward pass uses (the pooler excluded)."""
    return ((n, p) for n, p in model.named_parameters() if layout.place(n)[0] != "unused")


def default_top_k(config: Any) -> int:
    """How many bottom layers ``top_k`` freezes when the request names none."""
    return int(config.num_hidden_layers) // 2


def _check_top_k(top_k: int | None, n_layers: int) -> int:
    n = n_layers // 2 if top_k is None else int(top_k)
    if not 0 <= n <= n_layers:
        raise ValueError(f"top_k must be in 0..{n_layers} (layers to freeze), got {n}")
    return n


def _trains(layout: Layout, regime: str, name: str, frozen_below: int) -> bool:
    """Whether ``name`` (a base parameter, not an adapter) trains under ``regime``."""
    kind, block = layout.place(name)
    if kind == "unused" or regime in ("frozen", "lora"):
        return False
    if regime == "bitfit":
        return name.endswith(".bias")
    if regime == "bitfit_query":
        return name.endswith(".bias") and name[: -len(".bias")] in layout.query_modules
    if regime == "top_k":  # a block trains when it computes any position above the cut
        if kind == "layer":
            assert block is not None
            return layout.top_position(block) >= frozen_below
        return kind == "top" and frozen_below < layout.n_layers
    return True  # gradual, full


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
    layout = describe(model)
    require(layout, [regime])
    frozen_below = _check_top_k(top_k, layout.n_layers)
    for _, param in model.named_parameters():
        param.requires_grad_(False)
    if regime == "lora":
        from peft import LoraConfig, inject_adapter_in_model

        # In-place injection (not get_peft_model) keeps the encoder's own class
        # and parameter names, so every regime is handled the same way; the
        # family's exact module names, so nothing else that is called "query" is hit.
        lora = LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=0.1,
                          target_modules=list(layout.lora_modules), bias="none")
        inject_adapter_in_model(lora, model)
    for name, param in model.named_parameters():
        param.requires_grad_("lora_" in name if regime == "lora" else
                             "lora_" not in name and _trains(layout, regime, name, frozen_below))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def tree_trainable(model: nn.Module, regime: str, top_k: int | None = None,
                   lora_rank: int = LORA_RANK) -> int:
    """The count ``configure`` should reach, read off the module tree (no flags set, no adapters)."""
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; expected one of {REGIMES}")
    layout = describe(model)
    require(layout, [regime])
    frozen_below = _check_top_k(top_k, layout.n_layers)
    if regime == "lora":  # A: r x in, B: out x r, per adapted Linear
        return sum(lora_rank * (m.in_features + m.out_features) for n, m in model.named_modules()
                   if n in set(layout.lora_modules) and isinstance(m, nn.Linear))
    return sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n
               and _trains(layout, regime, n, frozen_below))


def encoder_params(model: nn.Module) -> int:
    """Parameters of the encoder as used (pooler and any adapters excluded)."""
    return sum(p.numel() for n, p in _named(model, describe(model)) if "lora_" not in n)


def head_params(hidden_size: int, n_classes: int) -> int:
    """Weights and biases of the linear head on the pooled state."""
    return hidden_size * n_classes + n_classes


def gradual_groups(model: nn.Module) -> list[list[nn.Parameter]]:
    """Encoder parameters in unfreezing order: top layer first, embeddings last.

    A block goes with the highest layer position it computes (ALBERT's one
    shared layer: the top one), what sits above the last layer with the top
    layer; groups left empty by shared layers are dropped."""
    return [g for g in depth_groups(model, "gradual") if g]


def depth_groups(model: nn.Module, regime: str = "full") -> list[list[nn.Parameter]]:
    """Encoder parameters by depth below the top: index 0 the top layer (and what sits above
    it), index L - 1 layer 0, index L the embeddings; a discriminative rate ``lr * xi ** index``
    is ULMFiT's and Sun et al.'s ``lr_top * xi ** (L - l)`` with layers l = 1..L and the
    embeddings as layer 0. Groups may be empty (ALBERT's shared layer leaves L - 1 empty)."""
    layout = describe(model)
    require(layout, [regime])
    n_layers = layout.n_layers
    groups: list[list[nn.Parameter]] = [[] for _ in range(n_layers + 1)]
    for name, param in _named(model, layout):
        kind, block = layout.place(name)
        if kind == "layer":
            assert block is not None
            groups[n_layers - 1 - layout.top_position(block)].append(param)
        elif kind == "top":
            groups[0].append(param)
        else:  # embeddings (require() has ruled out parameters with no place)
            groups[n_layers].append(param)
    return groups


def expected_trainable(
    regime: str, config: Any, top_k: int | None = None, lora_rank: int = LORA_RANK,
    model: nn.Module | None = None,
) -> int:
    """Hand-derived trainable encoder parameters, from the config (``formulas``).

    For a family with no formula, the count read off ``model``'s module tree
    (``tree_trainable``); without a model that is a ValueError.
    BERT, with V vocab, P positions, T token types, d hidden, I intermediate, L layers:
    embeddings (V + P + T) d + 2d (LayerNorm); a layer 4(d^2 + d) for Q, K, V
    and the attention output, 2d LayerNorm, (dI + I) + (Id + d) feed-forward,
    2d LayerNorm. Biases: d in the embeddings' LayerNorm, per layer 4d
    (Q, K, V, output) + d (LayerNorm) + I + d (feed-forward) + d (LayerNorm).
    LoRA: per layer 2 projections x 2 matrices (r x d and d x r).
    """
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; expected one of {REGIMES}")
    k = _check_top_k(top_k, int(config.num_hidden_layers))
    count = formula(regime, config, k, lora_rank)
    if count is not None:
        return count
    if model is None:
        raise ValueError(f"no formula for model_type {getattr(config, 'model_type', None)!r}: "
                         "pass the model to count from its module tree")
    return tree_trainable(model, regime, k, lora_rank)

"""Trainable parameter counts derived by hand from a config, one formula per family.

``trainable.configure`` counts what it set to train; these formulas derive
the same number from the config's sizes alone, so a regimes result can say
``matches_formula`` (the two agree) and docs/regimes.md can print the counts
of each family's base-size model (scripts/regimes_table.py) without loading
it. Symbols: V vocabulary, P positions, T token types, E embedding width,
d hidden, I intermediate, L layers, r LoRA rank, k layers ``top_k`` freezes.

A BERT-style layer (BERT, RoBERTa, XLM-R, ELECTRA, DistilBERT, ALBERT's
shared one, MPNet, DeBERTa-v2 with ``share_att_key``) is
``layer = 4(d^2 + d) + 2d + (dI + I) + (Id + d) + 2d`` (Q, K, V, output;
LayerNorm; feed-forward in and out; LayerNorm) with ``4d + d + I + d + d``
biases. What differs is around the layers (``FORMULAS[...]`` docstrings).
``bitfit_query`` is L d everywhere a layer has its own query bias (ALBERT: its
shared layers once; ModernBERT's fused Wqkv: none, 0).
Counts exclude the pooler (never trained) and the classification head.
``None`` from ``formula`` means the family has no formula here: the count is
then checked against the module tree (``trainable.tree_trainable``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["FORMULAS", "formula"]

Counts = dict[str, int]  # part -> parameters: "embeddings", "layer", "layer_biases", "embedding_biases", ...


def _bert_layer(d: int, inter: int) -> tuple[int, int]:
    return 4 * (d * d + d) + 2 * d + (d * inter + inter) + (inter * d + d) + 2 * d, 4 * d + d + inter + d + d


def _regime(regime: str, L: int, k: int, layer: int, emb: int, layer_biases: int, emb_biases: int,
            lora_per_layer: int, top: int = 0, query_bias: int = 0) -> int:
    if regime == "frozen":
        return 0
    if regime == "bitfit_query":  # one query bias of d per layer
        return L * query_bias
    if regime == "bitfit":
        return emb_biases + L * layer_biases
    if regime == "lora":
        return L * lora_per_layer
    if regime == "top_k":
        return (L - k) * layer + (top if k < L else 0)
    if regime in ("gradual", "full"):
        return emb + L * layer + top
    raise ValueError(f"unknown regime {regime!r}")


def bert(regime: str, c: Any, k: int, r: int) -> int:
    """BERT, RoBERTa, XLM-R, ELECTRA: embeddings (V + P + T) E + 2E; ELECTRA with E != d adds
    embeddings_project dE + d (d of it a bias). bitfit: E + L (4d + d + I + d + d).
    lora: L x 2 x (dr + rd). top_k: (L - k) layer. full: embeddings + L layer."""
    d, inter, L = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    E = getattr(c, "embedding_size", d) or d
    T = getattr(c, "type_vocab_size", 0) or 0
    emb = (c.vocab_size + c.max_position_embeddings + T) * E + 2 * E
    emb_biases = E
    if c.model_type == "electra" and E != d:
        emb, emb_biases = emb + d * E + d, emb_biases + d
    layer, biases = _bert_layer(d, inter)
    return _regime(regime, L, k, layer, emb, biases, emb_biases, 2 * 2 * d * r, query_bias=d)


def distilbert(regime: str, c: Any, k: int, r: int) -> int:
    """DistilBERT: BERT's layer under other names, no token types: embeddings (V + P) d + 2d."""
    d, inter, L = c.dim, c.hidden_dim, c.n_layers
    layer, biases = _bert_layer(d, inter)
    return _regime(regime, L, k, layer, (c.vocab_size + c.max_position_embeddings) * d + 2 * d, biases, d,
                   2 * 2 * d * r, query_bias=d)


def albert(regime: str, c: Any, k: int, r: int) -> int:
    """ALBERT: G = num_hidden_groups groups of n = inner_group_num layers, group g computing
    positions g L/G .. (g+1) L/G - 1. Embeddings (V + P + T) E + 2E + embedding_hidden_mapping_in
    (dE + d). bitfit: E + d + G n (4d + d + I + d + d). lora: G n x 2 x 2dr (the shared layer is
    adapted once). top_k: n layer x (groups computing a position >= k). full: embeddings + G n layer."""
    d, inter, L, E = c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.embedding_size
    G, n = c.num_hidden_groups, c.inner_group_num
    emb = (c.vocab_size + c.max_position_embeddings + c.type_vocab_size) * E + 2 * E + d * E + d
    layer, biases = _bert_layer(d, inter)
    if regime == "top_k":
        per = L // G
        return n * layer * sum(1 for g in range(G) if (g + 1) * per - 1 >= k)
    if regime in ("gradual", "full"):
        return emb + G * n * layer
    if regime == "bitfit":
        return E + d + G * n * biases
    if regime == "lora":
        return G * n * 2 * 2 * d * r
    if regime == "bitfit_query":  # the shared layers' query biases, once
        return G * n * d
    return _regime(regime, L, k, layer, emb, biases, 0, 0)


def deberta_v2(regime: str, c: Any, k: int, r: int) -> int:
    """DeBERTa-v2/v3: word embeddings V E (+ P E when position_biased_input, + T E when T > 0)
    + 2E LayerNorm (+ embed_proj dE, no bias, when E != d); relative position embeddings
    2 R d (R = position_buckets, or max_relative_positions) + their LayerNorm 2d; a BERT layer
    (+ pos_key_proj / pos_query_proj d^2 + d each without share_att_key). bitfit: E + d + L
    (4d + d + I + d + d). lora: L x 2 x 2dr on query_proj, value_proj."""
    d, inter, L = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    E = getattr(c, "embedding_size", None) or d
    emb = c.vocab_size * E + 2 * E
    if getattr(c, "position_biased_input", True):
        emb += c.max_position_embeddings * E
    if c.type_vocab_size > 0:
        emb += c.type_vocab_size * E
    if E != d:
        emb += d * E
    emb_biases = E
    layer, biases = _bert_layer(d, inter)
    if getattr(c, "relative_attention", False):
        buckets = getattr(c, "position_buckets", -1)
        span = getattr(c, "max_relative_positions", -1)
        span = c.max_position_embeddings if span < 1 else span
        emb += 2 * (buckets if buckets > 0 else span) * d
        if "layer_norm" in str(getattr(c, "norm_rel_ebd", "none")).lower():
            emb, emb_biases = emb + 2 * d, emb_biases + d
        if not getattr(c, "share_att_key", False):
            kinds = [str(t).lower() for t in (c.pos_att_type or [])]
            extra = ("c2p" in kinds) + ("p2c" in kinds)
            layer, biases = layer + extra * (d * d + d), biases + extra * d
    return _regime(regime, L, k, layer, emb, biases, emb_biases, 2 * 2 * d * r, query_bias=d)


def mpnet(regime: str, c: Any, k: int, r: int) -> int:
    """MPNet: embeddings (V + P) d + 2d (no token types) + the shared relative attention bias
    (buckets x heads, no bias term); a BERT layer. bitfit: d + L (4d + d + I + d + d)."""
    d, inter, L = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    emb = (c.vocab_size + c.max_position_embeddings) * d + 2 * d \
        + c.relative_attention_num_buckets * c.num_attention_heads
    layer, biases = _bert_layer(d, inter)
    return _regime(regime, L, k, layer, emb, biases, d, 2 * 2 * d * r, query_bias=d)


def modernbert(regime: str, c: Any, k: int, r: int) -> int:
    """ModernBERT: embeddings V d + a norm (d, + d with norm_bias); layer i: an attention norm
    (not in layer 0), Wqkv 3d^2, Wo d^2 (+ 3d + d with attention_bias), an MLP norm, Wi 2dI, Wo Id
    (+ 2I + d with mlp_bias); final_norm above the last layer (trains with it). bitfit: every
    bias, none by default. lora: L x (dr + 3dr) on the fused Wqkv. top_k: layers k..L-1 + final_norm."""
    d, inter, L = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    nb, ab, mb = bool(c.norm_bias), bool(c.attention_bias), bool(c.mlp_bias)
    norm, norm_b = d + d * nb, d * nb
    attn = 4 * d * d + 4 * d * ab
    mlp = 2 * d * inter + inter * d + (2 * inter + d) * mb
    attn_b, mlp_b = 4 * d * ab, (2 * inter + d) * mb

    def layer(i: int) -> int:
        return (norm if i else 0) + attn + norm + mlp

    def layer_biases(i: int) -> int:
        return (norm_b if i else 0) + attn_b + norm_b + mlp_b

    if regime == "frozen":
        return 0
    if regime == "bitfit":
        return norm_b + sum(layer_biases(i) for i in range(L)) + norm_b
    if regime == "bitfit_query":  # fused Wqkv: no query bias of its own (without attention_bias, none)
        return 0
    if regime == "lora":
        return L * (d * r + 3 * d * r)
    if regime == "top_k":
        return sum(layer(i) for i in range(k, L)) + (norm if k < L else 0)
    if regime in ("gradual", "full"):
        return c.vocab_size * d + norm + sum(layer(i) for i in range(L)) + norm
    raise ValueError(f"unknown regime {regime!r}")


FORMULAS: dict[str, Callable[[str, Any, int, int], int]] = {
    "bert": bert, "roberta": bert, "xlm-roberta": bert, "camembert": bert, "electra": bert,
    "distilbert": distilbert, "albert": albert, "deberta-v2": deberta_v2, "mpnet": mpnet,
    "modernbert": modernbert,
}


def formula(regime: str, config: Any, k: int, r: int) -> int | None:
    """The family's hand-derived count, or None when ``config.model_type`` has no formula here."""
    fn = FORMULAS.get(str(getattr(config, "model_type", "")))
    return None if fn is None else int(fn(regime, config, k, r))

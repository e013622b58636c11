"""docs/regimes.md's per-family tables: what each regime trains, and how many parameters,
for each family's base-size model, from its config alone.

Each model is built from its config (the published base sizes, written out in
``BASE`` so nothing is downloaded) on PyTorch's ``meta`` device, so a
250k-vocabulary XLM-R costs no memory; the counts are read off its module tree
(``trainable.tree_trainable``, the layout of ``workers/regimes/families.py``)
and checked against the family's hand-derived formula
(``workers/regimes/formulas.py``): the script stops if the two disagree.

    .venv/bin/python scripts/regimes_table.py            # print the tables (Markdown)
    .venv/bin/python scripts/regimes_table.py --write    # replace them in docs/regimes.md

Takes a few seconds (building the configs' meta models).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "regimes.md"
BEGIN, END = "<!-- families:begin (scripts/regimes_table.py) -->", "<!-- families:end -->"

_BERT_BASE = {"vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2, "hidden_size": 768,
              "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12}
# (title, model_type, config keys): the published base configs' sizes
BASE: list[tuple[str, str, dict[str, Any]]] = [
    ("BERT (bert-base-uncased)", "bert", _BERT_BASE),
    ("RoBERTa (roberta-base)", "roberta",
     {**_BERT_BASE, "vocab_size": 50265, "max_position_embeddings": 514, "type_vocab_size": 1,
      "pad_token_id": 1}),
    ("XLM-R (xlm-roberta-base)", "xlm-roberta",
     {**_BERT_BASE, "vocab_size": 250002, "max_position_embeddings": 514, "type_vocab_size": 1,
      "pad_token_id": 1}),
    ("DistilBERT (distilbert-base-uncased)", "distilbert",
     {"vocab_size": 30522, "max_position_embeddings": 512, "dim": 768, "hidden_dim": 3072, "n_layers": 6,
      "n_heads": 12}),
    ("ALBERT (albert-base-v2)", "albert",
     {**_BERT_BASE, "vocab_size": 30000, "embedding_size": 128, "num_hidden_groups": 1,
      "inner_group_num": 1}),
    ("ELECTRA (electra-base-discriminator)", "electra", {**_BERT_BASE, "embedding_size": 768}),
    ("ELECTRA (electra-small-discriminator: narrower embeddings, so embeddings_project)", "electra",
     {**_BERT_BASE, "embedding_size": 128, "hidden_size": 256, "intermediate_size": 1024,
      "num_attention_heads": 4}),
    ("DeBERTa-v2 (deberta-v3-base)", "deberta-v2",
     {**_BERT_BASE, "vocab_size": 128100, "type_vocab_size": 0, "relative_attention": True,
      "position_buckets": 256, "max_relative_positions": -1, "norm_rel_ebd": "layer_norm",
      "share_att_key": True, "pos_att_type": ["p2c", "c2p"], "position_biased_input": False}),
    ("MPNet (mpnet-base)", "mpnet",
     {**_BERT_BASE, "vocab_size": 30527, "max_position_embeddings": 514, "relative_attention_num_buckets": 32,
      "pad_token_id": 1}),
    ("ModernBERT (ModernBERT-base)", "modernbert",
     {"vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22,
      "num_attention_heads": 12, "max_position_embeddings": 8192, "global_attn_every_n_layers": 3,
      "local_attention": 128, "norm_bias": False, "attention_bias": False, "mlp_bias": False,
      "pad_token_id": 50283}),
]


def _what(regime: str, layout: Any, k: int, n_bias: int, layout_params: list[tuple[str, Any]]) -> str:
    L, layers = layout.n_layers, f"`{layout.layers}`"
    suffixes = sorted({n.split(".", len(layout.layers.split(".")) + 1)[-1] for n in layout.lora_modules})
    shared = len(layout.positions) == 1 and L > 1
    if regime == "frozen":
        return "nothing: a probe on the stored mean-pooled states"
    if regime == "bitfit":
        return f"every bias ({n_bias} tensors)" if n_bias else "nothing: the family has no bias terms (the head alone)"
    if regime == "bitfit_query":
        names = sorted({n.split(".", len(layout.layers.split(".")) + 1)[-1] for n in layout.query_modules})
        return (f"the query biases ({', '.join(f'`{q}.bias`' for q in names)})" if names else
                "nothing: no query bias of its own (fused Q/K/V; the head alone)")
    if regime == "lora":
        where = "the one shared layer" if shared else f"each of the {L} layers"
        return f"LoRA r = 8 on {', '.join(f'`{s}`' for s in suffixes)} in {where}"
    if regime == "top_k":
        if shared:
            return f"the shared layer (it computes positions 0..{L - 1}; trains whenever k < L)"
        top = " + " + ", ".join(f"`{t}`" for t in layout.top) if layout.top else ""
        return f"layers {k}..{L - 1} of {layers}{top}; embeddings and layers 0..{k - 1} frozen (k = {k})"
    steps = 2 if shared else L + 1
    if regime == "gradual":
        return f"everything, thawed from the top in {steps} steps (embeddings last)"
    names = [n for n, _ in layout_params]
    placed = [p for p in layout.embeddings if p != "embeddings" and any(n.startswith(p + ".") for n in names)]
    extra = f" (with {', '.join(f'`{p}`' for p in placed)} placed with the embeddings)" if placed else ""
    return f"everything: embeddings + {layers}{extra}" + (" + " + ", ".join(f"`{t}`" for t in layout.top)
                                                           if layout.top else "")


def family_table(title: str, model_type: str, keys: dict[str, Any]) -> str:
    import torch
    from transformers import AutoConfig, AutoModel

    from layerbank.workers.regimes.families import describe
    from layerbank.workers.regimes.formulas import FORMULAS, formula
    from layerbank.workers.regimes.trainable import LORA_RANK, REGIMES, default_top_k, tree_trainable

    config = AutoConfig.for_model(model_type, **keys)
    with torch.device("meta"):
        model = AutoModel.from_config(config)
    layout = describe(model)
    k = default_top_k(config)
    total = tree_trainable(model, "full", k)
    n_bias = sum(1 for n, _ in model.named_parameters() if n.endswith(".bias") and layout.place(n)[0] != "unused")
    lines = [f"### {title}", "",
             f"L = {layout.n_layers} layers at `{layout.layers}`, d = {config.hidden_size}; "
             f"{total:,} encoder parameters (pooler excluded)." + (f" Note: {layout.note}." if layout.note else ""),
             "",
             "| regime | what trains | trainable encoder parameters | share |", "| --- | --- | ---: | ---: |"]
    for regime in REGIMES:
        count = tree_trainable(model, regime, k)
        expected = formula(regime, config, k, LORA_RANK)
        if expected != count:
            sys.exit(f"{title} {regime}: the module tree has {count:,}, the formula says {expected}")
        lines.append(f"| `{regime}` | {_what(regime, layout, k, n_bias, list(model.named_parameters()))} | {count:,} | {count / total:.4%} |")
    doc = " ".join((FORMULAS[model_type].__doc__ or "").split())
    return "\n".join(lines + ["", f"Formula: {doc}", ""])


def tables() -> str:
    return "\n".join(family_table(*row) for row in BASE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"replace the tables in {DOC.relative_to(ROOT)}")
    args = parser.parse_args()
    text = tables()
    if not args.write:
        print(text)
        return 0
    doc = DOC.read_text(encoding="utf-8")
    if BEGIN not in doc or END not in doc:
        sys.exit(f"{DOC} lacks the markers {BEGIN!r} ... {END!r}")
    head, rest = doc.split(BEGIN, 1)
    DOC.write_text(head + BEGIN + "\n\n" + text + "\n" + END + rest.split(END, 1)[1], encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

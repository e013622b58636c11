"""Every regime on every encoder family (tests/families.py): what trains, counted here.

For each family's tiny random model, the trainable count ``configure`` sets
is checked against a count made in this file from ``named_parameters`` by
name patterns written out per family (not by the code under test), against
the family's formula from its config, and LoRA's adapters are checked to sit
on exactly the family's query and value projections. Then all six regimes
run once (one seed, one epoch, 24 SST-2 sentences) through ``run_regimes``.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from layerbank.workers.regimes.run import run_regimes
from layerbank.workers.regimes.trainable import REGIMES, configure, expected_trainable, gradual_groups
from tests.families import FAMILIES, LAYERS
from tests.regimes_data import one_torch_thread

RANK = 8
TOP_K = LAYERS // 2  # the default: bottom half frozen

# per family: the blocks' path (group 2 = index), the query/value projections (full names), what else
# trains above the last layer; written from the modeling files, independently of workers/regimes
_BERT = (r"encoder\.layer\.(\d+)\.", r"encoder\.layer\.\d+\.attention\.self\.(query|value)", ())
SPEC: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "bert": _BERT, "roberta": _BERT, "xlm-roberta": _BERT, "electra": _BERT,
    "distilbert": (r"transformer\.layer\.(\d+)\.", r"transformer\.layer\.\d+\.attention\.(q_lin|v_lin)", ()),
    # one group shared by all positions: its index says nothing about the position
    "albert": (r"encoder\.albert_layer_groups\.(\d+)\.",
               r"encoder\.albert_layer_groups\.0\.albert_layers\.0\.attention\.(query|value)", ()),
    "deberta-v2": (r"encoder\.layer\.(\d+)\.", r"encoder\.layer\.\d+\.attention\.self\.(query_proj|value_proj)",
                   ()),
    "mpnet": (r"encoder\.layer\.(\d+)\.", r"encoder\.layer\.\d+\.attention\.attn\.(q|v)", ()),
    "modernbert": (r"layers\.(\d+)\.", r"layers\.\d+\.attn\.Wqkv", ("final_norm.",)),
}


_one_torch_thread = pytest.fixture(autouse=True)(one_torch_thread)


def _model(family_model_dir: Any, family: str) -> Any:
    from transformers import AutoModel

    return AutoModel.from_pretrained(family_model_dir(family)).eval()


def _by_hand(model: Any, family: str, regime: str) -> int:
    """What ``regime`` should train, from parameter names alone."""
    layer_re, qv_re, top = SPEC[family]
    named = [(n, p.numel()) for n, p in model.named_parameters() if not n.startswith("pooler.")]
    if regime == "frozen":
        return 0
    if regime == "bitfit":
        return sum(k for n, k in named if n.endswith(".bias"))
    if regime == "bitfit_query":  # the query projection's bias (ModernBERT's fused Wqkv has none)
        return sum(k for n, k in named if re.fullmatch(qv_re, n[: -len(".bias")]) and
                   re.search(r"(query|q|q_lin|query_proj)\.bias$", n))
    if regime == "lora":
        return sum(RANK * (m.in_features + m.out_features) for n, m in model.named_modules()
                   if re.fullmatch(qv_re, n))
    if regime == "top_k":
        def above(n: str) -> bool:
            m = re.match(layer_re, n)
            if m is None:
                return n.startswith(top) if top else False
            return family == "albert" or int(m.group(1)) >= TOP_K  # ALBERT's one layer computes the top too
        return sum(k for n, k in named if above(n))
    return sum(k for _, k in named)  # gradual, full: everything but the pooler


@pytest.mark.parametrize("family", FAMILIES)
def test_each_regime_trains_what_the_module_tree_says(family_model_dir: Any, family: str) -> None:
    model = _model(family_model_dir, family)
    for regime in REGIMES:
        body = copy.deepcopy(model)
        n = configure(body, regime, top_k=TOP_K, lora_rank=RANK)
        flagged = sum(p.numel() for p in body.parameters() if p.requires_grad)
        assert n == flagged == _by_hand(model, family, regime), (family, regime)
        assert n == expected_trainable(regime, model.config, top_k=TOP_K, lora_rank=RANK), (family, regime)
        if regime == "lora":  # adapters on the family's q/v modules, and nowhere else
            adapted = {name for name, m in body.named_modules() if hasattr(m, "lora_A")}
            expected = {name for name, _ in model.named_modules() if re.fullmatch(SPEC[family][1], name)}
            assert adapted == expected and expected, (family, sorted(adapted)[:4])
            assert all("lora_" in name for name, p in body.named_parameters() if p.requires_grad)
    if family == "modernbert":
        assert expected_trainable("bitfit", model.config) == 0  # ModernBERT has no bias terms
    groups = gradual_groups(copy.deepcopy(model))
    # top layer first, embeddings last; ALBERT's shared layer thaws in one step
    assert len(groups) == (2 if family == "albert" else LAYERS + 1)
    assert sum(p.numel() for g in groups for p in g) == _by_hand(model, family, "full")


def _sst2(n: int) -> tuple[list[str], list[str]]:
    lines = (Path(__file__).resolve().parents[3] / "examples" / "sst2_sample.tsv").read_text().splitlines()[1:]
    rows = [line.rsplit("\t", 1) for line in lines]
    pos = [(t.strip(), y) for t, y in rows if y.strip() == "1" and len(t.split()) <= 12][: n // 2]
    neg = [(t.strip(), y) for t, y in rows if y.strip() == "0" and len(t.split()) <= 12][: n // 2]
    texts, labels = zip(*(pos + neg), strict=True)
    return list(texts), [y.strip() for y in labels]


@pytest.mark.parametrize("family", FAMILIES)
def test_all_six_regimes_run_on_every_family(family_model_dir: Any, family: str) -> None:
    texts, labels = _sst2(24)
    result = run_regimes(texts, labels, model_path=family_model_dir(family), regimes=REGIMES, seeds=1, top_k=TOP_K,
                         max_epochs=1, device="cpu", max_length=32)
    rows = result["regimes"]
    assert set(rows) == set(REGIMES)
    assert all(r["matches_formula"] and r["expected_from"] == "formula" for k, r in rows.items()
               if k != "frozen"), {k: (r["encoder_trainable"], r.get("expected_encoder_trainable"))
                                   for k, r in rows.items()}
    assert all(0.0 <= r["macro_f1_mean"] <= 1.0 for r in rows.values())
    assert result["model"]["layout"]["source"] == "registered"
    assert result["model"]["layout"]["unavailable"] == {}

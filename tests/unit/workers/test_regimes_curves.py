"""The regimes' curves (issue 27): layer cut, crossover, layerwise updates, xi, bitfit_query.

Counts are made here from parameter names (not by the code under test); the
verdicts are checked on results constructed by hand, with the figure worked
out in the comment next to each assertion.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import torch

from layerbank.regime_names import default_cuts, variants
from layerbank.workers.regimes.curves import crossover, layer_cut
from layerbank.workers.regimes.finetune import SequenceClassifier, TrainSettings, make_optimizer, rate_groups
from layerbank.workers.regimes.run import run_regimes
from layerbank.workers.regimes.trainable import configure, expected_trainable
from tests.regimes_data import one_torch_thread, random_texts

_one_torch_thread = pytest.fixture(autouse=True)(one_torch_thread)


def _layer(name: str) -> int | None:
    m = re.match(r"encoder\.layer\.(\d+)\.", name)
    return None if m is None else int(m.group(1))


def test_the_layer_cut_curve_on_the_tiny_model(tiny_model_dir: str) -> None:
    from transformers import AutoModel

    texts, labels = random_texts(48)
    result = run_regimes(texts, labels, model_path=tiny_model_dir, regimes=("top_k", "full"), top_k=[0, 1, 2],
                         seeds=2, max_epochs=1, max_length=16, device="cpu")
    rows = result["regimes"]
    assert list(rows) == ["top_k:0", "top_k:1", "top_k:2", "full"]  # one row per cut
    named = [(n, p.numel()) for n, p in AutoModel.from_pretrained(tiny_model_dir).named_parameters()]
    head = 32 * 2 + 2
    for k in (0, 1, 2):
        row = rows[f"top_k:{k}"]
        by_hand = sum(c for n, c in named if _layer(n) is not None and _layer(n) >= k)  # layers k..L-1
        assert row["encoder_trainable"] == by_hand and row["trainable_params"] == by_hand + head
        assert row["bytes_per_task"] == 4 * (by_hand + head)
        assert row["fine_tuned_layers"] == 2 - k and len(row["runs"]) == 2
        # layerwise updates: exactly 0 where nothing trained, > 0 where something did
        for run in row["runs"]:
            moved = run["layer_updates"]
            assert moved["embeddings"] == 0.0
            assert all(moved[f"layer_{i}"] == 0.0 for i in range(k))
            assert all(moved[f"layer_{i}"] > 0.0 for i in range(k, 2)) and moved["head"] > 0.0
    assert all(rows["full"]["layer_updates"][p] > 0 for p in ("embeddings", "layer_0", "layer_1", "head"))
    cut = result["layer_cut"]
    assert [p["fine_tuned_layers"] for p in cut["points"]] == [0, 1, 2]
    assert [p["trainable_params"] for p in cut["points"]] == [rows[f"top_k:{k}"]["trainable_params"] for k in (2, 1, 0)]
    assert cut["full"]["variant"] == "full" and cut["target"] == pytest.approx(0.9 * rows["full"]["macro_f1_mean"])
    assert "fine-tuned layers" in cut["verdict"] or "no cut reaches" in cut["verdict"]


def _row(mean: float, std: float, k: int | None = None, regime: str = "top_k") -> dict[str, Any]:
    out = {"regime": regime, "xi": None, "macro_f1_mean": mean, "macro_f1_std": std, "trainable_params": 100,
           "bytes_per_task": 400, "runs": [{}, {}, {}]}
    if k is not None:
        out["top_k"] = k
    return out


def test_the_90_percent_verdict_on_a_constructed_result() -> None:
    # 12 layers, full 0.80: 90% is 0.72; 3 fine-tuned layers (top_k:9) is the first at 0.73
    table = {"top_k:12": _row(0.60, 0.01, 12), "top_k:10": _row(0.70, 0.01, 10), "top_k:9": _row(0.73, 0.01, 9),
             "top_k:6": _row(0.81, 0.005, 6), "top_k:3": _row(0.84, 0.005, 3), "top_k:0": _row(0.79, 0.01, 0),
             "full": _row(0.80, 0.01, regime="full")}
    cut = layer_cut(table, 12)
    assert cut is not None
    assert cut["target"] == pytest.approx(0.72) and cut["fewest_layers_at_90"] == 3
    assert cut["fewest_variant"] == "top_k:9"
    # 0.81 and 0.84 beat 0.80; only 0.84 - 0.005 > 0.80 + 0.01 is beyond the spread
    assert cut["beats_full"] == ["top_k:6", "top_k:3"] and cut["beats_full_beyond_noise"] == ["top_k:3"]
    assert "3 of 12 fine-tuned layers" in cut["verdict"] and "top_k:6, top_k:3" in cut["verdict"]
    one = {k: {**v, "macro_f1_std": 0.0, "runs": [{}]} for k, v in table.items()}  # 1 seed: std 0, not a spread
    assert layer_cut(one, 12)["beats_full_beyond_noise"] == [] and "1 seed" in layer_cut(one, 12)["verdict"]
    table["top_k:0"] = _row(0.70, 0.01, 0)
    assert layer_cut({k: v for k, v in table.items() if k in ("top_k:12", "top_k:0", "full")}, 12)[
        "fewest_layers_at_90"] is None


def _block(n: int, ft: float, ft_std: float, fr: float, fr_std: float) -> dict[str, Any]:
    return {"train_size": n, "regimes": {"frozen": _row(fr, fr_std, regime="frozen"),
                                         "lora": _row(ft, ft_std, regime="lora"),
                                         "bitfit": _row(ft - 0.05, 0.0, regime="bitfit")}}


def test_the_crossover_is_interpolated_on_a_constructed_result() -> None:
    # d = lora - frozen: -0.10 at 100, +0.10 at 500 -> crosses at 100 + 400 * 0.10 / 0.20 = 300;
    # spread s = 0.02 + 0.03 = 0.05 at both: d + s = -0.05, 0.15 -> 100 + 400 * 0.05 / 0.20 = 200;
    # d - s = -0.15, 0.05 -> 100 + 400 * 0.15 / 0.20 = 400
    curve = [_block(100, 0.70, 0.02, 0.80, 0.03), _block(500, 0.90, 0.02, 0.80, 0.03)]
    cross = crossover(curve)
    assert cross is not None and cross["regime"] == "lora" and cross["status"] == "crosses"
    assert cross["at"] == pytest.approx(300) and cross["earliest"] == pytest.approx(200)
    assert cross["latest"] == pytest.approx(400)
    assert "about 300 training texts" in cross["verdict"]
    never = crossover([_block(100, 0.70, 0.0, 0.80, 0.0), _block(500, 0.78, 0.0, 0.80, 0.0)])
    assert never is not None and never["status"] == "never" and never["at"] is None
    assert "does not overtake" in never["verdict"] and "100..500" in never["verdict"]
    assert crossover(curve[:1]) is None


def _lrs(model: SequenceClassifier, opt: torch.optim.Optimizer) -> dict[str, float]:
    by_id = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    return {n: by_id[id(p)] for n, p in model.named_parameters() if id(p) in by_id}


@pytest.mark.parametrize(("regime", "k"), [("full", None), ("top_k", 1)])
def test_xi_sets_each_layers_rate(tiny_model_dir: str, regime: str, k: int | None) -> None:
    from transformers import AutoModel

    body = AutoModel.from_pretrained(tiny_model_dir)
    configure(body, regime, top_k=k)
    model = SequenceClassifier(body, 2)
    s = TrainSettings(regime=regime, lr=1e-3, head_lr=5e-3, top_k=k, xi=0.5)
    lrs = _lrs(model, make_optimizer(model, s, rate_groups(body, s)))
    # L = 2: layer l (1..2) at 1e-3 * 0.5 ** (2 - l); the embeddings (layer 0) at 0.5 ** 2
    for name, lr in lrs.items():
        if name.startswith("head."):
            assert lr == 5e-3
        elif name.startswith("encoder.embeddings."):
            assert lr == pytest.approx(1e-3 * 0.25)
        else:
            assert lr == pytest.approx(1e-3 * 0.5 ** (1 - _layer(name[len("encoder."):])))  # type: ignore[operator]
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(lrs) == trained  # nothing frozen is handed to the optimizer
    # gradual keeps ULMFiT's 2.6 by default
    g = SequenceClassifier(AutoModel.from_pretrained(tiny_model_dir), 2)
    gs = TrainSettings(regime="gradual", lr=1e-3)
    assert sorted({round(x, 12) for x in _lrs(g, make_optimizer(g, gs, rate_groups(g.encoder, gs))).values()}) == \
        sorted({round(1e-3 / 2.6**i, 12) for i in range(3)} | {1e-3})


def test_an_xi_sweep_is_one_row_per_value(tiny_model_dir: str) -> None:
    texts, labels = random_texts(40)
    result = run_regimes(texts, labels, model_path=tiny_model_dir, regimes=("full",), xi=[0.5, 1.0], seeds=1,
                         max_epochs=1, max_length=16, device="cpu")
    assert list(result["regimes"]) == ["full:xi=0.5", "full:xi=1"]
    (sweep,) = result["xi_sweep"]
    assert [p["xi"] for p in sweep["points"]] == [0.5, 1.0] and sweep["regime"] == "full"


def test_default_cuts_and_variant_names() -> None:
    assert default_cuts(6) == [0, 1, 2, 3, 4, 5, 6] and default_cuts(24) == list(range(0, 25, 2))
    assert [v.key for v in variants(["top_k"], 6, top_k=3)] == ["top_k"]
    with pytest.raises(ValueError, match="0..6"):
        variants(["top_k"], 6, top_k=[7])


QUERY = {"bert": r"encoder\.layer\.\d+\.attention\.self\.query\.bias",
         "distilbert": r"transformer\.layer\.\d+\.attention\.q_lin\.bias",
         "deberta-v2": r"encoder\.layer\.\d+\.attention\.self\.query_proj\.bias"}


@pytest.mark.parametrize("family", sorted(QUERY))
def test_bitfit_query_trains_exactly_the_query_biases(family_model_dir: Any, family: str) -> None:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(family_model_dir(family))
    expected = {n for n, _ in model.named_parameters() if re.fullmatch(QUERY[family], n)}
    body = copy.deepcopy(model)
    n = configure(body, "bitfit_query")
    assert {name for name, p in body.named_parameters() if p.requires_grad} == expected and len(expected) == 3
    assert n == 3 * model.config.hidden_size if family != "distilbert" else n == 3 * model.config.dim
    assert n == expected_trainable("bitfit_query", model.config)

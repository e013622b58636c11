"""One sentence-probe result for every way in: the HTTP probe job, ``layerbank
probe`` and ``layerbank.Bank.probe`` all return what this returns, so a
notebook, a terminal and a server answer the same question with the same dict.

It is ``run_probe`` (layerbank.app.probes.sweep) on stored states, plus the
recommendation (layerbank.app.probes.advice) and the task's name; the callers
only differ in where the states come from and how progress is shown.

Example::

    result = probe_sentences(states.__getitem__, labels, model=model_summary(info, fp),
                             views=DEFAULT_VIEWS, poolings=["mean", "cls"])
    result["best"], result["recommendation"]["text"]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from layerbank.app.probes.advice import recommend
from layerbank.app.probes.sweep import run_probe

__all__ = ["probe_sentences"]


def probe_sentences(get_states: Callable[[str], np.ndarray], labels: Sequence[Any] | np.ndarray, *,
                    model: dict[str, Any], **options: Any) -> dict[str, Any]:
    """``run_probe(get_states, labels, model_info=model, **options)`` with
    ``recommendation`` and ``task.name`` added. Raises ProbeInputError (a
    ValueError) for bad input, as run_probe does."""
    result = run_probe(get_states, labels, model_info=model, **options)
    try:
        result["recommendation"] = recommend(result, model)
    except ValueError as e:  # a model row registered before n_params was counted
        result["recommendation"] = {"text": f"no recommendation: {e}", "numbers": None}
    result["task"]["name"] = "sentence_classification"
    return result

"""What every probe run shares, wherever it runs: the HTTP job (app/api/probe_jobs/), the
``layerbank probe`` command and ``layerbank.Bank``.

The defaults a request leaves out (views, train sizes), the model summary a result shows, the
seeded train/valid split of a token probe's sentences and the error a job's input raises. They
live here, below the HTTP layer, so that the command line builds a probe's result without
importing FastAPI (app/api/probe_jobs/requests.py re-exports them for the routes).

Example::

    train_idx, valid_idx = split_sentences(1000, 0.2, seed=0)
    summary = model_summary(catalog.model_info(fingerprint), fingerprint)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from layerbank.cache.errors import InputError

__all__ = ["DEFAULT_TRAIN_SIZES", "DEFAULT_VIEWS", "MODEL_KEYS", "JobInputError", "model_summary",
           "split_sentences"]

MODEL_KEYS = ("name", "num_layers", "n_hidden_states", "hidden_size", "n_params", "n_bias_params")
DEFAULT_VIEWS = ["each_layer", "concat_last_4", "sum_last_4", "mean_all", "scalar_mix"]
DEFAULT_TRAIN_SIZES = [50, 100, 200, 500, 1000]


class JobInputError(InputError):
    """Input a probe job cannot run on: the job's error text (and a 422 when found up front)."""


def model_summary(info: dict[str, Any] | None, fingerprint: str) -> dict[str, Any]:
    """What layerbank.app.probes.advice and the result show about the model (the catalog's row)."""
    info = info or {}
    return {k: info[k] for k in MODEL_KEYS if k in info} | {"fingerprint": fingerprint}


def split_sentences(n: int, valid_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of ``n`` sentences into (train, valid) indices, each sorted."""
    n_valid = round(n * valid_fraction)
    if n_valid < 1 or n - n_valid < 1:
        raise JobInputError(f"valid_fraction {valid_fraction} of {n} sentences leaves "
                            f"{n - n_valid} for training and {n_valid} for validation; both need one")
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[n_valid:]), np.sort(order[:n_valid])

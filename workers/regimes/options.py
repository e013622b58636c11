"""What a regimes comparison trains and how: one options object instead of a score of arguments.

``RegimesOptions`` holds the choices (which regimes, seeds, training sizes,
split, epochs, learning rates, head start) and where it runs (``device``,
``max_length``); ``run_regimes`` takes it next to the data (texts, labels,
model, cached features, output directory) and the hooks that report
(progress, stage, cancel). The HTTP request model (app/api/routes/regimes.py)
checks a request and becomes the job's payload; ``from_payload`` reads that
payload back, so the job and the CLI hand ``run_regimes`` the same object.

No torch here: importing it costs nothing.

Example::

    opts = RegimesOptions(regimes=("frozen", "lora"), seeds=2, train_sizes=(100, 400))
    run_regimes(texts, labels, opts, model_path=path, progress=print)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["RegimesOptions", "default_seeds"]

# The seed rule: the fewer training texts, the more seeds, because the spread
# between runs grows as the training set shrinks (Chen et al. 2022 needed
# 10-20 runs per arm to rank parameter-efficient methods on small sets;
# Dodge et al. 2020 showed seed-to-seed swings of several points at a few
# hundred examples). ceil(SEED_BUDGET / n), kept within [MIN_SEEDS, MAX_SEEDS]:
# 100 texts -> 10 seeds, 200 -> 8, 500 -> 3, 1,000 or more -> 2.
SEED_BUDGET, MIN_SEEDS, MAX_SEEDS = 1500, 2, 10


def default_seeds(n_train: int) -> int:
    """How many seeds the rule gives a training set of ``n_train`` texts."""
    return max(MIN_SEEDS, min(MAX_SEEDS, -(-SEED_BUDGET // max(1, int(n_train)))))


@dataclass(frozen=True)
class RegimesOptions:
    """A regimes comparison; see ``layerbank.workers.regimes.run.run_regimes``."""

    regimes: Sequence[str] | None = None  # None: every regime (layerbank.regime_names.REGIMES)
    # a count (0..n-1), the seeds themselves, or None: ``default_seeds`` of each training size
    seeds: int | Sequence[int] | None = None
    # bottom layers the top_k regime freezes, or a list of cut points (None: every layer count
    # 0..L up to 12 layers, every other above: layerbank.regime_names.default_cuts)
    top_k: int | Sequence[int] | None = None
    # per-layer rate factor of full, top_k, gradual (lr of layer l = lr * xi ** (L - l)), or a
    # list to sweep (None: gradual 1/2.6, the others one rate)
    xi: float | Sequence[float] | None = None
    train_sizes: Sequence[int] | None = None  # a learning curve over these sizes (None: all rows)
    split_seed: int = 0
    test_size: float = 0.2
    val_size: float = 0.1
    max_epochs: int | Mapping[int, int] = 10  # or per train size
    patience: int = 2
    batch_size: int = 16
    lr: float | Mapping[str, float] | None = None  # None: run.DEFAULT_LR
    head_lr: float = 1e-3
    max_length: int = 128
    device: str = "auto"
    head_init: str = "probe"  # or "random"
    # what ``frozen_features`` were stored as: the frozen probe's noise floor (layerbank.linear_probe)
    storage_dtype: str = "float16"

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any], **where: Any) -> RegimesOptions:
        """The options a regimes job's payload asks for; ``where``: device, max_length, storage_dtype."""
        names = {f.name for f in fields(cls)}
        given = {k: v for k, v in payload.items() if k in names and v is not None}
        return cls(**{**given, **where})

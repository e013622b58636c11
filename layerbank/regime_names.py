"""The regimes' names, and the defaults of their curves, in one torch-free place.

``variants`` expands a request into the runs each seed trains: ``top_k`` once
per cut point (rows ``top_k:k``, k = bottom layers frozen; plain ``top_k``
when there is one cut) and, with several ``xi`` values, ``full``, ``top_k``
and ``gradual`` once per value (rows ``full:xi=0.9``, ``top_k:3:xi=0.9``).

The HTTP layer (app/api, which never imports ``layerbank.workers``), the CLI
and the worker's training code (workers/regimes/trainable.py, which imports
torch) all read the regime names from here, so adding a regime is one edit.

    frozen        the probe on cached features
    bitfit        every bias term (Ben Zaken et al. 2022)
    bitfit_query  the attention query projections' biases only (BitFit's smallest variant)
    lora          LoRA on the query and value projections
    top_k         embeddings and the bottom k layers frozen (Lee et al.'s layer cut)
    gradual       ULMFiT's gradual unfreezing with discriminative rates
    full          everything

Example::

    >>> from layerbank.regime_names import REGIMES, default_cuts
    >>> default_cuts(6)
    [0, 1, 2, 3, 4, 5, 6]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["GRADUAL_XI", "MAX_VARIANTS", "REGIMES", "TRAINED_REGIMES", "XI_REGIMES", "Variant",
           "default_cuts", "variants"]

REGIMES = ("frozen", "bitfit", "bitfit_query", "lora", "top_k", "gradual", "full")
TRAINED_REGIMES = REGIMES[1:]
# the regimes whose layers can learn at per-layer rates (lr of layer l = lr_top * xi ** (L - l))
XI_REGIMES = ("top_k", "gradual", "full")
GRADUAL_XI = 1 / 2.6  # ULMFiT: each lower layer's rate is the one above / 2.6
# fine-tunes per seed and training size that one job may ask for (cuts x xi values x regimes):
# each is a training run, and a curve of 60 on a CPU is hours
MAX_VARIANTS = 60


def default_cuts(n_layers: int) -> list[int]:
    """``top_k``'s cut points (bottom layers frozen) when none are given: every layer count
    0..L for models of up to 12 layers, every other one above (L itself always included)."""
    step = 1 if n_layers <= 12 else 2
    return sorted({*range(0, n_layers + 1, step), n_layers})


@dataclass(frozen=True)
class Variant:
    """One row of a regimes result: a regime at one cut point and one rate factor."""

    key: str  # the row's name in the result
    regime: str
    top_k: int | None = None  # bottom layers frozen (top_k only)
    xi: float | None = None  # per-layer rate factor (None: the regime's default)


def _as_list(value: float | Sequence[float] | None) -> list[float] | None:
    if value is None:
        return None
    return [value] if isinstance(value, int | float) else list(value)


def variants(regimes: Sequence[str], n_layers: int, top_k: int | Sequence[int] | None = None,
             xi: float | Sequence[float] | None = None) -> list[Variant]:
    """The rows ``regimes`` expand to on a model of ``n_layers`` (module docstring).

    Raises ValueError for a cut outside 0..L, a rate factor outside (0, 1.5], or more
    than ``MAX_VARIANTS`` rows."""
    given = _as_list(top_k)
    cuts = default_cuts(n_layers) if given is None else sorted(dict.fromkeys(int(k) for k in given))
    bad = [k for k in cuts if not 0 <= k <= n_layers]
    if bad or not cuts:
        raise ValueError(f"top_k must be in 0..{n_layers} (bottom layers to freeze), got {bad or cuts}")
    xis: list[float | None] = list(dict.fromkeys(float(x) for x in _as_list(xi) or [])) or [None]
    if any(x is not None and not 0 < x <= 1.5 for x in xis):
        raise ValueError(f"xi (the per-layer rate factor) must be in (0, 1.5], got {xis}")
    out: list[Variant] = []
    for regime in regimes:
        for x in xis if regime in XI_REGIMES else [None]:
            tag = f":xi={x:g}" if len(xis) > 1 and x is not None else ""
            if regime == "top_k":
                out += [Variant(f"top_k{f':{k}' if len(cuts) > 1 else ''}{tag}", regime, k, x) for k in cuts]
            else:
                out.append(Variant(regime + tag, regime, None, x))
    if len(out) > MAX_VARIANTS:
        raise ValueError(f"{len(out)} runs per seed and training size (regimes x top_k cuts x xi values); "
                         f"at most {MAX_VARIANTS}: give fewer cut points or xi values")
    return out

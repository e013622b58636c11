"""What a probe, head or regimes job will hold in memory, costed before it is queued.

One request could take a host's memory: a 252-layer ``layers:`` view of 4,000
texts with 2,000 classes grew a probe process from 3.8 to 18.6 GB in 30 s
(issue 25). Each job is costed here from the numbers its request fixes (rows,
feature width, classes, folds, views) against ``settings.probe_memory_mb``; over
the budget, the request is a 413 naming the estimate, the budget and what
drives it, and nothing is queued. The pool's processes also run under an
address-space limit derived from the same budget (app/api/probe_jobs/service.py), so an
estimate that was wrong fails its job instead of exhausting the host.

The estimate (float64, 8 bytes, as the heads compute; the larger of the views,
which run one at a time):

    states      rows x hidden states x hidden size x 4   (one pooling, float32)
    features    rows x width x 8 x 4                     (the view, its standardised copy,
                                                          a fold's training rows, slack)
    solver      classes x width x 8 x 24                 (coefficients, gradient and
                                                          L-BFGS's 10 pairs of history)
    scores      rows x classes x 8 x 3

It is an upper-bound-minded estimate, not a measurement: a request just under
the budget may still fail (with the reason) under the process limit.

Example::

    need = probe_bytes(rows=4000, n_states=7, hidden=384, classes=2000, widths=[96768])
    check_memory(need, settings, "this probe", "4000 texts x 96768 features x 2000 classes")
    # TooLarge: this probe would need about 46.3 GB of memory (...); the budget is 8192 MB ...
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["check_memory", "fit_bytes", "probe_bytes", "view_widths"]

_F64 = 8


def fit_bytes(rows: int, width: int, classes: int) -> int:
    """One head fitted on ``rows`` x ``width`` features with ``classes`` classes."""
    k = 1 if classes <= 2 else classes  # a binary logistic head keeps one row of weights
    return _F64 * (4 * rows * width + 24 * k * width + 3 * rows * max(classes, 2))


def probe_bytes(*, rows: int, n_states: int, hidden: int, classes: int, widths: Iterable[int]) -> int:
    """A probe (or a head) over one pooling's states: the states plus its largest view's fit."""
    widest = max(widths, default=hidden)
    return 4 * rows * n_states * hidden + fit_bytes(rows, widest, classes)


def view_widths(views: Iterable[str], n_states: int, hidden: int) -> list[int]:
    """The feature width of each view spec (``scalar_mix``: one hidden state, mixed)."""
    from layerbank.cache.views import parse_view

    out = []
    for spec in views:
        if spec in ("scalar_mix", "each_layer"):
            out.append(hidden)
        else:
            out.append(parse_view(spec).output_dim(n_states, hidden))
    return out


def _size(n: float) -> str:
    return f"{n / 2**30:.1f} GB" if n >= 2**30 else f"{n / 2**20:.0f} MB"


def check_memory(need: int, settings: Any, what: str, drivers: str) -> None:
    """413 (TooLarge) when ``need`` bytes exceed ``settings.probe_memory_mb``; ``drivers``
    says what the estimate comes from (rows, width, classes), for the person to change."""
    from layerbank.app.api.errors import TooLarge

    budget = int(settings.probe_memory_mb) * 2**20
    if need > budget:
        raise TooLarge(f"{what} would need about {_size(need)} of memory ({drivers}); the budget is "
                       f"{settings.probe_memory_mb} MB (setting probe_memory_mb, LAYERBANK_PROBE_MEMORY_MB): "
                       "use fewer layers in a view, fewer classes or fewer texts",
                       limit="probe_memory_mb",
                       extra={"estimate_bytes": int(need), "budget_bytes": budget})

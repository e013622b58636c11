"""Checks on what a probe is asked to run on, with messages a user can act on.

Every failure is a ``ProbeInputError`` (a ``ValueError``; the HTTP layer maps
it to 422) whose message says what is wrong and where: how many labels are
missing and the first index, which class is too small and all the counts,
which view is malformed (the ``layerbank.cache.views`` message, unchanged).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from layerbank.app.probes.heads import ProbeInputError, make_head
from layerbank.cache.views import View, ViewError, parse_view

__all__ = ["ProbeInputError", "check_labels", "check_options", "check_states", "expand_views", "single_layer"]

SPECIAL_VIEWS = ("each_layer", "scalar_mix")


def _is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, str) and not v.strip()) or (isinstance(v, float) and math.isnan(v))


def check_labels(labels: Sequence[Any] | np.ndarray | None, cv: int) -> np.ndarray:
    """Labels as a 1-D array: none missing, two classes or more, each with
    at least ``cv`` examples (one per cross-validation fold)."""
    if labels is None:
        raise ProbeInputError("labels are missing: give one label per text")
    values = list(labels)
    missing = [i for i, v in enumerate(values) if _is_missing(v)]
    if missing:
        raise ProbeInputError(f"{len(missing)} of {len(values)} labels are missing (None, NaN or empty); "
                              f"the first is at index {missing[0]}")
    y = np.asarray(values)
    if y.dtype == object:  # mixed types: compare them as text
        y = y.astype(str)
    if y.ndim != 1:
        raise ProbeInputError(f"labels must be one label per text; got shape {y.shape}")
    classes, counts = np.unique(y, return_counts=True)
    if len(classes) < 2:
        raise ProbeInputError(f"all {len(y)} labels are the same class {classes[0].item()!r}; "
                              "a probe needs at least 2 classes")
    small = [(c.item(), int(k)) for c, k in zip(classes, counts) if k < cv]
    if small:
        # a few names and the count: 2,000 classes listed made a 48 KB message (issue 25)
        if len(small) == 1:
            (c, k), = small
            what = f"class {c!r} has {k} example{'' if k == 1 else 's'}, fewer than"
        else:
            what = (f"{len(small):,} of {len(classes):,} classes ("
                    + _few([f"{c!r}: {k}" for c, k in small]) + ") have fewer examples than")
        counts_text = _few([f"{c.item()!r}: {int(k)}" for c, k in zip(classes, counts)])
        raise ProbeInputError(f"{what} the {cv} cross-validation folds; each class needs at least {cv} "
                              f"(label more, or lower cv). Class counts: {counts_text}")
    return y


def _few(items: list[str], n: int = 5) -> str:
    """The first ``n`` items, then how many more."""
    shown = ", ".join(items[:n])
    return shown if len(items) <= n else f"{shown} and {len(items) - n:,} more"


def _parse(spec: str) -> View:
    try:
        return parse_view(spec)
    except ViewError as e:
        raise ProbeInputError(str(e)) from None


def check_options(*, cv: Any, head: Any, views: Any, poolings: Any) -> None:
    """Everything that can be checked before any hidden state is read."""
    if not isinstance(cv, int) or isinstance(cv, bool) or cv < 2:
        raise ProbeInputError(f"cv must be an integer >= 2 (number of folds); got {cv!r}")
    if head == "scalar_mix":
        raise ProbeInputError("'scalar_mix' reads all hidden states; ask for it as a view, not a head")
    make_head(head)  # raises for an unknown name
    if isinstance(views, str) or not views:
        raise ProbeInputError("views must be a non-empty list, e.g. ['each_layer', 'scalar_mix']")
    if isinstance(poolings, str) or not poolings:
        raise ProbeInputError("poolings must be a non-empty list, e.g. ['mean', 'cls']")
    for spec in views:
        if spec not in SPECIAL_VIEWS:
            _parse(spec)


def check_states(states: Any, n_labels: int, pooling: str) -> np.ndarray:
    """``get_states(pooling)``'s answer as an [n, H, d] array matching the labels."""
    states = np.asarray(states)
    if states.ndim != 3 or len(states) != n_labels:
        raise ProbeInputError(f"pooling {pooling!r}: expected hidden states [n={n_labels}, H, d]; "
                              f"got shape {states.shape}")
    return states


def expand_views(views: Sequence[str], n_states: int) -> list[str]:
    """``each_layer`` as layer:0..layer:L, duplicates dropped, every layer
    checked against the model's ``n_states`` hidden states."""
    out: list[str] = []
    for spec in views:
        new = [f"layer:{k}" for k in range(n_states)] if spec == "each_layer" else [spec]
        out += [s for s in new if s not in out]
    for spec in out:
        if spec != "scalar_mix":
            try:
                _parse(spec).needed_layers(n_states)
            except ViewError as e:
                raise ProbeInputError(str(e)) from None
    return out


def single_layer(spec: str, n_states: int) -> int | None:
    """The hidden state a one-layer view reads (layer:-1 -> L), else None."""
    if spec in SPECIAL_VIEWS:
        return None
    v = _parse(spec)
    return v.layers[0] % n_states if v.kind == "concat" and len(v.layers) == 1 else None

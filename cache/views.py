"""Views: how stored hidden states become one feature vector per text.

Views are never stored; they are computed at read time from the stored
layers ``h_0 .. h_L`` (``H = L + 1`` hidden states, ``h_0`` the embedding
output). The grammar, as a user types it, is ``VIEW_FORMS`` below (one form
per entry with what it gives): ``layer:K`` (negative K counts from the end),
``layers:I,J,...``, ``concat_last_4``, ``sum_last_4``, ``mean_all``,
``weighted:W0,...,WL`` and ``all_layers``.

Example::

    >>> view = parse_view("layer:-2")
    >>> view.needed_layers(7)
    [5]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import InputError

__all__ = ["View", "ViewError", "parse_view", "NAMED_VIEWS", "MAX_VIEW_LAYERS", "VIEW_FORMS", "VIEW_GRAMMAR"]

# The grammar, one form per entry as a user types it, with what it gives. The parser
# below, the API's schema pattern and descriptions, /info, the CLI's help and
# docs/api.md say what this list says (tests/unit/test_registries.py checks them).
VIEW_FORMS: dict[str, str] = {
    "layer:K": "one hidden state; negative K counts from the end (layer:-1 is the last layer)",
    "layers:I,J,...": "concatenation of the named hidden states, in order",
    "concat_last_4": "layers:-4,-3,-2,-1",
    "sum_last_4": "h_{L-3} + ... + h_L",
    "mean_all": "uniform weighted sum of all hidden states",
    "weighted:W0,...,WL": "sum_i W_i * h_i (weights used as given; one per state)",
    "all_layers": "every hidden state, shape [n, H, d] (not flattened)",
}
# the forms without a parameter, and how each is built
_NAMED: dict[str, tuple[str, tuple[int, ...]]] = {
    "concat_last_4": ("concat", (-4, -3, -2, -1)),
    "sum_last_4": ("sum", (-4, -3, -2, -1)),
    "mean_all": ("sum", ()),
    "all_layers": ("all", ()),
}
NAMED_VIEWS = tuple(form for form in VIEW_FORMS if ":" not in form)
# for messages and help texts: "layer:K, layers:I,J,..., ... or all_layers"
VIEW_GRAMMAR = ", ".join(list(VIEW_FORMS)[:-1]) + " or " + list(VIEW_FORMS)[-1]
MAX_VIEW_LAYERS = 256  # entries in layers:I,J,... (repeats allowed)


class ViewError(InputError):
    """A view that cannot be parsed or that names a layer the model lacks (field ``view``)."""

    default_field = "view"


@dataclass(frozen=True)
class View:
    """A parsed view. ``layers`` may hold negative indices until resolved."""

    spec: str
    kind: str  # "concat" | "sum" | "weighted" | "all"
    layers: tuple[int, ...] = ()
    weights: tuple[float, ...] = ()

    def needed_layers(self, n_hidden_states: int) -> list[int]:
        """Absolute indices (0..H-1) of the hidden states this view reads.

        Raises ViewError naming the layers that exist when one is out of range.
        """
        h = n_hidden_states
        if self.kind == "all":
            return list(range(h))
        if self.kind == "weighted":
            if len(self.weights) != h:
                raise ViewError(
                    f"view {self.spec!r} has {len(self.weights)} weights; this model has "
                    f"{h} hidden states 0..{h - 1}, so it needs {h} weights"
                )
            return list(range(h))
        if self.spec == "mean_all":
            return list(range(h))
        out = []
        for k in self.layers:
            if not -h <= k < h:
                raise ViewError(
                    f"layer {k} does not exist; this model has hidden states 0..{h - 1} "
                    f"(negative indices -1..-{h} count from the last)"
                )
            out.append(k % h)
        return out

    def output_dim(self, n_hidden_states: int, hidden_size: int) -> int:
        """Width of one output row (for all_layers: H * d when flattened)."""
        n = len(self.needed_layers(n_hidden_states))
        if self.kind == "concat":
            return n * hidden_size
        if self.kind == "all":
            return n * hidden_size
        return hidden_size

    def combine(self, stack: np.ndarray, n_hidden_states: int) -> np.ndarray:
        """Combine ``stack`` of shape [n, len(needed_layers), d] into the view.

        ``stack[:, i]`` must be hidden state ``needed_layers(H)[i]``. Sums are
        accumulated in float32 whatever the storage dtype.
        """
        stack = np.asarray(stack, dtype=np.float32)
        n = stack.shape[0]
        if self.kind == "all":
            return stack
        if self.kind == "concat":
            return stack.reshape(n, -1)
        if self.kind == "sum":
            if self.spec == "mean_all":
                return stack.mean(axis=1)
            return stack.sum(axis=1)
        # weighted: weights are aligned with needed_layers, which is 0..H-1
        w = np.asarray(self.weights, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            out = np.einsum("nld,l->nd", stack, w).astype(np.float32)
        if not np.isfinite(out).all() and np.isfinite(stack).all():
            # finite weights so large that the sum leaves float32: never serve inf
            raise ViewError(f"view {self.spec!r}: these weights make values too large for "
                            "float32; use smaller weights (e.g. ones that sum to 1)")
        return out

    def apply(self, all_states: np.ndarray) -> np.ndarray:
        """Apply the view to a full [n, H, d] array of hidden states."""
        h = all_states.shape[1]
        return self.combine(all_states[:, self.needed_layers(h)], h)


def _parse_int_list(spec: str, body: str) -> tuple[int, ...]:
    parts = [p.strip() for p in body.split(",")]
    if not body.strip() or any(not p for p in parts):
        raise ViewError(f"view {spec!r}: expected comma-separated layer numbers")
    if len(parts) > MAX_VIEW_LAYERS:
        # each entry adds a hidden state's width to every row: a long list is a memory bomb
        raise ViewError(f"view {spec[:40]!r}...: {len(parts):,} layers; a view names at most "
                        f"{MAX_VIEW_LAYERS}")
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise ViewError(f"view {spec!r}: layer numbers must be integers") from None


# the largest float32 over the largest float16: weights whose absolute sum stays under it
# keep every weighted sum of float16-stored rows finite in float32
_MAX_WEIGHT_SUM = float(np.finfo(np.float32).max) / float(np.finfo(np.float16).max)


def _parse_weights(spec: str, body: str) -> tuple[float, ...]:
    parts = [p.strip() for p in body.split(",")]
    if not body.strip() or any(not p for p in parts):
        raise ViewError(f"view {spec!r}: expected comma-separated weights")
    if len(parts) > MAX_VIEW_LAYERS:
        raise ViewError(f"view {spec[:40]!r}...: {len(parts):,} weights; a view names at most "
                        f"{MAX_VIEW_LAYERS}")
    try:
        weights = tuple(float(p) for p in parts)
    except ValueError:
        raise ViewError(f"view {spec!r}: weights must be numbers") from None
    bad = [w for w in weights if not math.isfinite(w)]
    if bad:
        raise ViewError(f"view {spec!r}: weights must be finite numbers, got {bad[0]}")
    if math.fsum(abs(w) for w in weights) > _MAX_WEIGHT_SUM:
        # refused when parsed, not when the rows are combined, so that every route that
        # takes a view (features, probes, heads) refuses the same view with the same 422
        # before any work is queued, whatever the rows hold
        raise ViewError(f"view {spec[:60]!r}: these weights make values too large for float32 (their "
                        f"absolute values must sum to at most {_MAX_WEIGHT_SUM:.3g}, so that any value "
                        "a float16 shard holds stays finite); use smaller weights (e.g. ones that sum to 1)")
    return weights


def parse_view(spec: str) -> View:
    """Parse a view string; raises ViewError with the reason if malformed."""
    if not isinstance(spec, str):
        raise ViewError("a view must be a string such as 'layer:-2'")
    s = spec.strip()
    if s in _NAMED:
        kind, layers = _NAMED[s]
        return View(s, kind, layers)
    head, sep, body = s.partition(":")
    if sep:
        if head == "layer":
            layers = _parse_int_list(s, body)
            if len(layers) != 1:
                raise ViewError(f"view {spec!r}: layer: takes one layer; use layers:I,J")
            return View(s, "concat", layers)
        if head == "layers":
            return View(s, "concat", _parse_int_list(s, body))
        if head == "weighted":
            return View(s, "weighted", weights=_parse_weights(s, body))
    raise ViewError(f"unknown view {spec!r}; expected {VIEW_GRAMMAR}")

"""Pooling functions: name -> function, next to the encoder that calls them.

The names are ``layerbank.cache.poolings.POOLING_NAMES`` (torch-free, read by
the API and the catalog); this map holds one function per name, and a test
checks that both agree. Each function takes one hidden state as float32
``[n, t, d]`` and the batch's ``TokenMask`` and returns ``[n, d]``.

``pool_hidden_states`` runs the chosen poolings one hidden state at a time,
each cast to float32 on its own, so the largest temporary is one [n, t, d]
layer, never the [n, H, t, d] stack.

Example::

    out = pool_hidden_states(model_out.hidden_states, mask, names=("mean", "max"))
    out.shape   # (2, n, H, d): out[0] is mean, out[1] is max
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property

import torch

from layerbank.cache.poolings import DEFAULT_POOLINGS, parse_poolings

__all__ = ["POOL_FUNCTIONS", "TokenMask", "pool_hidden_states"]


class TokenMask:
    """The attention mask [n, t] (1 on real tokens) and what poolings derive from it, made once per batch."""

    def __init__(self, mask: torch.Tensor, padded: bool = True) -> None:
        self.mask = mask
        self.padded = padded

    @cached_property
    def weights(self) -> torch.Tensor:
        return self.mask.to(torch.float32)[:, None, :]  # [n, 1, t]

    @cached_property
    def counts(self) -> torch.Tensor:
        return self.weights.sum(dim=2).clamp(min=1)  # [n, 1]

    @cached_property
    def last(self) -> torch.Tensor:
        """[n] position of each row's last real token, wherever the padding sits."""
        positions = torch.arange(self.mask.shape[1], device=self.mask.device)
        return (self.mask * positions).argmax(dim=1)

    @cached_property
    def pad(self) -> torch.Tensor | None:
        return (self.mask == 0)[:, :, None] if self.padded else None  # [n, t, 1]


def _mean(h: torch.Tensor, m: TokenMask) -> torch.Tensor:
    # a batched matrix product of the 0/1 mask with the states: float32
    # accumulation, no masked copy of the layer
    return torch.bmm(m.weights, h)[:, 0] / m.counts


def _cls(h: torch.Tensor, m: TokenMask) -> torch.Tensor:
    return h[:, 0]


def _max(h: torch.Tensor, m: TokenMask) -> torch.Tensor:
    # masks padding only when the batch has any
    return (h if m.pad is None else h.masked_fill(m.pad, float("-inf"))).amax(dim=1)


def _last_token(h: torch.Tensor, m: TokenMask) -> torch.Tensor:
    return h[torch.arange(h.shape[0], device=h.device), m.last]


POOL_FUNCTIONS: dict[str, Callable[[torch.Tensor, TokenMask], torch.Tensor]] = {
    "mean": _mean,
    "cls": _cls,
    "max": _max,
    "last_token": _last_token,
}
DEFAULT_NAMES = parse_poolings(DEFAULT_POOLINGS)


def pool_hidden_states(hidden_states: Sequence[torch.Tensor], mask: torch.Tensor,
                       padded: bool = True, names: Sequence[str] = DEFAULT_NAMES) -> torch.Tensor:
    """[len(names), n, H, d] float32: each named pooling of every hidden state over real tokens."""
    n, _, d = hidden_states[0].shape
    fns = [POOL_FUNCTIONS[name] for name in names]
    out = torch.empty((len(fns), n, len(hidden_states), d), dtype=torch.float32, device=mask.device)
    tm = TokenMask(mask, padded)
    for i, h in enumerate(hidden_states):
        h = h.float()
        for j, fn in enumerate(fns):
            out[j, :, i] = fn(h, tm)
    return out

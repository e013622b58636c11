"""Length-sorted batches under a token budget.

A fixed batch count pads short texts to the longest in the batch and runs out
of memory on long ones. Sorting by length and filling each batch up to a
budget of padded tokens (batch size x longest length) keeps padding small and
memory flat, whatever the mix of lengths.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["token_budget_batches"]


def token_budget_batches(lengths: Sequence[int], max_tokens: int,
                         max_batch: int = 512) -> list[list[int]]:
    """Indices grouped into batches, longest first; each batch's padded size
    (len(batch) * longest) stays within ``max_tokens`` (a single text longer
    than the budget gets a batch of its own)."""
    if max_tokens < 1:
        raise ValueError("max_tokens must be positive")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        longest_if = max(longest, lengths[i])
        if cur and (longest_if * (len(cur) + 1) > max_tokens or len(cur) >= max_batch):
            batches.append(cur)
            cur, longest_if = [], lengths[i]
        cur.append(i)
        longest = longest_if
    if cur:
        batches.append(cur)
    return batches

"""layerbank.workers.batching.min_padding_batches: the batching extraction uses.

Same contract as token_budget_batches (every text once, padded size within the
budget, longest first, runs of neighbours in length order), and the cut is the
cheapest one: checked against every possible cut on small inputs.
"""

from __future__ import annotations

from itertools import combinations, pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerbank.workers.batching import (
    batch_cost_tokens,
    default_max_tokens,
    min_padding_batches,
    token_budget_batches,
)


def order_of(lengths: list[int]) -> list[int]:
    return sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))


def cost(lengths: list[int], batches: list[list[int]], per_batch: int) -> int:
    return sum(len(b) * max(lengths[i] for i in b) for b in batches) + per_batch * len(batches)


def test_small_example_by_hand() -> None:
    # two pairs of near-equal lengths: one batch would pad 10 and 9 up to 30
    assert min_padding_batches([30, 29, 10, 9], max_tokens=1000, batch_cost_tokens=8) == [[0, 1], [2, 3]]
    # when a forward pass costs more than the padding, one batch is cheaper
    assert min_padding_batches([30, 29, 10, 9], max_tokens=1000, batch_cost_tokens=100) == [[0, 1, 2, 3]]


def test_no_per_batch_cost_means_no_padding_at_all() -> None:
    lengths = [5, 7, 5, 9, 7, 7, 5]
    batches = min_padding_batches(lengths, max_tokens=1000, batch_cost_tokens=0)
    assert [[lengths[i] for i in b] for b in batches] == [[9], [7, 7, 7], [5, 5, 5]]


def test_budget_max_batch_and_errors() -> None:
    assert min_padding_batches([100, 4, 4], max_tokens=16) == [[0], [1, 2]]
    assert [len(b) for b in min_padding_batches([1] * 10, max_tokens=1000, max_batch=4)] == [4, 4, 2]
    assert min_padding_batches([], 10) == []
    with pytest.raises(ValueError, match="max_tokens must be positive"):
        min_padding_batches([1], 0)


def test_far_less_padding_than_the_greedy_cut_on_spread_lengths() -> None:
    # 200 lengths spread 10..209: greedy fills each batch to the budget whatever the spread
    lengths = [10 + i for i in range(200)]
    real = sum(lengths)

    def padding(batches: list[list[int]]) -> float:
        return 1 - real / sum(len(b) * max(lengths[i] for i in b) for b in batches)

    assert padding(token_budget_batches(lengths, 4096)) > 0.12  # 12.3%, 7 batches
    assert padding(min_padding_batches(lengths, 4096, batch_cost_tokens=64)) < 0.05  # 4.4%, 18


def test_device_defaults() -> None:
    assert (default_max_tokens("cpu"), default_max_tokens("cuda")) == (4096, 16384)
    assert batch_cost_tokens("cpu") < batch_cost_tokens("cuda")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=600), max_size=200),
       st.integers(min_value=1, max_value=5000), st.integers(min_value=1, max_value=64),
       st.integers(min_value=0, max_value=500))
def test_the_contract_holds_for_any_lengths(lengths: list[int], budget: int, max_batch: int,
                                            per_batch: int) -> None:
    batches = min_padding_batches(lengths, budget, max_batch, batch_cost_tokens=per_batch)
    assert [i for b in batches for i in b] == order_of(lengths), "runs of the length order, longest first"
    assert all(b for b in batches)
    for b in batches:
        assert len(b) <= max_batch
        assert len(b) * lengths[b[0]] <= budget or len(b) == 1
    for a, b in pairwise(batches):
        assert lengths[a[-1]] >= lengths[b[0]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=8),
       st.integers(min_value=1, max_value=200), st.integers(min_value=1, max_value=8),
       st.integers(min_value=0, max_value=60))
def test_no_cut_is_cheaper(lengths: list[int], budget: int, max_batch: int, per_batch: int) -> None:
    got = min_padding_batches(lengths, budget, max_batch, batch_cost_tokens=per_batch)
    order = order_of(lengths)
    n = len(order)
    best = None
    for k in range(n):  # every way to cut the sorted order into k + 1 runs
        for cuts in combinations(range(1, n), k):
            bounds = [0, *cuts, n]
            batches = [order[a:b] for a, b in pairwise(bounds)]
            if any(len(b) > max_batch or (len(b) > 1 and len(b) * lengths[b[0]] > budget)
                   for b in batches):
                continue
            c = cost(lengths, batches, per_batch)
            best = c if best is None else min(best, c)
    assert best is not None and cost(lengths, got, per_batch) == best

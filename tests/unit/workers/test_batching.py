"""layerbank.workers.batching.token_budget_batches: padded size within the budget,
every text exactly once, longest first."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerbank.workers.batching import token_budget_batches


def check(lengths: list[int], budget: int, max_batch: int, batches: list[list[int]]) -> None:
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths))), "every index exactly once"
    assert all(b for b in batches), "no empty batch"
    for b in batches:
        padded = len(b) * max(lengths[i] for i in b)
        assert padded <= budget or len(b) == 1, f"batch {b} pads to {padded} > {budget}"
        assert len(b) <= max_batch


def test_small_example_by_hand() -> None:
    lengths = [5, 20, 7, 20, 3, 9]
    batches = token_budget_batches(lengths, max_tokens=40)
    # longest first: 20, 20 (40 tokens) | 9, 7, 5, 3 (4 x 9 = 36)
    assert batches == [[1, 3], [5, 2, 0, 4]]


def test_a_text_longer_than_the_budget_gets_its_own_batch() -> None:
    assert token_budget_batches([100, 4, 4], max_tokens=16) == [[0], [1, 2]]


def test_max_batch_caps_the_count() -> None:
    batches = token_budget_batches([1] * 10, max_tokens=1000, max_batch=4)
    assert [len(b) for b in batches] == [4, 4, 2]


def test_empty_input_and_bad_budget() -> None:
    assert token_budget_batches([], 10) == []
    with pytest.raises(ValueError, match="max_tokens must be positive"):
        token_budget_batches([1], 0)


def test_batches_are_filled_in_order_of_length() -> None:
    # texts are taken longest first, so a batch only mixes neighbours in length order
    lengths = [3, 50, 4, 49, 5, 48]
    batches = token_budget_batches(lengths, max_tokens=100)
    assert [sorted(lengths[i] for i in b) for b in batches] == [[49, 50], [5, 48], [3, 4]]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=600), max_size=200),
       st.integers(min_value=1, max_value=5000), st.integers(min_value=1, max_value=64))
def test_budget_and_coverage_hold_for_any_lengths(lengths: list[int], budget: int, max_batch: int) -> None:
    batches = token_budget_batches(lengths, budget, max_batch)
    check(lengths, budget, max_batch, batches)
    # greedy filling: a batch was closed only because the next text did not fit
    for b, nxt in pairwise(batches):
        longest = max(lengths[i] for i in b + nxt[:1])
        assert len(b) == max_batch or (len(b) + 1) * longest > budget

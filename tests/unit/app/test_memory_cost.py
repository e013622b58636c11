"""What a probe, head or regimes job is costed at before it is queued
(app/api/probe_jobs/memory_cost.py): the estimate's exact figures for small shapes, the
widths of each view form, and the 413's words, limit and figures at the budget's edge.
Pure functions, no app (0.3 s), so the mutation run (bench/mutation.sh) can use it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from layerbank.app.api.errors import TooLarge
from layerbank.app.api.probe_jobs.memory_cost import check_memory, fit_bytes, probe_bytes, view_widths


def test_a_fit_costs_the_features_the_solver_and_the_scores() -> None:
    # 8 bytes x (4 x rows x width + 24 x weight rows x width + 3 x rows x max(classes, 2))
    assert fit_bytes(10, 5, 2) == 8 * (200 + 120 + 60) == 3040  # binary: one row of weights
    assert fit_bytes(10, 5, 1) == 3040  # one class still scores two columns
    assert fit_bytes(10, 5, 3) == 8 * (200 + 360 + 90) == 5200  # a row of weights per class
    assert fit_bytes(1000, 384, 20) == 8 * (4 * 1000 * 384 + 24 * 20 * 384 + 3 * 1000 * 20)


def test_a_probe_costs_its_states_and_its_widest_view() -> None:
    states = 4 * 10 * 7 * 6  # rows x hidden states x hidden size, float32
    assert probe_bytes(rows=10, n_states=7, hidden=6, classes=3, widths=[6, 24, 12]) == states + fit_bytes(10, 24, 3)
    assert probe_bytes(rows=10, n_states=7, hidden=6, classes=3, widths=[]) == states + fit_bytes(10, 6, 3)
    assert probe_bytes(rows=10, n_states=7, hidden=6, classes=2, widths=iter([42])) == states + fit_bytes(10, 42, 2)


def test_each_view_form_has_its_width() -> None:
    views = ["scalar_mix", "each_layer", "layer:2", "layers:0,1,2", "concat_last_4", "all_layers",
             "sum_last_4", "weighted:1,1,1,1,1,1,1"]
    assert view_widths(views, 7, 384) == [384, 384, 384, 1152, 1536, 2688, 384, 384]
    assert view_widths([], 7, 384) == []


def _settings(mb: int) -> SimpleNamespace:
    return SimpleNamespace(probe_memory_mb=mb)


def test_over_the_budget_is_a_413_naming_the_estimate_the_budget_and_what_to_change() -> None:
    with pytest.raises(TooLarge) as e:
        check_memory(100 * 2**20 + 1, _settings(100), "this probe", "40 texts x 8064 features x 40 classes")
    err = e.value
    assert err.status == 413 and err.limit == "probe_memory_mb"
    assert err.message == ("this probe would need about 100 MB of memory (40 texts x 8064 features x 40 classes); "
                           "the budget is 100 MB (setting probe_memory_mb, LAYERBANK_PROBE_MEMORY_MB): "
                           "use fewer layers in a view, fewer classes or fewer texts")
    assert err.extra == {"estimate_bytes": 100 * 2**20 + 1, "budget_bytes": 100 * 2**20}


def test_an_estimate_equal_to_the_budget_is_queued() -> None:
    check_memory(100 * 2**20, _settings(100), "this head", "")
    check_memory(0, _settings(1), "this head", "")


@pytest.mark.parametrize(("need", "words"), [(2**30, "1.0 GB"), (3 * 2**29, "1.5 GB"), (2**30 - 2**21, "1022 MB"),
                                             (46.3 * 2**30, "46.3 GB"), (5 * 2**20 + 2**18, "5 MB")])
def test_the_estimate_is_said_in_mb_under_a_gigabyte_and_in_gb_from_one(need: float, words: str) -> None:
    with pytest.raises(TooLarge) as e:
        check_memory(int(need), _settings(4), "this regimes job", "x")
    assert e.value.message.startswith(f"this regimes job would need about {words} of memory (x); the budget is 4 MB")

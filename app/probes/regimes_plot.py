"""Render a regimes result (``layerbank.workers.regimes.run.run_regimes``) for people.

It lives in app/probes, not next to the training in workers/regimes, because the
API renders stored results and the HTTP layer never imports ``layerbank.workers``.

``format_regimes_table(result)`` is the CLI's table: one block per training
size, a line per regime (macro-F1 and accuracy as mean +- std over seeds,
trainable parameters and share, bytes per task, seconds per epoch, peak
memory), then the verdict. ``regimes_plot_png(result)`` draws test macro-F1
against bytes stored per task (log scale), one point per regime with
standard-deviation error bars, one series per training size.

Neither imports torch (matplotlib only when plotting, Agg backend), so the
API process can render a stored result.

Example::

    >>> print(format_regimes_table(result))
    >>> Path("regimes.png").write_bytes(regimes_plot_png(result))
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

__all__ = ["format_regimes_table", "regimes_plot_png"]


def _blocks(result: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Per training size, smallest first; a result without a curve is one block."""
    return list(result.get("learning_curve") or [result])


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_regimes_table(result: Mapping[str, Any]) -> str:
    """A plain-text table of every regime, per training size, with the verdict."""
    seeds = result.get("settings", {}).get("seeds", [])
    header = (f"{'regime':<8} {'macro-F1':>15} {'accuracy':>15} {'trainable':>11} {'share':>8} "
              f"{'bytes/task':>10} {'s/epoch':>8} {'peak mem':>9}")
    lines = []
    for block in _blocks(result):
        lines.append(f"train size {block['train_size']} ({len(seeds)} seeds; test macro-F1 and "
                     f"accuracy as mean ± std)")
        lines += [header, "-" * len(header)]
        for name, r in block["regimes"].items():
            mark = "*" if name == block["cheapest_within_one_std"] else " "
            lines.append(
                f"{name:<7}{mark} {r['macro_f1_mean']:>7.3f} ± {r['macro_f1_std']:.3f} "
                f"{r['accuracy_mean']:>7.3f} ± {r['accuracy_std']:.3f} {r['trainable_params']:>11,} "
                f"{100 * r['trainable_share']:>7.3f}% {_size(r['bytes_per_task']):>10} "
                f"{r['seconds_per_epoch']:>8.2f} {_size(r['peak_memory_bytes']):>9}")
        lines.append(f"best: {block['best']}; within one std of it: {', '.join(block['within_noise'])}; "
                     f"cheapest of those (*): {block['cheapest_within_one_std']}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def regimes_plot_png(result: Mapping[str, Any]) -> bytes:
    """PNG: test macro-F1 (mean ± std) against bytes stored per task, log x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocks = _blocks(result)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    try:
        for i, block in enumerate(blocks):
            regimes = block["regimes"]
            names = list(regimes)
            last = i == len(blocks) - 1
            ax.errorbar([regimes[n]["bytes_per_task"] for n in names],
                        [regimes[n]["macro_f1_mean"] for n in names],
                        yerr=[regimes[n]["macro_f1_std"] for n in names], fmt="o", capsize=4,
                        alpha=1.0 if last else 0.45, label=f"{block['train_size']} training texts")
            if last:  # label the headline size only, so the names stay readable
                for n in names:
                    tag = n + (" (cheapest within 1 std)" if n == block["cheapest_within_one_std"] else "")
                    ax.annotate(tag, (regimes[n]["bytes_per_task"], regimes[n]["macro_f1_mean"]),
                                textcoords="offset points", xytext=(6, 6), fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("bytes stored per task (float32, log scale)")
        ax.set_ylabel("test macro-F1 (mean ± std over seeds)")
        model = "/".join(PurePath(result.get("model", {}).get("path", "")).parts[-2:])
        ax.set_title(f"Freeze or fine-tune: score against storage per task\n{model}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
        buf = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)

"""The seeds' questions as curves: the layer cut, the rate-factor sweep and the crossover.

Each reads a regimes table (``result.table_row`` rows, with the ``regime``,
``top_k`` and ``xi`` each row was trained with) and states what it shows; no
torch, no training, so a constructed result can be checked by hand.

``layer_cut(table, n_layers)`` (Lee, Tang & Lin, "What Would Elsa Do?"): one
point per ``top_k`` cut (k bottom layers and the embeddings frozen, L - k
fine-tuned) with its score, trainable parameters and bytes per task; the
verdict names the fewest fine-tuned layers whose mean test macro-F1 reaches
90% of ``full``'s mean (their operating point: "a fourth of the final layers
... 90% of the original quality") and every cut whose mean beats ``full``'s,
and whether it does so by more than both one-std spreads.

``xi_sweep(table)`` (Sun et al. 2019): per regime (and cut), one point per
rate factor xi, the best and the whole sweep's range of means.

``crossover(curve)``: over a learning curve (``train_sizes``), where the best
fine-tuned regime (the highest mean at the largest size) overtakes the frozen
probe. d(n) = mean fine-tuned - mean frozen at each measured size; the
crossing is the first size where d goes from <= 0 to > 0, linearly
interpolated between the two measured sizes around it. The seeds' spread: the
same crossing of d(n) + s(n) (``earliest``) and d(n) - s(n) (``latest``), s
the sum of the two one-std spreads; ``latest`` None means that within the
spread it may not overtake within the sizes run.

Example::

    >>> layer_cut(result["regimes"], 6)["fewest_layers_at_90"]
    2
    >>> crossover(result["learning_curve"])["at"]
    640.0
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["FRACTION", "crossover", "layer_cut", "xi_sweep"]

FRACTION = 0.9  # Lee et al.'s operating point: 90% of full fine-tuning's score

Table = Mapping[str, Mapping[str, Any]]


def _point(key: str, row: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    return {"variant": key, **extra, "macro_f1_mean": row["macro_f1_mean"], "macro_f1_std": row["macro_f1_std"],
            "trainable_params": row["trainable_params"], "bytes_per_task": row["bytes_per_task"]}


def _one_seed(table: Table) -> bool:
    return all(len(r.get("runs") or [0]) <= 1 for r in table.values())


def layer_cut(table: Table, n_layers: int) -> dict[str, Any] | None:
    """The layer-cut curve and its verdict (module docstring); None without a ``top_k`` row."""
    cuts = [(k, r) for k, r in table.items() if r.get("regime") == "top_k"]
    if not cuts:
        return None
    xi = cuts[0][1].get("xi")  # with an xi sweep, the curve at the first rate factor
    cuts = [(k, r) for k, r in cuts if r.get("xi") == xi]
    points = sorted((_point(k, r, frozen_layers=int(r["top_k"]), fine_tuned_layers=n_layers - int(r["top_k"]))
                     for k, r in cuts), key=lambda p: p["fine_tuned_layers"])
    full_key = next((k for k, r in table.items() if r.get("regime", k) == "full" and r.get("xi") == xi), None)
    out: dict[str, Any] = {"n_layers": n_layers, "xi": xi, "fraction": FRACTION, "points": points,
                           "full": None, "target": None, "fewest_layers_at_90": None, "beats_full": [],
                           "beats_full_beyond_noise": []}
    if full_key is None:
        out["verdict"] = "no full fine-tuning in this job: add the full regime to compare the cuts with it"
        return out
    full = table[full_key]
    f_mean, f_std = full["macro_f1_mean"], full["macro_f1_std"]
    target = FRACTION * f_mean
    reach = [p for p in points if p["macro_f1_mean"] >= target]
    out.update(full={"variant": full_key, "macro_f1_mean": f_mean, "macro_f1_std": f_std,
                     "trainable_params": full["trainable_params"], "bytes_per_task": full["bytes_per_task"]},
               target=target)
    out["beats_full"] = [p["variant"] for p in points if p["macro_f1_mean"] > f_mean]
    # one seed: every std is 0 by definition, so no gain can be called beyond the spread
    out["beats_full_beyond_noise"] = [] if _one_seed(table) else [
        p["variant"] for p in points if p["macro_f1_mean"] - p["macro_f1_std"] > f_mean + f_std]
    if reach:
        first = reach[0]
        out["fewest_layers_at_90"] = first["fine_tuned_layers"]
        out["fewest_variant"] = first["variant"]
        text = (f"{first['fine_tuned_layers']} of {n_layers} fine-tuned layers ({first['variant']}, "
                f"{first['fine_tuned_layers'] / max(n_layers, 1):.0%} of the layers, "
                f"{first['bytes_per_task']:,} bytes per task) reach {FRACTION:.0%} of full fine-tuning's "
                f"macro-F1 ({first['macro_f1_mean']:.3f} >= {target:.3f}; full {f_mean:.3f})")
        if first["fine_tuned_layers"] == 0:
            text += " (the head alone on the frozen layers: fine-tuning adds less than 10% here)"
    else:
        text = (f"no cut reaches {FRACTION:.0%} of full fine-tuning's macro-F1 ({target:.3f}; full "
                f"{f_mean:.3f})")
    if out["beats_full"]:
        noise = ("; with 1 seed there is no spread to judge it by" if _one_seed(table) else
                 "; by more than the seeds' spread: " + ", ".join(out["beats_full_beyond_noise"])
                 if out["beats_full_beyond_noise"] else
                 "; within the seeds' spread, so not a measured gain")
        text += f". Partial cuts beating full: {', '.join(out['beats_full'])}{noise}"
    out["verdict"] = text
    return out


def xi_sweep(table: Table) -> list[dict[str, Any]]:
    """Per regime (and cut) run at several rate factors: its points, the best, the range."""
    groups: dict[tuple[str, Any], list[tuple[str, Mapping[str, Any]]]] = {}
    for key, row in table.items():
        if row.get("xi") is not None:
            groups.setdefault((row["regime"], row.get("top_k")), []).append((key, row))
    out = []
    for (regime, cut), rows in groups.items():
        if len(rows) < 2:
            continue
        points = sorted((_point(k, r, xi=r["xi"]) for k, r in rows), key=lambda p: p["xi"])
        means = [p["macro_f1_mean"] for p in points]
        best = max(points, key=lambda p: p["macro_f1_mean"])
        out.append({"regime": regime, "top_k": cut, "points": points, "best_xi": best["xi"],
                    "best_variant": best["variant"], "range": max(means) - min(means),
                    "verdict": f"{regime}{'' if cut is None else f' ({cut} frozen)'}: best xi {best['xi']:g} "
                               f"({best['macro_f1_mean']:.3f}); the whole sweep spans "
                               f"{max(means) - min(means):.3f} macro-F1"})
    return out


def _cross(sizes: Sequence[float], diffs: Sequence[float]) -> float | None:
    """The first size where ``diffs`` goes from <= 0 to > 0, linearly interpolated; the
    smallest size when it is > 0 from the start; None when it never is."""
    if diffs[0] > 0:
        return float(sizes[0])
    for (n0, d0), (n1, d1) in zip(zip(sizes, diffs), zip(sizes[1:], diffs[1:])):
        if d0 <= 0 < d1:
            return float(n0 + (n1 - n0) * (-d0) / (d1 - d0))
    return None


def crossover(curve: Sequence[Mapping[str, Any]], frozen: str = "frozen") -> dict[str, Any] | None:
    """Where the best fine-tuned regime overtakes ``frozen`` (module docstring); None without
    two sizes, the frozen probe and one fine-tuned regime."""
    if len(curve) < 2 or frozen not in curve[-1]["regimes"]:
        return None
    last = curve[-1]["regimes"]
    trained = [k for k, r in last.items() if r.get("regime", k) != "frozen"]
    if not trained:
        return None
    best = max(trained, key=lambda k: last[k]["macro_f1_mean"])
    blocks = [b for b in curve if best in b["regimes"] and frozen in b["regimes"]]
    sizes = [b["train_size"] for b in blocks]
    d = [b["regimes"][best]["macro_f1_mean"] - b["regimes"][frozen]["macro_f1_mean"] for b in blocks]
    s = [b["regimes"][best]["macro_f1_std"] + b["regimes"][frozen]["macro_f1_std"] for b in blocks]
    at = _cross(sizes, d)
    earliest = _cross(sizes, [x + y for x, y in zip(d, s)])
    latest = _cross(sizes, [x - y for x, y in zip(d, s)])
    out: dict[str, Any] = {"regime": best, "frozen": frozen, "sizes": sizes, "difference": d, "spread": s,
                           "at": at, "earliest": earliest, "latest": latest}
    span = f"{sizes[0]}..{sizes[-1]}"
    if at is None:
        out["status"] = "never"
        text = f"{best} does not overtake the frozen probe within the sizes run ({span} training texts)"
    elif d[0] > 0:
        out["status"] = "ahead_throughout"
        text = f"{best} is ahead of the frozen probe from the smallest size run ({sizes[0]} training texts)"
    else:
        out["status"] = "crosses"
        text = f"{best} overtakes the frozen probe at about {at:.0f} training texts (interpolated)"
    if earliest is not None and latest is None:
        text += (f"; within the seeds' one-std spread it may be as early as {earliest:.0f}, or not "
                 f"overtake at all within {span}")
    elif earliest is not None and latest is not None and at is not None:
        text += f"; within the seeds' one-std spread: between {earliest:.0f} and {latest:.0f}"
    if at is not None and d[-1] <= 0:
        text += f"; but it is behind again at {sizes[-1]}"
    out["verdict"] = text
    return out

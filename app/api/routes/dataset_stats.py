"""What a dataset holds, at a glance: ``GET /v1/datasets/{id}/stats``.

The lab's dataset page draws the label distribution and the token-length
histogram from this answer; a script can read the same numbers. It is
read-only and reads only the catalog (each text's ``n_tokens`` and
``truncated`` flag, stored when it was extracted), never a shard, so it
costs one indexed lookup per text and adds nothing to the feature routes.

Answer::

    {"id": "ds_…", "n_items": 200, "labels": {"0": 97, "1": 103}, "label_type": "int", "unlabelled": 0,
     "tokens": {"stored": 200, "min": 4, "max": 61, "mean": 23.4, "median": 21.0,
                "max_length": 512, "truncated": 0, "truncated_share": 0.0,
                "histogram": {"edges": [0, 8, 16, …], "counts": [12, 40, …]}}}

``labels`` is ``null`` for a dataset without labels (counts of tags for a
word/tag dataset); a text without a label (``None``) is counted in
``unlabelled``, never as a class. ``label_type`` says what the keys were
uploaded as (``int``, ``float``, ``bool``, ``str``): JSON keys are text, and
the same labels come back typed from a probe's ``classes`` and predict. 409 until the extraction job has succeeded (the same
rule as the features route), 404 for an unknown dataset.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from layerbank.app.api.deps import AppState, get_state
from layerbank.app.api.errors import Conflict, NotFound
from layerbank.app.api.route_helpers import json_response
from layerbank.app.api.schemas import error_responses
from layerbank.cache.keys import text_key

__all__ = ["dataset_stats", "router"]

router = APIRouter(prefix="/v1", tags=["datasets"])
_BINS = 20  # enough to see the shape, few enough to read each bar at phone width


def token_histogram(n_tokens: list[int], truncated: list[bool], max_length: int | None) -> dict[str, Any]:
    """Summary and histogram of token counts; bin edges are whole numbers."""
    n = np.asarray(n_tokens, dtype=np.int64)
    if n.size == 0:
        return {"stored": 0, "min": None, "max": None, "mean": None, "median": None,
                "max_length": max_length, "truncated": 0, "truncated_share": 0.0,
                "histogram": {"edges": [], "counts": []}}
    top = int(n.max())
    width = max(1, -(-(top + 1) // _BINS))  # ceil: every count falls in a bin
    edges = np.arange(0, top + width + 1, width)
    counts, _ = np.histogram(n, bins=edges)
    n_trunc = int(sum(truncated))
    return {"stored": int(n.size), "min": int(n.min()), "max": top, "mean": float(n.mean()),
            "median": float(np.median(n)), "max_length": max_length, "truncated": n_trunc,
            "truncated_share": n_trunc / int(n.size),
            "histogram": {"edges": [int(e) for e in edges], "counts": [int(c) for c in counts]}}


def _order(label: Any) -> tuple[int, Any]:
    # one label type per dataset sorts by value; a mixed (str) one sorts as text
    return (0, label) if isinstance(label, (int, float)) else (1, str(label))


def dataset_stats(state: AppState, dataset_id: str) -> dict[str, Any]:
    ds = state.datasets.get(dataset_id)
    if ds is None:
        raise NotFound(f"no dataset {dataset_id!r}")
    job = state.queue.get(ds.job_id) if ds.job_id else None
    if job is None or job.state != "succeeded":
        st = "missing" if job is None else job.state
        raise Conflict(f"dataset {dataset_id} has no token counts yet: its extraction job is {st}",
                       extra={"job_id": ds.job_id, "job_state": st})
    items = state.datasets.items(dataset_id)
    fp = str(ds.meta.get("fingerprint", ""))
    keys = [text_key(fp, ds.config, t) for t in items.texts]
    stored = state.store.lookup(keys)
    entries = [stored[k] for k in keys if k in stored]
    try:
        max_length = json.loads(ds.config).get("max_length")
    except (ValueError, AttributeError):
        max_length = None
    unlabelled = sum(label is None for label in items.labels)
    if items.tags is not None:
        labels: dict[str, int] | None = dict(sorted(Counter(t for tags in items.tags for t in tags).items()))
    elif unlabelled == len(items.labels):
        labels = None
    else:
        # a None label is no label, never a class; classes in their own order (1 < 2 < 10 for
        # ints: labels keep their type, cache/datasets.py), keyed by their text (JSON keys)
        counts = Counter(label for label in items.labels if label is not None)
        labels = {str(k): n for k, n in sorted(counts.items(), key=lambda kv: _order(kv[0]))}
    return {"id": ds.id, "name": ds.name, "task": ds.task, "n_items": len(items.texts),
            "labels": labels, "label_type": ds.meta.get("label_type", "str") if labels else None,
            "unlabelled": unlabelled if items.tags is None else 0,
            "tokens": token_histogram([e.n_tokens for e in entries], [e.truncated for e in entries],
                                      max_length)}


@router.get("/datasets/{dataset_id}/stats", responses=error_responses(401, 404, 409, 422),
            summary="Label counts and the token-length histogram of a dataset")
async def get_dataset_stats(dataset_id: str, state: AppState = Depends(get_state)) -> Response:
    return json_response(await run_in_threadpool(dataset_stats, state, dataset_id))

"""Operational routes (not versioned): ``/health``, ``/ready``, ``/info``, ``/metrics``.

- ``/health``: 200 while the process answers (no API key needed).
- ``/ready``: 200 once the catalog is open, a worker is alive and it has
  registered its model; 503 (the error shape, plus the checks) before.
- ``/info``: the served model (layers, hidden size, dtype, precision),
  poolings, views, probe heads, defaults, limits and version.
- ``/metrics``: Prometheus text format (see app/api/metrics.py).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from layerbank.app.api.catalog_health import REPAIR_HINT
from layerbank.app.api.deps import AppState, get_state
from layerbank.app.api.metrics import CONTENT_TYPE
from layerbank.app.api.route_helpers import json_response
from layerbank.app.api.schemas import HealthOut, InfoOut, ReadyOut, error_responses
from layerbank.app.api.served_models import describe_models
from layerbank.app.probes.head_names import PROBE_HEADS
from layerbank.cache.views import VIEW_FORMS

__all__ = ["VERSION", "router"]

router = APIRouter(tags=["operations"])

try:
    VERSION = version("layerbank")
except PackageNotFoundError:  # running from a source tree that was not installed
    VERSION = "0+unknown"



@router.get("/health", response_model=HealthOut)
async def health() -> dict[str, str]:
    return {"status": "ok"}


def _checks(state: AppState) -> tuple[dict[str, bool], str | None]:
    """The checks, and why the catalog cannot be read when it cannot."""
    unreadable = None
    try:
        state.refresh_model()
        state.store.catalog.conn().execute("SELECT 1").fetchone()
        catalog = getattr(state, "catalog_problem", None) is None  # app/api/catalog_health.py
    except Exception as e:  # noqa: BLE001  (the answer is 503 with the reason, whatever it is)
        catalog, unreadable = False, str(e)
    return {"catalog": catalog, "worker": bool(state.workers), "model": state.model is not None}, unreadable


@router.get("/ready", response_model=ReadyOut, responses=error_responses(401, 503))
async def ready(state: AppState = Depends(get_state)) -> Response:
    checks, unreadable = _checks(state)
    workers = [{k: w.get(k) for k in ("id", "pid", "state", "job", "model", "last_seen")}
               for w in state.workers]
    if all(checks.values()):
        return json_response({"ready": True, "checks": checks, "workers": workers})
    missing = [k for k, ok in checks.items() if not ok]
    problem = getattr(state, "catalog_problem", None)
    why = {"catalog": f"the catalog is damaged ({problem}); {REPAIR_HINT}" if problem
           else f"the catalog cannot be read ({unreadable})", "worker": "no live worker",
           "model": "no model registered by a worker yet"}
    return json_response({"error": "not ready: " + "; ".join(why[k] for k in missing),
                          "type": "not_ready", "ready": False, "checks": checks,
                          "workers": workers}, status=503)


@router.get("/info", response_model=InfoOut, responses=error_responses(401))
async def info(state: AppState = Depends(get_state)) -> Response:
    s, m = state.settings, state.model
    model: dict[str, Any] | None = None
    if m is not None:
        model = {**{k: v for k, v in m.info.items() if k != "config"},
                 "fingerprint": m.fingerprint, "extraction_config": m.config}
    body = {
        "version": VERSION,
        "ready": state.ready,
        "model": model,
        "layers": None if m is None else m.n_hidden_states - 1,
        "n_hidden_states": None if m is None else m.n_hidden_states,
        "hidden_size": None if m is None else m.hidden_size,
        "dtype": m.storage_dtype if m is not None else s.storage_dtype,
        "precision": None if m is None else m.precision,
        # every served model, the default first (one entry with one model; app/api/served_models.py)
        "models": describe_models(state),
        "poolings": list(s.pooling_names),  # what this server stores and so answers
        "views": list(VIEW_FORMS),
        # the heads a probe fits (app/probes/head_names.py): the lab's probe form lists these
        "heads": list(PROBE_HEADS),
        "defaults": {"view": s.default_view, "pooling": s.default_pooling,
                     "description": _describe_default(s.default_view, s.default_pooling)},
        "limits": {"max_texts_per_request": s.max_texts_per_request,
                   "max_chars_per_text": s.max_chars_per_text, "max_body_bytes": s.max_body_bytes,
                   "max_queue_depth": s.max_queue_depth, "max_dataset_texts": s.max_dataset_texts,
                   "batch_window_ms": s.batch_window_ms},
    }
    return json_response(body)


def _describe_default(view: str, pooling: str) -> str:
    names = {"layer:-1": "the last layer", "layer:-2": "the second-to-last layer"}
    return f"{names.get(view, view)}, {pooling} pooling"


@router.get("/metrics", response_class=Response, responses={
    200: {"content": {CONTENT_TYPE.split(';')[0]: {}}, "description": "Prometheus metrics"},
    **error_responses(401)})
async def metrics(state: AppState = Depends(get_state)) -> Response:
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)

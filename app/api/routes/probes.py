"""Probes over HTTP: which layer, which pooling, how separable, as a job.

- ``POST /v1/probes``: check the request against the dataset and the model
  (422 for bad input, 404 for an unknown dataset, 409 with ``job_id`` while
  its extraction has not succeeded), queue a ``probe`` job, answer 202 with
  the probe. Its id is the job's id: ``GET /v1/jobs/{id}`` shows progress.

  Sentence task (default): ``{"dataset", "views", "poolings", "head", "cv",
  "seed", "control_task", "learning_curve", "train_sizes"}``.
  Token task: ``{"task": "token_classification", "train", "valid"}`` or
  ``{"task": "token_classification", "dataset", "valid_fraction"}``, plus
  ``views``, ``seed``, ``control_task``, ``word_mode`` (first | mean),
  ``span_f1`` (default: true when every tag is BIO).
- ``GET /v1/probes`` (newest first), ``GET /v1/probes/{id}`` (state,
  progress, and the result once it succeeded).
- ``GET /v1/probes/{id}/plot.png``, ``GET /v1/probes/{id}/learning_curve.png``.

The jobs run in a process pool (layerbank.app.api.probe_jobs.service), started with the app by
this router's lifespan; requests are checked by layerbank.app.api.probe_jobs.requests; the
result format is in docs/probes.md.

Example::

    curl -s localhost:8000/v1/probes -H 'content-type: application/json' \\
         -d '{"dataset": "ds_1a2b3c4d5e6f", "views": ["each_layer", "scalar_mix"]}'
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Query
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from layerbank.app.api.deps import AppState, get_state
from layerbank.app.api.errors import Conflict, NotFound
from layerbank.app.api.probe_jobs.requests import ProbeCreate, sentence_payload, token_payload
from layerbank.app.api.probe_jobs.service import ProbeService
from layerbank.app.api.route_helpers import find_job, get_service, job_out, json_response, require_json
from layerbank.app.api.schemas import error_responses
from layerbank.cache.jobs import Job

__all__ = ["probe_out", "router"]

_ERRORS = error_responses(401, 404, 409, 413, 415, 422, 429)
_PNG: dict[int | str, dict[str, Any]] = {200: {"content": {"image/png": {}}, "description": "a PNG image"}}


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    # runs inside the app's own lifespan, so its state (store, queue) exists
    service = ProbeService(app.state.layerbank)
    app.state.probe_service = service
    await service.start()
    try:
        yield
    finally:
        await service.close()


router = APIRouter(prefix="/v1", tags=["probes"], lifespan=_lifespan)


# -- answers ------------------------------------------------------------------------------
def _links(job: Job) -> dict[str, str | None]:
    base = f"/v1/probes/{job.id}"
    sentence = job.payload.get("task") != "token_classification"
    return {"self": base, "job": f"/v1/jobs/{job.id}", "plot": f"{base}/plot.png",
            "learning_curve": f"{base}/learning_curve.png"
            if sentence and job.payload.get("learning_curve") else None}


def probe_out(job: Job) -> dict[str, Any]:
    return {**job_out(job), "job_id": job.id, "task": job.payload.get("task"), "request": job.payload,
            "links": _links(job)}


def _probe_job(state: AppState, probe_id: str) -> Job:
    return find_job(state, probe_id, kind="probe", noun="probe")


@router.post("/probes", status_code=202, responses={**_ERRORS, **error_responses(507), 202: {"description": "probe queued"}},
             dependencies=[Depends(require_json)], summary="Probe a dataset: which layer, which pooling")
async def create_probe(req: ProbeCreate, state: AppState = Depends(get_state),
                       service: ProbeService = Depends(get_service)) -> Response:
    token = req.task in ("token", "token_classification")
    payload = await run_in_threadpool(token_payload if token else sentence_payload, state, req)
    job_id = await run_in_threadpool(service.submit, "probe", payload)
    job = state.queue.get(job_id)
    assert job is not None
    return json_response(probe_out(job), status=202)


@router.get("/probes", responses=_ERRORS, summary="Probes, newest first")
async def list_probes(state: AppState = Depends(get_state),
                      limit: int = Query(100, ge=1, le=1000)) -> Response:
    jobs = await run_in_threadpool(state.queue.list, limit, ["probe"])
    return json_response({"data": [probe_out(j) for j in jobs]})


@router.get("/probes/{probe_id}", responses=_ERRORS, summary="A probe: state, progress, result")
async def get_probe(probe_id: str, state: AppState = Depends(get_state)) -> Response:
    return json_response(probe_out(_probe_job(state, probe_id)))


# -- pictures -----------------------------------------------------------------------------
_PNGS: OrderedDict[tuple[str, str], bytes] = OrderedDict()  # results never change once succeeded
_PNGS_LOCK = threading.Lock()


def _render(job: Job, what: str) -> bytes:
    with _PNGS_LOCK:
        png = _PNGS.get((job.id, what))
    if png is not None:
        return png
    if job.payload.get("task") == "token_classification":
        from layerbank.app.probes.token_plot import token_probe_png

        png = token_probe_png(job.result)
    else:
        from layerbank.app.probes.plots import learning_curve_png, probe_plot_png

        png = (probe_plot_png if what == "plot" else learning_curve_png)(job.result)
    with _PNGS_LOCK:
        _PNGS[(job.id, what)] = png
        while len(_PNGS) > 32:
            _PNGS.popitem(last=False)
    return png


def _finished(state: AppState, probe_id: str) -> Job:
    job = _probe_job(state, probe_id)
    if job.state != "succeeded":
        why = f": {job.error}" if job.error else ""
        raise Conflict(f"probe {probe_id} is {job.state}{why}; its plots exist once it has succeeded",
                       extra={"job_id": job.id, "job_state": job.state})
    return job


@router.get("/probes/{probe_id}/plot.png", response_class=Response, responses={**_ERRORS, **_PNG},
            summary="Accuracy by layer and view (PNG)")
async def probe_plot(probe_id: str, state: AppState = Depends(get_state)) -> Response:
    job = _finished(state, probe_id)
    return Response(await run_in_threadpool(_render, job, "plot"), media_type="image/png")


@router.get("/probes/{probe_id}/learning_curve.png", response_class=Response,
            responses={**_ERRORS, **_PNG}, summary="Accuracy against training examples (PNG)")
async def probe_learning_curve(probe_id: str, state: AppState = Depends(get_state)) -> Response:
    job = _finished(state, probe_id)
    if job.payload.get("task") == "token_classification":
        raise NotFound(f"probe {probe_id} is a token-classification probe; those have no learning curve")
    if not (job.result or {}).get("learning_curve"):
        raise NotFound(f"probe {probe_id} was run with learning_curve=false")
    return Response(await run_in_threadpool(_render, job, "learning_curve"), media_type="image/png")

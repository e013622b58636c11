"""Heads over HTTP: fit one head on a dataset, keep it, predict with it.

- ``POST /v1/heads`` ``{"dataset", "view", "pooling", "head", "seed", "name"}``,
  or ``{"probe": id}`` to take the dataset, the best view and pooling and the
  head of a finished probe (any of them can still be given). Queues a
  ``head`` job (layerbank.app.api.probe_jobs.service) and answers 202 with the head; its
  ``state`` is its job's.
- ``GET /v1/heads``, ``GET /v1/heads/{id}`` (with ``size_bytes``, the bytes
  of its files, and ``storage``: the head's own size, ``frozen_head_bytes``
  (its fitted arrays, layerbank.app.probes.advice.head_bytes: the figure the
  probe's advice gives), beside what a full fine-tune, LoRA r=8 and BitFit of
  the same encoder would store), ``DELETE /v1/heads/{id}``.
- ``POST /v1/heads/{id}/predict`` ``{"texts": [...]}``: labels and class
  probabilities. Features come through the same path as ``POST
  /v1/features`` (cached rows; misses encoded once, micro-batched), so only
  texts never seen are encoded. The head must have been fitted on features
  of the model and extraction config this server serves (409 otherwise).

Files: ``<data_dir>/heads/<id>/arrays.npz`` + ``head.json`` (never a pickle;
docs/probes.md says how to use them with numpy alone).

Example::

    curl -s localhost:8000/v1/heads/hd_0123456789ab/predict -H 'content-type: application/json' \\
         -d '{"texts": ["a gripping, funny film"]}'
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from layerbank.app.api.deps import AppState, get_state
from layerbank.app.api.errors import Conflict, InvalidInput, NotFound
from layerbank.app.api.probe_jobs.heads_store import HeadRecord
from layerbank.app.api.probe_jobs.requests import cost_job, ready_dataset
from layerbank.app.api.probe_jobs.service import ProbeService
from layerbank.app.api.route_helpers import (
    check_pooling,
    check_texts,
    get_service,
    json_response,
    require_json,
)
from layerbank.app.api.schemas import Pooling, error_responses
from layerbank.app.api.served_models import ensure_model
from layerbank.app.api.text_features import compute_features
from layerbank.app.probes.advice import storage_costs
from layerbank.app.probes.head_names import describe
from layerbank.cache.views import parse_view

__all__ = ["HeadCreate", "PredictRequest", "router"]

router = APIRouter(prefix="/v1", tags=["heads"])
_ERRORS = error_responses(401, 404, 409, 413, 415, 422, 429, 503)
_MODEL_KEYS = ("name", "num_layers", "hidden_size", "n_params", "n_bias_params")


class HeadCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dataset: str | None = Field(None, description="labelled dataset to fit on (default: the probe's)")
    probe: str | None = Field(None, description="a succeeded probe: its best view and pooling, its head "
                              "and its dataset are the defaults")
    view: str | None = Field(None, description="layer:K, concat_last_4, weighted:..., or scalar_mix")
    pooling: Pooling | None = Field(None, description="default: the probe's best, else mean")
    head: str | None = Field(None, description=describe())
    seed: int = Field(0, ge=0, le=2**32 - 1)
    name: str | None = Field(None, min_length=1, max_length=200)


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    texts: list[str] = Field(min_length=1, description="texts to classify, hashed exactly as given")


def _from_probe(state: AppState, probe_id: str) -> dict[str, Any]:
    job = state.queue.get(probe_id)
    if job is None or job.kind != "probe":
        raise NotFound(f"no probe {probe_id!r}", field="probe")
    if job.payload.get("task") == "token_classification":
        raise InvalidInput(f"probe {probe_id} is a token-classification probe; heads are fitted on "
                           "sentence probes", field="probe")
    if job.state != "succeeded":
        raise Conflict(f"probe {probe_id} is {job.state}; a head can take its best view once it has "
                       "succeeded", extra={"job_id": job.id, "job_state": job.state})
    best = job.result["best"]
    return {"id": job.id, "dataset": job.payload["dataset_id"], "view": best["view"],
            "pooling": best["pooling"], "head": job.payload["head"], "accuracy": best["accuracy"],
            "accuracy_std": best["accuracy_std"]}


def _register(state: AppState, service: ProbeService, req: HeadCreate) -> HeadRecord:
    from layerbank.app.probes.heads import make_head
    from layerbank.app.probes.inputs import ProbeInputError, check_labels

    probe = _from_probe(state, req.probe) if req.probe else None
    dataset = req.dataset or (probe or {}).get("dataset")
    view = req.view or (probe or {}).get("view")
    pooling = check_pooling(state, req.pooling or (probe or {}).get("pooling") or "mean")
    head = req.head or (probe or {}).get("head") or "logistic"
    if dataset is None:
        raise InvalidInput("dataset: give the labelled dataset to fit on, or a probe", field="dataset")
    if head == "scalar_mix" and view not in (None, "scalar_mix"):
        raise InvalidInput(f"head scalar_mix mixes all hidden states itself; it takes no view ({view!r})",
                           field="view")
    if head == "scalar_mix" or view == "scalar_mix":
        head = view = "scalar_mix"
    if view is None:
        raise InvalidInput("view: choose the view to fit on (e.g. layer:-2), or give a probe to take its "
                           "best", field="view")
    ds, info = ready_dataset(state, dataset, "dataset")
    if ds.task != "sentence":
        raise InvalidInput(f"dataset {ds.id} holds words and tags; heads classify texts", field="dataset")
    make_head(head)  # ProbeInputError on field "head" -> 422 (app/api/errors.py)
    if view != "scalar_mix":
        parse_view(view).needed_layers(int(info["n_hidden_states"]))  # ViewError -> 422 on "view"
    labels = state.datasets.items(ds.id).labels
    if all(label is None for label in labels):
        raise InvalidInput(f"dataset {ds.id} has no labels; a head needs one label per text", field="dataset")
    try:
        check_labels(labels, cv=1)
    except ProbeInputError as e:
        raise InvalidInput(f"dataset {ds.id}: {e}", field="dataset") from None
    n_states = int(info["n_hidden_states"])
    cost_job(state, "this head", rows=sum(label is not None for label in labels), n_states=n_states,
             hidden=int(info["hidden_size"]), classes=len({label for label in labels if label is not None}),
             views=[view])  # 413 over probe_memory_mb, before its record exists
    name = req.name or f"{head} on {view}, {pooling} pooling, {ds.name}"
    if any(ord(c) < 32 for c in name):
        raise InvalidInput("name: control characters are not allowed", field="name")
    service.check_room()  # before the head's record: a refused head leaves nothing behind
    job_id, head_id = uuid.uuid4().hex[:16], service.heads.new_id()
    rec = service.heads.create(name=name, job_id=job_id, dataset_id=ds.id, head=head, view=view,
                               pooling=pooling, fingerprint=str(ds.meta.get("fingerprint", "")),
                               config=ds.config, model=str(info.get("name", "")), head_id=head_id,
                               meta={"from_probe": probe})
    service.submit("head", {"head_id": head_id, "dataset_id": ds.id, "head": head, "view": view,
                            "pooling": pooling, "seed": req.seed, "from_probe": probe}, job_id=job_id)
    return rec


def head_out(state: AppState, service: ProbeService, rec: HeadRecord) -> dict[str, Any]:
    job = state.queue.get(rec.job_id)
    info = state.store.catalog.model_info(rec.fingerprint) or {}
    storage = None
    if rec.n_bytes is not None and all(k in info for k in _MODEL_KEYS):
        # the head's fitted arrays (advice.head_bytes, what the probe's advice estimated); a head
        # saved before that was recorded: its files
        storage = storage_costs({k: info[k] for k in _MODEL_KEYS},
                                int(rec.meta.get("weight_bytes") or rec.n_bytes))
    meta = rec.meta
    st = job.state if job else "missing"
    damage = service.head_damage(rec.id) if st == "succeeded" and rec.n_bytes is not None else None
    return {"id": rec.id, "name": rec.name, "state": "damaged" if damage else st, "damage": damage,
            "job_id": rec.job_id,
            "error": job.error if job else None, "progress": job.progress if job else {},
            "dataset": rec.dataset_id, "head": rec.head, "view": rec.view, "pooling": rec.pooling,
            "model": {"name": rec.model, "fingerprint": rec.fingerprint, "extraction_config": rec.config},
            "size_bytes": rec.n_bytes, "files": service.heads.file_sizes(rec.id), "storage": storage,
            "classes": meta.get("classes"), "class_counts": meta.get("class_counts"),
            "n_examples": meta.get("n_examples"), "input_shape": meta.get("input_shape"),
            "from_probe": meta.get("from_probe"), "created": rec.created,
            "links": {"self": f"/v1/heads/{rec.id}", "predict": f"/v1/heads/{rec.id}/predict",
                      "job": f"/v1/jobs/{rec.job_id}"}}


def _loaded(service: ProbeService, head_id: str) -> Any:
    """The head, or 409 naming the damage of its files (they cannot give correct numbers)."""
    from layerbank.app.probes.head_files import HeadDamaged

    try:
        return service.load_head(head_id)
    except HeadDamaged as e:
        raise Conflict(f"head {head_id} is damaged: {e.reason}; delete it and fit it again",
                       extra={"damage": e.reason}) from None


def _get(service: ProbeService, head_id: str) -> HeadRecord:
    rec = service.heads.get(head_id)
    if rec is None:
        raise NotFound(f"no head {head_id!r}")
    return rec


@router.post("/heads", status_code=202, responses={**_ERRORS, **error_responses(507), 202: {"description": "head job queued"}},
             dependencies=[Depends(require_json)], summary="Fit and keep a head on a dataset")
async def create_head(req: HeadCreate, state: AppState = Depends(get_state),
                      service: ProbeService = Depends(get_service)) -> Response:
    rec = await run_in_threadpool(_register, state, service, req)
    return json_response(head_out(state, service, rec), status=202)


@router.get("/heads", responses=_ERRORS, summary="Saved heads, oldest first")
async def list_heads(state: AppState = Depends(get_state),
                     service: ProbeService = Depends(get_service)) -> Response:
    def listed() -> list[dict[str, Any]]:  # head_out may read head files: off the loop
        return [head_out(state, service, r) for r in service.heads.list()]

    return json_response({"data": await run_in_threadpool(listed)})


@router.get("/heads/{head_id}", responses=_ERRORS, summary="A head: state, size in bytes, classes")
async def get_head(head_id: str, state: AppState = Depends(get_state),
                   service: ProbeService = Depends(get_service)) -> Response:
    rec = _get(service, head_id)
    return json_response(await run_in_threadpool(head_out, state, service, rec))


@router.delete("/heads/{head_id}", responses=_ERRORS, summary="Delete a head and its files")
async def delete_head(head_id: str, state: AppState = Depends(get_state),
                      service: ProbeService = Depends(get_service)) -> Response:
    rec = _get(service, head_id)
    job = state.queue.get(rec.job_id)
    if job is not None and job.state in ("queued", "running"):
        state.queue.cancel(rec.job_id)  # nobody wants it any more
    await run_in_threadpool(service.heads.delete, head_id)
    service.forget_head(head_id)
    return json_response({"id": head_id, "deleted": True})


@router.post("/heads/{head_id}/predict", responses={**_ERRORS, **error_responses(500, 504)},
             dependencies=[Depends(require_json)], summary="Labels and class probabilities for texts")
async def predict(head_id: str, req: PredictRequest, state: AppState = Depends(get_state),
                  service: ProbeService = Depends(get_service)) -> Response:
    rec = _get(service, head_id)
    job = state.queue.get(rec.job_id)
    if job is None or job.state != "succeeded" or rec.n_bytes is None:
        st = job.state if job else "missing"
        raise Conflict(f"head {head_id} is not ready: its fitting job {rec.job_id} is {st}"
                       f"{': ' + job.error if job and job.error else ''}",
                       extra={"job_id": rec.job_id, "job_state": st})
    m = state.require_model()
    if rec.fingerprint != m.fingerprint and any(e.get("fingerprint") == rec.fingerprint
                                                for e in state.served):
        m = await ensure_model(state, rec.fingerprint)  # a head of another served model
    if m.fingerprint == rec.fingerprint:  # features at the precision the head was fitted on
        m = m.at_precision(json.loads(rec.config).get("precision"))
    if (m.fingerprint, m.config) != (rec.fingerprint, rec.config):
        raise Conflict(f"head {head_id} was fitted on features of {rec.model} ({rec.fingerprint}, "
                       f"extraction config {rec.config}); this server serves {m.name} ({m.fingerprint}, "
                       f"{m.config}), whose features it cannot read")
    check_texts(req.texts, state)
    head = await run_in_threadpool(_loaded, service, rec.id)  # before any text is encoded for it
    view = "all_layers" if rec.view == "scalar_mix" else rec.view
    r = await compute_features(state, req.texts, view, rec.pooling, m.fingerprint, m.precision)
    proba = await run_in_threadpool(head.predict_proba, r.data)
    # as the dataset's labels were uploaded: ints stay ints, strings strings (cache/datasets.py)
    classes = [c.item() if isinstance(c, np.generic) else c for c in head.classes_]
    best = np.argmax(proba, axis=1)
    body = {"head": rec.id, "model": m.name, "view": rec.view, "pooling": rec.pooling, "classes": classes,
            "data": [{"index": i, "label": classes[int(b)], "probabilities": [float(p) for p in row],
                      "cached": bool(c)} for i, (b, row, c) in enumerate(zip(best, proba, r.cached))],
            "usage": {"texts": len(req.texts), "cache_hits": int(r.cached.sum()),
                      "tokens_computed": r.tokens_computed}}
    return json_response(body)

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

The jobs run in a process pool (app.probe_service), started with the app by
this router's lifespan; the result format is in docs/probes.md.

Example::

    curl -s localhost:8000/v1/probes -H 'content-type: application/json' \\
         -d '{"dataset": "ds_1a2b3c4d5e6f", "views": ["each_layer", "scalar_mix"]}'
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from app.deps import AppState, get_state
from app.errors import Conflict, InvalidInput, NotFound
from app.probe_service import ProbeService
from app.routes.features import json_response, require_json
from app.schemas import Pooling, error_responses
from cache.datasets import Dataset
from cache.jobs import Job

__all__ = ["DEFAULT_VIEWS", "ProbeCreate", "get_service", "ready_dataset", "router"]

DEFAULT_VIEWS = ["each_layer", "concat_last_4", "sum_last_4", "mean_all", "scalar_mix"]
DEFAULT_TRAIN_SIZES = [50, 100, 200, 500, 1000]
_SENTENCE_ONLY = ("poolings", "head", "cv", "learning_curve", "train_sizes")
_TOKEN_ONLY = ("train", "valid", "valid_fraction", "word_mode", "span_f1")
_ERRORS = error_responses(401, 404, 409, 415, 422)
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


async def get_service(request: Request) -> ProbeService:
    return request.app.state.probe_service  # type: ignore[no-any-return]


class ProbeCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: Literal["sentence_classification", "token_classification", "sentence", "token"] = Field(
        "sentence_classification", description="sentence_classification (labelled texts) or "
        "token_classification (words with tags)")
    dataset: str | None = Field(None, description="labelled dataset; for a token task, the word/tag "
                                "dataset to split with valid_fraction")
    views: list[str] | None = Field(None, max_length=64, description="each_layer, scalar_mix, or view "
                                    f"specs (layer:K, concat_last_4, ...); default {DEFAULT_VIEWS} "
                                    "(token task: ['each_layer'])")
    poolings: list[Pooling] = Field(["mean", "cls"], min_length=1, max_length=3)
    head: str = Field("logistic", description="logistic, ridge, linear_svm, mlp, knn")
    cv: int = Field(5, ge=2, le=20, description="stratified folds")
    seed: int = Field(0, ge=0, le=2**32 - 1)
    control_task: bool = Field(True, description="also probe shuffled labels (selectivity)")
    learning_curve: bool = True
    train_sizes: list[int] | None = Field(None, max_length=20, description=f"default {DEFAULT_TRAIN_SIZES}")
    train: str | None = Field(None, description="token task: word/tag dataset to train on")
    valid: str | None = Field(None, description="token task: word/tag dataset to score on")
    valid_fraction: float | None = Field(None, gt=0, lt=1, description="token task without valid: "
                                         "the share of sentences held out (default 0.2)")
    word_mode: Literal["first", "mean"] = Field("first", description="token task: a word's first "
                                                "sub-token, or the mean of its sub-tokens")
    span_f1: bool | None = Field(None, description="token task: score entity spans (BIO tags); "
                                 "default: when every tag is BIO")


# -- checks shared with app/routes/heads.py -----------------------------------------------
def ready_dataset(state: AppState, dataset_id: str, field: str) -> tuple[Dataset, dict[str, Any]]:
    """The dataset and its model's catalog row, once its extraction has succeeded.

    404 unknown; 409 (with ``job_id``) while its extraction job is queued or
    running, or after it failed or was cancelled."""
    ds = state.datasets.get(dataset_id)
    if ds is None:
        raise NotFound(f"no dataset {dataset_id!r}", field=field)
    job = state.queue.get(ds.job_id) if ds.job_id else None
    if job is None:
        raise Conflict(f"dataset {ds.id} has no extraction job; upload it again")
    if job.state != "succeeded":
        extra = {"job_id": job.id, "job_state": job.state}
        if job.state in ("failed", "cancelled"):
            raise Conflict(f"dataset {ds.id} has no features: its extraction job {job.id} {job.state}"
                           f"{': ' + job.error if job.error else ''}; upload it again", extra=extra)
        done = f" ({job.progress.get('done', 0)}/{job.progress.get('total', '?')} texts)" \
            if job.progress.get("total") else ""
        raise Conflict(f"dataset {ds.id} is not extracted yet: its extraction job {job.id} is "
                       f"{job.state}{done}; retry when GET /v1/jobs/{job.id} says succeeded",
                       extra=extra, headers={"Retry-After": "2"})
    info = state.store.catalog.model_info(str(ds.meta.get("fingerprint", "")))
    if info is None:
        raise Conflict(f"dataset {ds.id} was extracted with a model this store does not know")
    return ds, info


def _fits(view: str, n_states: int) -> bool:
    from app.probe_inputs import ProbeInputError, expand_views

    try:
        expand_views([view], n_states)
    except ProbeInputError:
        return False
    return True


def _input_error(e: Exception, field: str) -> InvalidInput:
    return InvalidInput(f"{field}: {e}", field=field)


def _not_for(req: ProbeCreate, names: tuple[str, ...], task: str) -> None:
    given = [n for n in names if n in req.model_fields_set]
    if given:
        raise InvalidInput(f"{', '.join(given)}: not used by {task} probes; remove "
                           f"{'it' if len(given) == 1 else 'them'} or change task", field=given[0])


def _sentence_payload(state: AppState, req: ProbeCreate) -> dict[str, Any]:
    from app.probe_inputs import ProbeInputError, check_labels, check_options, expand_views

    _not_for(req, _TOKEN_ONLY, "sentence_classification")
    if req.dataset is None:
        raise InvalidInput("dataset: give the id of a labelled dataset (POST /v1/datasets)", field="dataset")
    ds, info = ready_dataset(state, req.dataset, "dataset")
    if ds.task != "sentence":
        raise InvalidInput(f"dataset {ds.id} holds words and tags; probe it with "
                           "task=token_classification", field="task")
    n_states = int(info["n_hidden_states"])
    views = req.views or [v for v in DEFAULT_VIEWS if _fits(v, n_states)]  # concat_last_4 needs 4 states
    for field, head, checked in (("head", req.head, ["each_layer"]), ("views", "logistic", views)):
        try:
            check_options(cv=req.cv, head=head, views=checked, poolings=req.poolings)
        except ProbeInputError as e:
            raise _input_error(e, field) from None
    try:
        expand_views(views, n_states)
    except ProbeInputError as e:
        raise InvalidInput(f"views: {e} (model {info.get('name')})", field="views") from None
    labels = state.datasets.items(ds.id).labels
    if all(label is None for label in labels):
        raise InvalidInput(f"dataset {ds.id} has no labels; upload it with labels (JSON) or a "
                           "label_column (file) to probe it", field="dataset")
    try:
        check_labels(labels, req.cv)
    except ProbeInputError as e:
        raise InvalidInput(f"dataset {ds.id}: {e}", field="dataset") from None
    sizes = req.train_sizes or DEFAULT_TRAIN_SIZES
    if any(s < 2 for s in sizes):
        raise InvalidInput("train_sizes: each size must be at least 2", field="train_sizes")
    return {"task": "sentence_classification", "dataset_id": ds.id, "views": views,
            "poolings": list(req.poolings), "head": req.head, "cv": req.cv, "seed": req.seed,
            "control_task": req.control_task, "learning_curve": req.learning_curve, "train_sizes": sizes}


def _word_dataset(state: AppState, dataset_id: str, field: str) -> tuple[Dataset, dict[str, Any], Any]:
    ds, info = ready_dataset(state, dataset_id, field)
    if ds.task != "token":
        raise InvalidInput(f"{field}: dataset {ds.id} holds texts, not words and tags; a token probe "
                           "needs a word/tag dataset (POST /v1/datasets with words and tags, or a "
                           "CoNLL file)", field=field)
    items = state.datasets.items(ds.id)
    if items.tags is None:
        raise InvalidInput(f"{field}: dataset {ds.id} has words but no tags", field=field)
    return ds, info, items


def _token_payload(state: AppState, req: ProbeCreate) -> dict[str, Any]:
    from app.probe_jobs import JobInputError, split_sentences
    from app.spans import TagSchemeError, check_bio
    from app.token_probe import expand_views
    from cache.views import ViewError

    _not_for(req, _SENTENCE_ONLY, "token_classification")
    if req.train and req.dataset:
        raise InvalidInput("give train (and valid), or dataset with valid_fraction, not both", field="dataset")
    if req.valid and req.valid_fraction is not None:
        raise InvalidInput("give valid or valid_fraction, not both", field="valid_fraction")
    field = "train" if req.train else "dataset"
    train_id = req.train or req.dataset
    if train_id is None:
        raise InvalidInput("train: give the word/tag dataset to train on (and valid, or valid_fraction)",
                           field="train")
    train, info, train_items = _word_dataset(state, train_id, field)
    tags = list(train_items.tags)
    valid_id, fraction = None, req.valid_fraction
    if req.valid:
        valid, _, valid_items = _word_dataset(state, req.valid, "valid")
        if (valid.meta.get("fingerprint"), valid.config) != (train.meta.get("fingerprint"), train.config):
            raise InvalidInput(f"valid: dataset {valid.id} was extracted with another model or extraction "
                               f"config than {train.id}", field="valid")
        valid_id = valid.id
        tags += list(valid_items.tags)
    else:
        fraction = 0.2 if fraction is None else fraction
        try:
            split_sentences(len(tags), fraction, req.seed)
        except JobInputError as e:
            raise _input_error(e, "valid_fraction") from None
    if len({t for s in train_items.tags for t in s}) < 2:
        raise InvalidInput(f"{field}: dataset {train.id} carries fewer than 2 distinct tags; nothing to "
                           "learn", field=field)
    views = req.views or ["each_layer"]
    try:
        expand_views(views, int(info["n_hidden_states"]))
    except (ViewError, ValueError) as e:
        raise InvalidInput(f"views: {e} (model {info.get('name')})", field="views") from None
    if req.span_f1:
        try:
            check_bio(tags)
        except TagSchemeError as e:
            raise _input_error(e, "span_f1") from None
    return {"task": "token_classification", "train_id": train.id, "valid_id": valid_id,
            "valid_fraction": fraction, "views": views, "seed": req.seed,
            "control_task": req.control_task, "word_mode": req.word_mode, "span_f1": req.span_f1}


# -- answers ------------------------------------------------------------------------------
def _links(job: Job) -> dict[str, str | None]:
    base = f"/v1/probes/{job.id}"
    sentence = job.payload.get("task") != "token_classification"
    return {"self": base, "job": f"/v1/jobs/{job.id}", "plot": f"{base}/plot.png",
            "learning_curve": f"{base}/learning_curve.png"
            if sentence and job.payload.get("learning_curve") else None}


def probe_out(job: Job) -> dict[str, Any]:
    return {**job.public(), "job_id": job.id, "task": job.payload.get("task"), "request": job.payload,
            "cancel_requested": job.cancel_requested,
            "result": job.result if job.state == "succeeded" else None, "links": _links(job)}


def _probe_job(state: AppState, probe_id: str) -> Job:
    job = state.queue.get(probe_id)
    if job is None or job.kind != "probe":
        raise NotFound(f"no probe {probe_id!r}")
    return job


@router.post("/probes", status_code=202, responses={**_ERRORS, 202: {"description": "probe queued"}},
             dependencies=[Depends(require_json)], summary="Probe a dataset: which layer, which pooling")
async def create_probe(req: ProbeCreate, state: AppState = Depends(get_state),
                       service: ProbeService = Depends(get_service)) -> Response:
    token = req.task in ("token", "token_classification")
    payload = await run_in_threadpool(_token_payload if token else _sentence_payload, state, req)
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
        from app.token_plot import token_probe_png

        png = token_probe_png(job.result)
    else:
        from app.plots import learning_curve_png, probe_plot_png

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

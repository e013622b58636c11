"""Freeze or fine-tune over HTTP: the ``regimes`` job (docs/regimes.md).

- ``POST /v1/regimes`` ``{"dataset", "regimes"?, "seeds"?, "top_k"? (int or list), "xi"? (float or list),
  "train_sizes"?, "max_epochs"?, "patience"?, "split_seed"?}``: check the
  request against the dataset and its model (404 unknown dataset; 409 with
  ``job_id`` while its extraction has not succeeded; 422 for unknown
  regimes, numbers out of range, missing labels, labels too few to split, or
  a model whose layers or query/value projections a requested regime needs
  were not found, naming what),
  queue a ``regimes`` job for the worker, answer 202. The id is the job's id.
- ``GET /v1/regimes/{id}``: state, progress (epochs), and the result once it
  succeeded (per regime: macro-F1 and accuracy mean ± std over seeds,
  trainable parameters, bytes per task, seconds per epoch, peak memory; the
  verdict ``best`` / ``within_noise`` / ``cheapest_within_one_std``).
- ``GET /v1/regimes/{id}/plot.png``: macro-F1 against bytes per task (409
  until it succeeded).
- ``GET /v1/regimes/{id}/layer_cut.png``: the layer-cut curve, macro-F1
  against fine-tuned layers with full's score and 90% of it (409 until it
  succeeded, or when the job ran fewer than two ``top_k`` cuts).
- ``DELETE /v1/regimes/{id}``: cancel (200 when it was queued, 202 while it
  stops at its next training step, 409 once finished).

The training itself runs in the worker (workers/regimes/job_kind.py); this module
never imports torch, and renders the plot with layerbank.app.probes.regimes_plot, which
imports matplotlib only.

Example::

    curl -s localhost:8000/v1/regimes -H 'content-type: application/json' \\
         -d '{"dataset": "ds_1a2b3c4d5e6f", "regimes": ["frozen", "bitfit", "lora"], "seeds": 3}'
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from layerbank.app.api.deps import AppState, get_state
from layerbank.app.api.errors import Conflict, InvalidInput
from layerbank.app.api.probe_jobs.memory_cost import check_memory, fit_bytes
from layerbank.app.api.probe_jobs.requests import ready_dataset
from layerbank.app.api.route_helpers import find_job, job_out, json_response, require_json
from layerbank.app.api.schemas import error_responses
from layerbank.cache.jobs import Job
from layerbank.regime_names import MAX_VARIANTS, REGIMES, variants  # one list: the worker reads it too

__all__ = ["MAX_VARIANTS", "REGIMES", "RegimesCreate", "check_request", "regimes_out", "router"]

TEST_SIZE, VAL_SIZE = 0.2, 0.1  # run_regimes' defaults: the split the sizes are checked against
_TERMINAL = ("succeeded", "failed", "cancelled")
_ERRORS = error_responses(401, 404, 409, 413, 415, 422)
_PNG: dict[int | str, dict[str, Any]] = {200: {"content": {"image/png": {}}, "description": "a PNG image"}}

router = APIRouter(prefix="/v1", tags=["regimes"])


class RegimesCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dataset: str = Field(description="id of a labelled, extracted dataset (POST /v1/datasets)")
    regimes: list[str] = Field(list(REGIMES), min_length=1, max_length=len(REGIMES),
                               description=f"which to compare, from {list(REGIMES)}")
    seeds: int | None = Field(None, ge=1, le=20, description="seeds per regime (the std is over these); "
                              "default: ceil(1500 / training texts) within [2, 10], more for smaller sets")
    eval_datasets: list[str] = Field([], max_length=8, description="ids of labelled datasets to score "
                                     "every regime on too (e.g. a shifted domain), with the in-domain gap")
    top_k: int | list[int] | None = Field(
        None, description="bottom layers the top_k regime freezes, or a list of cut points (one row each, "
        "top_k:k, and the layer-cut curve: the fewest fine-tuned layers reaching 90% of full's score); "
        "default: every layer count 0..L (every other one above 12 layers)")
    xi: float | list[float] | None = Field(
        None, description="per-layer rate factor of full, top_k and gradual: lr of layer l (1..L) = "
        "lr * xi ** (L - l), the embeddings xi ** L; a list sweeps it (one row each); default: gradual "
        "1/2.6 (ULMFiT), full and top_k one rate")
    train_sizes: list[int] | None = Field(None, min_length=1, max_length=10,
                                          description="training-set sizes (a learning curve); "
                                          "default: the whole train split")
    max_epochs: int = Field(10, ge=1, le=100, description="epoch budget of each fine-tune")
    patience: int = Field(2, ge=1, le=100, description="early stopping on validation macro-F1")
    split_seed: int = Field(0, ge=0, le=2**32 - 1, description="seed of the train/val/test split")


def _train_split_size(labels: list[str], split_seed: int) -> int:
    """Rows in run_regimes' train split; 422 when the labels cannot be split that way."""
    import numpy as np
    from sklearn.model_selection import train_test_split

    y = np.asarray(labels)
    idx = np.arange(len(y))
    try:  # exactly layerbank.workers.regimes.linear_probe.stratified_split, so what passes here runs there
        rest, _ = train_test_split(idx, test_size=TEST_SIZE, stratify=y, random_state=split_seed)
        train, _ = train_test_split(rest, test_size=VAL_SIZE / (1 - TEST_SIZE), stratify=y[rest],
                                    random_state=split_seed)
    except ValueError as e:
        counts = ", ".join(f"{k!r}: {n}" for k, n in sorted(Counter(labels).items()))
        raise InvalidInput(f"dataset: {len(labels)} texts ({counts}) cannot be split into stratified "
                           f"train, validation ({VAL_SIZE:.0%}) and test ({TEST_SIZE:.0%}) sets: {e}",
                           field="dataset") from None
    return len(train)


def _check_layout(info: dict[str, Any], regimes: list[str]) -> None:
    """422 when the model's layers or query/value projections, which these regimes need, were
    not found (the worker found its layout at load: layerbank.workers.regimes.families)."""
    layout = info.get("regimes_layout") or {}  # absent for a model registered before it existed
    why = {r: m for r, m in (layout.get("unavailable") or {}).items() if r in regimes}
    if why:
        reasons = "; ".join(dict.fromkeys(why.values()))
        raise InvalidInput(f"regimes: model {info.get('name')!r} ({layout.get('architecture')}, model_type "
                           f"{layout.get('model_type')!r}) cannot be mapped for {sorted(why)}: {reasons}. "
                           "frozen, bitfit and full need none of this", field="regimes")


def check_request(state: AppState, req: RegimesCreate) -> dict[str, Any]:
    """The worker's payload, once everything a user can get wrong has been checked."""
    unknown = [r for r in req.regimes if r not in REGIMES]
    if unknown:
        raise InvalidInput(f"regimes: unknown {unknown}; choose from {list(REGIMES)}", field="regimes")
    if len(set(req.regimes)) != len(req.regimes):
        raise InvalidInput("regimes: each regime at most once", field="regimes")
    ds, info = ready_dataset(state, req.dataset, "dataset")
    if ds.task != "sentence":
        raise InvalidInput(f"dataset {ds.id} holds words and tags; regimes compare sentence "
                           "classifiers (one label per text)", field="dataset")
    _check_layout(info, req.regimes)
    n_layers = int(info.get("num_layers", int(info["n_hidden_states"]) - 1))
    cuts = [req.top_k] if isinstance(req.top_k, int) else req.top_k
    if cuts is not None and (not cuts or len(cuts) > n_layers + 1 or any(not 0 <= k <= n_layers for k in cuts)):
        raise InvalidInput(f"top_k: {req.top_k} layers to freeze, but model {info.get('name')} has "
                           f"{n_layers} (each cut in 0..{n_layers}, at most {n_layers + 1} of them)", field="top_k")
    try:  # the xi values' range and the number of runs per seed
        variants(req.regimes, n_layers, req.top_k, req.xi)
    except ValueError as e:  # each message starts with what is wrong: xi, top_k, or the runs' count
        where = next((f for f in ("xi", "top_k") if str(e).startswith(f)), "regimes")
        raise InvalidInput(f"{where}: {e}" if where == "regimes" else str(e), field=where) from None
    labels = state.datasets.items(ds.id).labels
    missing = sum(label is None for label in labels)
    if missing:
        raise InvalidInput(f"dataset {ds.id}: {missing} of {len(labels)} texts have no label; upload it "
                           "with labels (JSON) or a label_column (file) to compare regimes",
                           field="dataset")
    classes = len(set(labels))
    if classes < 2:
        raise InvalidInput(f"dataset {ds.id} has a single label ({labels[0]!r}); nothing to learn",
                           field="dataset")
    n_train = _train_split_size(labels, req.split_seed)
    n_params = int(info.get("n_params") or 0)  # 413 over probe_memory_mb (app/api/probe_jobs/memory_cost.py)
    check_memory(16 * n_params + fit_bytes(len(labels), int(info["hidden_size"]), classes), state.settings,
                 "this regimes job",
                 f"{n_params} weights trained with Adam, {len(labels)} rows x {classes} classes")
    sizes = sorted(set(req.train_sizes)) if req.train_sizes else None
    for size in sizes or []:
        # a stratified subsample leaves at least one text per label on each side, or takes all
        if size != n_train and not classes <= size <= n_train - classes:
            raise InvalidInput(f"train_sizes: {size} must be in {classes}..{n_train - classes} or be "
                               f"{n_train}, the whole train split of dataset {ds.id} ({classes} labels)",
                               field="train_sizes")
    evals = []
    for eval_id in dict.fromkeys(req.eval_datasets):
        eval_ds, _ = ready_dataset(state, eval_id, "eval_datasets")
        eval_labels = state.datasets.items(eval_ds.id).labels
        if eval_ds.task != "sentence" or any(v is None for v in eval_labels):
            raise InvalidInput(f"eval_datasets: {eval_ds.id} needs one label per text", field="eval_datasets")
        if eval_ds.meta.get("fingerprint") != ds.meta.get("fingerprint"):
            raise InvalidInput(f"eval_datasets: {eval_ds.id} was extracted with another model than "
                               f"{ds.id}", field="eval_datasets")
        # typed: 1 and "1" differ (labels keep their type), as in the job that maps them to classes
        strangers = sorted(set(eval_labels) - set(labels), key=repr)
        if strangers:
            raise InvalidInput(f"eval_datasets: {eval_ds.id} has labels {strangers[:5]} that {ds.id} "
                               "never trains on", field="eval_datasets")
        evals.append(eval_ds.id)
    return {"dataset_id": ds.id, "regimes": list(req.regimes), "seeds": req.seeds, "top_k": req.top_k, "xi": req.xi,
            "eval_datasets": evals,
            "train_sizes": sizes, "max_epochs": req.max_epochs, "patience": req.patience,
            "split_seed": req.split_seed, "n_texts": len(labels)}


def regimes_out(job: Job) -> dict[str, Any]:
    base = f"/v1/regimes/{job.id}"
    links = {"self": base, "job": f"/v1/jobs/{job.id}", "plot": f"{base}/plot.png"}
    if job.state == "succeeded" and (job.result or {}).get("layer_cut"):
        links["layer_cut_plot"] = f"{base}/layer_cut.png"
    return {**job_out(job), "job_id": job.id, "request": job.payload, "links": links}


def _regimes_job(state: AppState, regimes_id: str) -> Job:
    return find_job(state, regimes_id, kind="regimes", noun="regimes job")


@router.post("/regimes", status_code=202, responses={**_ERRORS, 202: {"description": "regimes job queued"}},
             dependencies=[Depends(require_json)], summary="Freeze or fine-tune: compare training regimes")
async def create_regimes(req: RegimesCreate, state: AppState = Depends(get_state)) -> Response:
    payload = await run_in_threadpool(check_request, state, req)
    job_id = await run_in_threadpool(state.queue.submit, "regimes", payload)
    job = state.queue.get(job_id)
    assert job is not None
    return json_response(regimes_out(job), status=202)


@router.get("/regimes/{regimes_id}", responses=_ERRORS, summary="A regimes job: state, progress, result")
async def get_regimes(regimes_id: str, state: AppState = Depends(get_state)) -> Response:
    return json_response(regimes_out(_regimes_job(state, regimes_id)))


def _succeeded_job(state: AppState, regimes_id: str) -> Any:
    """The job behind a plot: a plot exists only once its job has succeeded (409 before)."""
    job = _regimes_job(state, regimes_id)
    if job.state != "succeeded":
        why = f": {job.error}" if job.error else ""
        raise Conflict(f"regimes job {regimes_id} is {job.state}{why}; its plot exists once it has "
                       "succeeded", extra={"job_id": job.id, "job_state": job.state})
    return job


@router.get("/regimes/{regimes_id}/plot.png", response_class=Response, responses={**_ERRORS, **_PNG},
            summary="Test macro-F1 against bytes stored per task (PNG)")
async def regimes_plot(regimes_id: str, state: AppState = Depends(get_state)) -> Response:
    job = _succeeded_job(state, regimes_id)
    from layerbank.app.probes.regimes_plot import (
        regimes_plot_png,  # matplotlib only, no torch (checked by a test)
    )

    return Response(await run_in_threadpool(regimes_plot_png, job.result), media_type="image/png")


@router.get("/regimes/{regimes_id}/layer_cut.png", response_class=Response, responses={**_ERRORS, **_PNG},
            summary="Test macro-F1 against fine-tuned layers, with full's score and 90% of it (PNG)")
async def regimes_layer_cut_plot(regimes_id: str, state: AppState = Depends(get_state)) -> Response:
    job = _succeeded_job(state, regimes_id)
    if not (job.result or {}).get("layer_cut"):
        raise Conflict(f"regimes job {regimes_id} has no layer-cut curve: it needs the top_k regime at two "
                       "or more cut points (top_k: [0, 1, ...])", extra={"job_id": job.id, "job_state": job.state})
    from layerbank.app.probes.regimes_plot import layer_cut_png  # matplotlib only, no torch

    return Response(await run_in_threadpool(layer_cut_png, job.result), media_type="image/png")


@router.delete("/regimes/{regimes_id}", responses={
    **_ERRORS, 202: {"description": "running: it stops at its next training step"}},
    summary="Cancel a regimes job")
async def cancel_regimes(regimes_id: str, state: AppState = Depends(get_state)) -> Response:
    job = _regimes_job(state, regimes_id)
    if job.state in _TERMINAL:
        raise Conflict(f"regimes job {regimes_id} already {job.state}; nothing to cancel",
                       extra={"job_id": job.id, "job_state": job.state})
    job = state.queue.cancel(regimes_id) or job
    return json_response(regimes_out(job), status=200 if job.state == "cancelled" else 202)

"""What a probe request must satisfy before a job is queued, and the pieces
the routes and the jobs (app/api/probe_jobs/jobs.py) share; what the CLI shares with them
(defaults, model summary, the seeded split) is app/probes/common.py, re-exported here.

``sentence_payload(state, req)`` / ``token_payload(state, req)`` check a
``ProbeCreate`` against its dataset(s) and the model they were extracted
with, and return the job payload. They raise the API's errors (layerbank.app.api.errors):
404 unknown dataset, 409 (with ``job_id``) extraction not succeeded, 422
anything a user can fix (labels, views, head, options of the other task).
They read the catalog: call them from a thread. Both cost the job's memory
(``cost_job``) and answer 413 over ``probe_memory_mb``, before anything is queued.

Example::

    payload = sentence_payload(state, ProbeCreate(dataset="ds_1a2b3c4d5e6f", cv=5))
    service.submit("probe", payload)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from layerbank.app.api.errors import Conflict, InvalidInput, NotFound
from layerbank.app.api.schemas import Pooling
from layerbank.app.probes.common import (
    DEFAULT_TRAIN_SIZES,
    DEFAULT_VIEWS,
    MODEL_KEYS,
    JobInputError,
    model_summary,
    split_sentences,
)
from layerbank.app.probes.head_names import PROBE_HEADS, describe
from layerbank.cache.datasets import Dataset
from layerbank.cache.poolings import POOLING_NAMES

if TYPE_CHECKING:
    from layerbank.app.api.deps import AppState

__all__ = ["DEFAULT_TRAIN_SIZES", "DEFAULT_VIEWS", "MODEL_KEYS", "JobInputError", "ProbeCreate",
           "cost_job", "model_summary", "ready_dataset",
           "sentence_payload", "split_sentences", "token_payload"]

_SENTENCE_ONLY = ("poolings", "head", "cv", "learning_curve", "train_sizes")
_TOKEN_ONLY = ("train", "valid", "valid_fraction", "word_mode", "span_f1")


class ProbeCreate(BaseModel):
    """The body of ``POST /v1/probes``."""

    model_config = ConfigDict(extra="forbid")
    task: Literal["sentence_classification", "token_classification", "sentence", "token"] = Field(
        "sentence_classification", description="sentence_classification (labelled texts) or "
        "token_classification (words with tags)")
    dataset: str | None = Field(None, description="labelled dataset; for a token task, the word/tag "
                                "dataset to split with valid_fraction")
    views: list[str] | None = Field(None, min_length=1, max_length=64, description="each_layer, "
                                    "scalar_mix, or view specs (layer:K, concat_last_4, ...); default "
                                    f"{DEFAULT_VIEWS} (token task: ['each_layer'])")
    poolings: list[Pooling] = Field(["mean", "cls"], min_length=1, max_length=len(POOLING_NAMES))
    head: str = Field("logistic", description=describe(PROBE_HEADS))
    cv: int = Field(5, ge=2, le=20, description="stratified folds")
    seed: int = Field(0, ge=0, le=2**32 - 1)
    control_task: bool = Field(True, description="also probe shuffled labels (selectivity)")
    learning_curve: bool = True
    mdl: bool = Field(True, description="also the online codelength (MDL, Voita & Titov 2020) and "
                      "compression of every view")
    train_sizes: list[int] | None = Field(None, max_length=20, description=f"default {DEFAULT_TRAIN_SIZES}")
    train: str | None = Field(None, description="token task: word/tag dataset to train on")
    valid: str | None = Field(None, description="token task: word/tag dataset to score on")
    valid_fraction: float | None = Field(None, gt=0, lt=1, description="token task without valid: "
                                         "the share of sentences held out (default 0.2)")
    word_mode: Literal["first", "mean"] = Field("first", description="token task: a word's first "
                                                "sub-token, or the mean of its sub-tokens")
    span_f1: bool | None = Field(None, description="token task: score entity spans (BIO tags); "
                                 "default: when every tag is BIO")


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
    from layerbank.app.probes.inputs import ProbeInputError, expand_views

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


def sentence_payload(state: AppState, req: ProbeCreate) -> dict[str, Any]:
    from layerbank.app.probes.inputs import ProbeInputError, check_labels, check_options, expand_views

    _not_for(req, _TOKEN_ONLY, "sentence_classification")
    if req.dataset is None:
        raise InvalidInput("dataset: give the id of a labelled dataset (POST /v1/datasets)", field="dataset")
    ds, info = ready_dataset(state, req.dataset, "dataset")
    if ds.task != "sentence":
        raise InvalidInput(f"dataset {ds.id} holds words and tags; probe it with "
                           "task=token_classification", field="task")
    if missing := [p for p in req.poolings if p not in state.settings.pooling_names]:
        raise InvalidInput(f"poolings: {missing[0]!r} is not stored by this server; it stores "
                           f"{', '.join(state.settings.pooling_names)} (setting poolings, --poolings / "
                           "LAYERBANK_POOLINGS)", field="poolings")
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
    cost_job(state, "this probe", rows=sum(label is not None for label in labels), n_states=n_states,
             hidden=int(info["hidden_size"]), classes=len({label for label in labels if label is not None}),
             views=expand_views(views, n_states))
    return {"task": "sentence_classification", "dataset_id": ds.id, "views": views,
            "poolings": list(dict.fromkeys(req.poolings)), "head": req.head, "cv": req.cv, "seed": req.seed,
            "control_task": req.control_task, "learning_curve": req.learning_curve, "train_sizes": sizes,
            "mdl": req.mdl}


def cost_job(state: AppState, what: str, *, rows: int, n_states: int, hidden: int, classes: int,
             views: list[str]) -> None:
    """413 before anything is queued when the job's memory estimate exceeds the budget
    (layerbank.app.api.probe_jobs.memory_cost; setting probe_memory_mb)."""
    from layerbank.app.api.probe_jobs.memory_cost import check_memory, probe_bytes, view_widths

    widths = view_widths(views, n_states, hidden)
    need = probe_bytes(rows=rows, n_states=n_states, hidden=hidden, classes=classes, widths=widths)
    widest = max(widths, default=hidden)
    check_memory(need, state.settings, what, f"{rows} rows x {widest} features in its widest view x "
                 f"{classes} classes")


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


def token_payload(state: AppState, req: ProbeCreate) -> dict[str, Any]:
    from layerbank.app.probes.spans import TagSchemeError, check_bio
    from layerbank.app.probes.token_probe import expand_views
    from layerbank.cache.views import ViewError

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
    n_states = int(info["n_hidden_states"])
    cost_job(state, "this token probe", rows=sum(len(s) for s in tags), n_states=n_states,
             hidden=int(info["hidden_size"]), classes=len({t for s in tags for t in s}),
             views=[name for name, _ in expand_views(views, n_states)])
    return {"task": "token_classification", "train_id": train.id, "valid_id": valid_id,
            "valid_fraction": fraction, "views": views, "seed": req.seed,
            "control_task": req.control_task, "word_mode": req.word_mode, "span_f1": req.span_f1,
            "mdl": req.mdl}



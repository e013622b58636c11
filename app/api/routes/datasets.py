"""Datasets: named texts (with labels, or words and tags) extracted by a job.

``POST /v1/datasets`` takes either
- JSON ``{"name", "texts", "labels"?}`` or ``{"name", "words", "tags"?}`` (a
  token task: each text is its words joined by single spaces, and the
  token-level states are stored), or
- a multipart upload: field ``file`` and optional form fields ``name``,
  ``format``, ``text_column``, ``label_column``, ``no_header``,
  ``tag_column``. Formats: ``csv``, ``tsv``, ``jsonl``, ``txt`` (texts, with
  column names), and for token tasks ``conll``, ``words_json``,
  ``words_jsonl`` (app/probes/wordsets.py). Default: the file name's suffix.
It answers 202 with the dataset (its ``id`` and extraction ``job_id``).

``GET /v1/datasets/{id}/features?view=&pooling=&format=npy`` streams the
matrix as ``.npy`` (float32, rows in dataset order) once the job succeeded.

Names, ids and upload file names are data: they are stored in the catalog
and never used to build a filesystem path.
"""

from __future__ import annotations

import io
import logging
import math
import re
import uuid
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any, Literal, get_args

import numpy as np
from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from layerbank.app.api.deps import AppState, get_state
from layerbank.app.api.disk_room import require_free_disk
from layerbank.app.api.errors import (
    Conflict,
    InvalidInput,
    NotFound,
    Overloaded,
    TooLarge,
    UnsupportedMediaType,
)
from layerbank.app.api.route_helpers import check_pooling, check_texts, json_response, strict_view
from layerbank.app.api.schemas import (
    DatasetDeleted,
    DatasetList,
    DatasetOut,
    DatasetTexts,
    DatasetWords,
    Precision,
    error_responses,
)
from layerbank.app.api.served_models import ensure_model
from layerbank.app.inputs import InputError, parse_texts
from layerbank.cache.datasets import Dataset
from layerbank.cache.keys import text_key
from layerbank.cache.poolings import PoolingName
from layerbank.cache.words import join_words

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["datasets"])
_CHUNK_ROWS = 1024
# a matrix up to this size is read (and checksummed) whole before its first byte
# is sent, so damage found anywhere in it is a 409, not a cut-off download; a
# larger one is checked this far ahead and cut short (with an ERROR log) on
# damage found later: a client sees an incomplete body, never wrong rows
_CHECKED_BYTES = 64 * 2**20
log = logging.getLogger("layerbank.api")
_ERRORS = error_responses(400, 401, 404, 409, 413, 415, 422, 429, 503)
_TEXT_FORMATS = ("csv", "tsv", "jsonl", "txt")
_WORD_FORMATS = {"conll": "conll", "words_json": "json", "words_jsonl": "jsonl"}  # token tasks
_UPLOAD_FORMATS = _TEXT_FORMATS + tuple(_WORD_FORMATS)

_CREATE_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"anyOf": [DatasetTexts.model_json_schema(),
                                              DatasetWords.model_json_schema()]}},
    "multipart/form-data": {"schema": {"type": "object", "required": ["file"], "properties": {
        "file": {"type": "string", "format": "binary"},
        "name": {"type": "string"}, "format": {"type": "string", "enum": list(_UPLOAD_FORMATS)},
        "text_column": {"type": "string"}, "label_column": {"type": "string"},
        "no_header": {"type": "boolean"}, "tag_column": {"type": "integer"},
        "precision": {"type": "string", "enum": list(get_args(Precision))},
        "model": {"type": "string"}}}}}}}


def _public(state: AppState, ds: Dataset) -> dict[str, Any]:
    job = state.queue.get(ds.job_id) if ds.job_id else None
    return {**ds.public(), "job": None if job is None else
            {**job.public(), "cancel_requested": job.cancel_requested}}


def _get(state: AppState, dataset_id: str) -> Dataset:
    ds = state.datasets.get(dataset_id)
    if ds is None:
        raise NotFound(f"no dataset {dataset_id!r}")
    return ds


async def _json_items(request: Request) -> dict[str, Any]:
    try:
        raw = await request.json()
    except ValueError as e:
        raise InvalidInput(f"the body is not valid JSON: {e}", field="body") from None
    except RecursionError:
        raise InvalidInput("the body is not valid JSON here: it is nested too deeply",
                           field="body") from None
    if not isinstance(raw, dict):
        raise InvalidInput("the body must be a JSON object with name and texts (or words)", field="body")
    if "words" in raw and "texts" in raw:
        raise InvalidInput("give texts or words, not both", field="texts")
    try:
        if "words" in raw:  # a token task
            w = DatasetWords.model_validate(raw)
            return {**_word_items(w.name, w.words, w.tags, w.labels), "precision": w.precision,
                    "model": w.model}
        if "tags" in raw:
            raise InvalidInput("tags need words (one tag per word)", field="tags")
        t = DatasetTexts.model_validate(raw)
    except ValidationError as e:
        raise RequestValidationError(e.errors()) from None
    return {"name": t.name, "texts": t.texts, "labels": t.labels, "source": None,
            "precision": t.precision, "model": t.model}


def _word_items(name: str, words: list[list[str]], tags: list[list[str]] | None,
                labels: list[Any] | None) -> dict[str, Any]:
    texts = []
    for i, ws in enumerate(words):
        if not ws:
            raise InvalidInput(f"words.{i} is empty", field=f"words.{i}")
        try:
            texts.append(join_words(ws)[0])
        except ValueError as e:
            raise InvalidInput(f"words.{i}: {e}", field=f"words.{i}") from None
    if tags is not None:
        if len(tags) != len(words):
            raise InvalidInput(f"tags has {len(tags)} items, words has {len(words)}", field="tags")
        for i, (ws, ts) in enumerate(zip(words, tags)):
            if len(ts) != len(ws):
                raise InvalidInput(f"tags.{i} has {len(ts)} tags for {len(ws)} words",
                                   field=f"tags.{i}")
    return {"name": name, "texts": texts, "labels": labels, "words": words, "tags": tags,
            "source": None}


def _form_str(form: Any, key: str) -> str | None:
    v = form.get(key)
    if v is None or isinstance(v, UploadFile):
        return None
    return str(v).strip() or None


async def _upload_items(request: Request) -> dict[str, Any]:
    form = await request.form(max_files=1, max_fields=20)
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise InvalidInput("file: upload the data as the multipart field 'file'", field="file")
    source = PurePosixPath((upload.filename or "upload").replace("\\", "/")).name or "upload"
    fmt = (_form_str(form, "format") or PurePosixPath(source).suffix.lstrip(".")).lower()
    if fmt not in _UPLOAD_FORMATS:
        raise InvalidInput(f"format: cannot tell the format of {source!r}; send format= one of "
                           f"{', '.join(_UPLOAD_FORMATS)}", field="format")
    name = _form_str(form, "name") or PurePosixPath(source).stem or "upload"
    precision = _form_str(form, "precision")  # checked against the worker's modes by the caller
    model = _form_str(form, "model")  # checked against the served models by the caller
    data = await upload.read()
    await form.close()
    if fmt in _WORD_FORMATS:
        from layerbank.app.probes.wordsets import WordSetError, parse_wordset

        try:
            col = int(_form_str(form, "tag_column") or 1)
            # parsing a large file takes seconds: off the event loop
            sents = await run_in_threadpool(parse_wordset, data, _WORD_FORMATS[fmt], tag_column=col,
                                            source=source)
        except (WordSetError, ValueError) as e:
            raise InvalidInput(f"file: {e}", field="file") from None
        return {**_word_items(name, [list(s.words) for s in sents], [list(s.tags) for s in sents],
                              None), "source": source, "precision": precision, "model": model}
    try:
        table = await run_in_threadpool(
            parse_texts, data, fmt, text_column=_form_str(form, "text_column"),
                            label_column=_form_str(form, "label_column"),
                            header=(_form_str(form, "no_header") or "false").lower() not in ("1", "true", "yes", "on"))
    except InputError as e:
        raise InvalidInput(f"file: {e}", field="file") from None
    return {"name": name, "texts": table.texts, "labels": table.labels, "source": source,
            "skipped_empty": len(table.skipped_empty), "precision": precision, "model": model}


def _check_unicode(field: str, values: list[Any]) -> None:
    """422 for a lone surrogate (valid JSON, not storable as UTF-8 text)."""
    for i, v in enumerate(values):
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidInput(f"{field}.{i} is not valid Unicode (it holds a lone surrogate)",
                                   field=f"{field}.{i}") from None


def _check_numbers(field: str, values: list[Any]) -> None:
    """422 for a NaN or infinite label (Python's JSON reads ``NaN``): no class, and not
    "no label" either, which is null."""
    for i, v in enumerate(values):
        if isinstance(v, float) and not math.isfinite(v):
            raise InvalidInput(f"{field}.{i} is {v!r}, not a label; send null for a text without one",
                               field=f"{field}.{i}")


@router.post("/datasets", status_code=202, response_model=DatasetOut,
             responses={**_ERRORS, 202: {"description": "dataset registered; its extraction "
                                         "job is queued"}},
             openapi_extra=_CREATE_BODY, summary="Register a dataset and queue its extraction")
async def create_dataset(request: Request, state: AppState = Depends(get_state)) -> Response:
    m = state.require_model()
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == "application/json":
        items = await _json_items(request)
    elif ctype == "multipart/form-data":
        items = await _upload_items(request)
    else:
        raise UnsupportedMediaType(f"send JSON or a multipart/form-data upload (got "
                                   f"{ctype or 'no content type'!r})")
    m = await ensure_model(state, items.get("model"))  # the default, or another served model
    m = m.at_precision(items.get("precision"))  # the dataset's config, and so its keys
    s = state.settings
    texts: list[str] = items["texts"]
    if len(texts) > s.max_dataset_texts:
        raise TooLarge(f"{len(texts):,} texts; the limit is max_dataset_texts ({s.max_dataset_texts:,})",
                       limit="max_dataset_texts")
    if not texts:
        raise InvalidInput("the dataset has no texts", field="texts")
    check_texts(texts, state, per_request=False)
    labels = items.get("labels")
    if labels is not None and len(labels) != len(texts):
        raise InvalidInput(f"labels has {len(labels)} items, texts has {len(texts)}", field="labels")
    _check_unicode("labels", labels or [])
    _check_numbers("labels", labels or [])
    for i, tags in enumerate(items.get("tags") or []):
        _check_unicode(f"tags.{i}", tags)
    name = items["name"]
    if any(ord(c) < 32 for c in name):
        raise InvalidInput("name: control characters are not allowed", field="name")
    # a PostgreSQL catalog would take the rows while the shards cannot be written
    require_free_disk(s.data_dir, "dataset extractions", "nothing was registered")
    if state.queue.queued(["extract"]) >= s.max_queue_depth:
        raise Overloaded(f"overloaded: {s.max_queue_depth} dataset extractions are already queued "
                         "(max_queue_depth); retry when one has started", limit="max_queue_depth",
                         headers={"Retry-After": "10"})
    token = items.get("words") is not None
    ds_id, job_id = "ds_" + uuid.uuid4().hex[:12], uuid.uuid4().hex[:16]
    meta = {"fingerprint": m.fingerprint, "precision": m.precision, "source": items.get("source"),
            "skipped_empty": items.get("skipped_empty", 0)}

    def register() -> Dataset:
        # one transaction: a crash never leaves a dataset without its job (or a job
        # without its dataset), and a worker that claims the job finds the dataset
        with state.store.catalog.tx():
            ds = state.datasets.create(name, texts, labels=labels, words=items.get("words"),
                                       tags=items.get("tags"), model=m.name, config=m.config,
                                       job_id=job_id, meta=meta, dataset_id=ds_id)
            state.queue.submit("extract", {"dataset_id": ds_id, "want_tokens": token},
                               job_id=job_id, max_attempts=s.max_attempts)
        return ds

    ds = await run_in_threadpool(register)
    return json_response(_public(state, ds), status=202)


@router.get("/datasets", response_model=DatasetList, responses=_ERRORS)
async def list_datasets(state: AppState = Depends(get_state)) -> Response:
    return json_response({"data": [_public(state, d) for d in state.datasets.list()]})


@router.get("/datasets/{dataset_id}", response_model=DatasetOut, responses=_ERRORS)
async def get_dataset(dataset_id: str, state: AppState = Depends(get_state)) -> Response:
    return json_response(_public(state, _get(state, dataset_id)))


@router.delete("/datasets/{dataset_id}", response_model=DatasetDeleted, responses=_ERRORS,
               summary="Delete a dataset (its cached features stay for texts other datasets share)")
async def delete_dataset(dataset_id: str, state: AppState = Depends(get_state)) -> Response:
    ds = _get(state, dataset_id)
    if ds.job_id:
        state.queue.cancel(ds.job_id)  # nobody needs its extraction any more
    state.datasets.delete(dataset_id)
    return json_response({"id": dataset_id, "deleted": True})


@router.get("/datasets/{dataset_id}/features", responses={
    **_ERRORS, 200: {"content": {"application/x-npy": {}, "application/vnd.apache.parquet": {}},
                     "description": "float32 .npy: [n, dim] or [n, H, d]; Parquet: columns text, features"}},
    response_class=Response, summary="The dataset's feature matrix as .npy (or .parquet)")
async def dataset_features(dataset_id: str, view: str | None = None,
                           pooling: PoolingName | Literal[""] | None = None,
                           format: str = Query("npy", pattern="^(npy|parquet)$",
                                               description="npy (streamed) or parquet (text, features)"),
                           state: AppState = Depends(get_state)) -> Response:
    ds = _get(state, dataset_id)
    job = state.queue.get(ds.job_id) if ds.job_id else None
    if job is None or job.state != "succeeded":
        st = "missing" if job is None else job.state
        prog = "" if job is None or not job.progress else \
            f" ({job.progress.get('done', 0)}/{job.progress.get('total', '?')} texts)"
        raise Conflict(f"dataset {dataset_id} has no features yet: its extraction job is {st}{prog}")
    fp = str(ds.meta.get("fingerprint", ""))
    info = state.store.catalog.model_info(fp)
    if info is None:
        raise Conflict(f"dataset {dataset_id} was extracted with a model this store does not know")
    h, d = int(info["n_hidden_states"]), int(info["hidden_size"])
    v = strict_view(view or state.settings.default_view, h)  # "?view=" means the default too
    width = v.output_dim(h, d)
    pooling = check_pooling(state, pooling or None)
    texts = (await run_in_threadpool(state.datasets.items, dataset_id)).texts
    keys = [text_key(fp, ds.config, t) for t in texts]
    stored = await run_in_threadpool(state.store.lookup, keys)
    with_pooling = await run_in_threadpool(state.store.lookup, keys, False, (pooling,))
    if len(with_pooling) < len(stored):
        raise Conflict(f"{len(stored) - len(with_pooling)} of the dataset's texts were stored before "
                       f"pooling {pooling!r} was set; upload the dataset again to compute it for them")
    lost = sum(1 for k in set(keys) if k not in stored)
    if lost:
        raise Conflict(f"{lost} of the dataset's texts are no longer stored (a damaged shard was "
                       "quarantined); upload the dataset again to recompute them")
    shape = (len(keys), h, d) if v.kind == "all" else (len(keys), width)
    safe_id = re.sub(r"[^A-Za-z0-9_-]", "_", dataset_id)
    if format == "parquet":  # one file, built whole: Parquet has no streaming writer here
        body = await run_in_threadpool(_parquet, state, keys, texts, v, view or state.settings.default_view,
                                       pooling, h, ds.model)
        return Response(body, media_type="application/vnd.apache.parquet", headers={
            "Content-Disposition": f'attachment; filename="{safe_id}.parquet"'})
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                  "shape": shape})

    chunks = _matrix_rows(state, keys, v, pooling, h)
    checked: list[bytes] = []

    def check_ahead() -> None:
        size = 0
        for block in chunks:
            checked.append(block)
            size += len(block)
            if size >= _CHECKED_BYTES:
                return

    try:
        await run_in_threadpool(check_ahead)
    except RowsLost as e:
        raise Conflict(f"{e.lost} of the dataset's texts are no longer stored (a damaged shard was "
                       "quarantined); upload the dataset again to recompute them") from None

    def stream() -> Iterator[bytes]:
        yield header.getvalue()
        yield from checked
        try:
            yield from chunks
        except RowsLost as e:  # past the checked part: end short, the client sees an incomplete body
            log.error("dataset %s: download cut short after %d bytes: %s", dataset_id,
                      len(header.getvalue()) + sum(map(len, checked)), e)
            raise

    return StreamingResponse(stream(), media_type="application/x-npy", headers={
        "Content-Disposition": f'attachment; filename="{safe_id}.npy"',
        "Content-Length": str(len(header.getvalue()) + 4 * int(np.prod(shape)))})


class RowsLost(RuntimeError):
    """Rows of a dataset found missing (their shard was quarantined) while reading its matrix."""

    def __init__(self, lost: int) -> None:
        super().__init__(f"{lost} rows are no longer stored (a damaged shard was quarantined)")
        self.lost = lost


def _matrix_rows(state: AppState, keys: list[str], view: Any, pooling: str, h: int) -> Iterator[bytes]:
    """The matrix's float32 rows in blocks of ``_CHUNK_ROWS``; RowsLost as soon as one is not found."""
    for i in range(0, len(keys), _CHUNK_ROWS):
        res = state.store.read_view(keys[i: i + _CHUNK_ROWS], view, pooling, h)
        if not res.found.all():
            raise RowsLost(int((~res.found).sum()))
        yield np.ascontiguousarray(res.data, dtype="<f4").tobytes()


def _parquet(state: AppState, keys: list[str], texts: list[str], v: Any, view: str, pooling: str,
             h: int, model: str) -> bytes:
    """The dataset's matrix as Parquet, in layerbank.app.feature_files' layout (text, features)."""
    import tempfile

    from layerbank.app.feature_files import write_features

    parts = []
    for i in range(0, len(keys), _CHUNK_ROWS):
        res = state.store.read_view(keys[i: i + _CHUNK_ROWS], v, pooling, h)
        if not res.found.all():
            raise Conflict("rows of the dataset vanished while it was read (a damaged shard was "
                           "quarantined); upload the dataset again to recompute them")
        parts.append(res.data)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_features(f"{tmp}/features.parquet", np.concatenate(parts), texts=texts, view=view,
                              pooling=pooling, model=model)
        return path.read_bytes()

"""What more than one route does, in one place: refuse a body that is not JSON,
hold texts to the limits, check a pooling and a view against the served model,
and answer JSON (whole, or one row's fragment at a time) without pydantic.

Routes import these from here, never from another route module (the features
route, which most of them first came from, is one route among the others).
"""

from __future__ import annotations

import base64
import functools
import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import Request
from fastapi.responses import Response

from layerbank.app.api.deps import AppState, ModelRef
from layerbank.app.api.errors import InvalidInput, NotFound, TooLarge, UnsupportedMediaType
from layerbank.app.api.schemas import view_pattern
from layerbank.app.api.served_models import find_model
from layerbank.app.blank import is_blank
from layerbank.cache.jobs import Job
from layerbank.cache.views import VIEW_GRAMMAR, View, ViewError, parse_view

if TYPE_CHECKING:
    from layerbank.app.api.probe_jobs.service import ProbeService

__all__ = ["check_pooling", "check_texts", "dumps", "encode_rows", "find_job", "get_service", "job_out",
           "json_response", "require_json", "resolve_request", "row_fragments", "strict_view"]


async def require_json(request: Request) -> None:
    """415 for a body that is not JSON (FastAPI would otherwise call it a 422)."""
    ctype = request.headers.get("content-type", "")
    main = ctype.split(";")[0].strip().lower()
    if main != "application/json" and not main.endswith("+json"):
        raise UnsupportedMediaType(f"send the body as JSON with 'Content-Type: application/json' "
                                   f"(got {ctype or 'no content type'!r})")


async def get_service(request: Request) -> ProbeService:
    """The app's probe service (routes/probes.py's lifespan starts it): probes' and heads' dependency."""
    service: ProbeService = request.app.state.probe_service
    return service


def check_texts(texts: Sequence[str], state: AppState, field: str = "texts", *,
                per_request: bool = True) -> None:
    """Limits (413, naming the setting) and texts we refuse to encode (422).

    ``per_request=False`` (datasets) skips the texts-per-request limit.
    """
    s = state.settings
    if per_request and len(texts) > s.max_texts_per_request:
        raise TooLarge(f"{len(texts):,} texts in one request; the limit is max_texts_per_request "
                       f"({s.max_texts_per_request:,})", limit="max_texts_per_request")
    for i, t in enumerate(texts):
        if len(t) > s.max_chars_per_text:
            raise TooLarge(f"{field}.{i} has {len(t):,} characters; the limit is max_chars_per_text "
                           f"({s.max_chars_per_text:,})", limit="max_chars_per_text")
        if is_blank(t):  # whitespace or zero-width characters only (app/blank.py)
            raise InvalidInput(f"{field}.{i} is empty (no visible character); an empty text has no "
                               "features", field=f"{field}.{i}")
        try:
            t.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInput(f"{field}.{i} is not valid Unicode (it holds a lone surrogate)",
                               field=f"{field}.{i}") from None


def check_pooling(state: AppState, pooling: str | None) -> str:
    """The pooling to answer with (the default when None), refused (422) when this
    server does not store it: its misses could never be filled."""
    pooling = pooling or state.settings.default_pooling
    stored = state.settings.pooling_names
    if pooling not in stored:
        raise InvalidInput(f"pooling {pooling!r} is not stored by this server; it stores "
                           f"{', '.join(stored)} (setting poolings, --poolings / LAYERBANK_POOLINGS)",
                           field="pooling")
    return pooling


def resolve_request(state: AppState, view_spec: str | None, model: str | None,
                    precision: str | None = None) -> tuple[ModelRef, View]:
    """The served model (at ``precision``) and the view, checked against its layers."""
    m = find_model(state, model).at_precision(precision)  # a model not loaded yet: ensure_model first
    view = strict_view(state.settings.default_view if view_spec is None else view_spec, m.n_hidden_states)
    return m, view


@functools.lru_cache(maxsize=64)
def _view_re(n_states: int) -> re.Pattern[str]:
    return re.compile(view_pattern(n_states), re.ASCII)


@functools.lru_cache(maxsize=256)  # a pure function of its arguments; a ViewError is not kept
def strict_view(spec: str, n_states: int) -> View:
    """Parse a view and check it against the model, holding it to the exact
    grammar the OpenAPI schema states (no spaces, plain decimal numbers)."""
    view = parse_view(spec)
    view.needed_layers(n_states)  # ViewError -> 422 naming the layers that exist
    if not _view_re(n_states).fullmatch(spec):
        raise ViewError(f"view {spec!r} is not written as the grammar says: {VIEW_GRAMMAR}, "
                        "without spaces, numbers in plain decimal")
    return view


def json_response(body: dict[str, Any], status: int = 200) -> Response:
    # built here rather than through the response model: validating and
    # re-encoding millions of floats with pydantic costs seconds
    return Response(json.dumps(body, separators=(",", ":")).encode(), status_code=status,
                    media_type="application/json")


def dumps(x: Any) -> bytes:
    """Compact JSON bytes, as every fast answer writes them."""
    return json.dumps(x, separators=(",", ":")).encode()


def encode_rows(data: np.ndarray, fmt: str, dtype: str) -> list[Any]:
    """Per-text embeddings: nested lists, or base64 of little-endian ``dtype``."""
    if fmt == "base64":
        arr = np.ascontiguousarray(data, dtype="<f2" if dtype == "float16" else "<f4")
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in arr]
    return data.tolist()


def row_fragments(data: np.ndarray, fmt: str, dtype: str) -> list[bytes]:
    """Each row's ``embedding`` as it appears in the answer's JSON (the same text
    ``json.dumps`` gives it inside the whole body)."""
    if fmt == "base64":
        return [b'"' + e.encode("ascii") + b'"' for e in encode_rows(data, fmt, dtype)]
    return [dumps(row) for row in data.tolist()]


# -- jobs (GET/DELETE /v1/jobs, and the probe, head and regimes routes) ---------------
def job_out(job: Job) -> dict[str, Any]:
    return {**job.public(), "cancel_requested": job.cancel_requested,
            "result": job.result if job.state == "succeeded" else None}


def find_job(state: AppState, job_id: str, kind: str | None = None, noun: str = "job") -> Job:
    """The job, or a 404 naming it as ``noun`` (also when it is of another ``kind``)."""
    job = state.queue.get(job_id)
    if job is None or kind not in (None, job.kind):
        raise NotFound(f"no {noun} {job_id!r}")
    return job

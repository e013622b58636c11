"""``POST /v1/features``: feature vectors for texts, from the store, encoding
only the misses (through the worker, micro-batched with other requests).

The request path: check limits -> parse the view against the served model ->
key every text -> read the hits (from memory, app/api/rowcache.py, or from the
store in a thread; never through the worker) -> hand the misses to the
batcher and await them -> read those -> answer in input order. ``compute_features`` is shared with
``/v1/embeddings``.

Example::

    curl -s localhost:8000/v1/features -H 'content-type: application/json' \\
         -d '{"texts": ["a film", "a play"], "view": "layer:-2", "pooling": "mean"}'
"""

from __future__ import annotations

import base64
import functools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from layerbank.app.api.deps import AppState, ModelRef, get_state
from layerbank.app.api.errors import ExtractionFailed, InvalidInput, TooLarge, UnsupportedMediaType
from layerbank.app.api.schemas import FeaturesRequest, FeaturesResponse, error_responses, view_pattern
from layerbank.app.api.served_models import ensure_model, find_model
from layerbank.app.blank import is_blank
from layerbank.cache.keys import text_key
from layerbank.cache.store import ReadResult
from layerbank.cache.views import VIEW_GRAMMAR, View, ViewError, parse_view

__all__ = [
    "ERROR_RESPONSES",
    "FeatureResult",
    "cached_answer",
    "check_pooling",
    "check_texts",
    "compute_features",
    "encode_rows",
    "json_response",
    "require_json",
    "router",
    "row_fragments",
]

ERROR_RESPONSES = error_responses(401, 413, 415, 422, 429, 500, 503, 504)

router = APIRouter(prefix="/v1", tags=["features"])


async def require_json(request: Request) -> None:
    """415 for a body that is not JSON (FastAPI would otherwise call it a 422)."""
    ctype = request.headers.get("content-type", "")
    main = ctype.split(";")[0].strip().lower()
    if main != "application/json" and not main.endswith("+json"):
        raise UnsupportedMediaType(f"send the body as JSON with 'Content-Type: application/json' "
                                   f"(got {ctype or 'no content type'!r})")


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


@dataclass
class FeatureResult:
    data: np.ndarray  # [n, dim] or [n, H, d], float32
    cached: np.ndarray  # bool [n]
    n_tokens: list[int]
    truncated: list[bool]
    model: ModelRef
    view: View
    pooling: str
    keys: list[str]

    @property
    def tokens_computed(self) -> int:
        """Tokens encoded for this request's misses (a repeated text counts once)."""
        seen: dict[str, int] = {}
        for k, t, c in zip(self.keys, self.n_tokens, self.cached):
            if not c:
                seen[k] = t
        return sum(seen.values())


def resolve_request(state: AppState, view_spec: str | None, model: str | None,
                    precision: str | None = None) -> tuple[ModelRef, View]:
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


async def compute_features(state: AppState, texts: list[str], view_spec: str | None,
                           pooling: str | None, model: str | None,
                           precision: str | None = None) -> FeatureResult:
    await ensure_model(state, model)  # another served model's first use loads it
    m, view = resolve_request(state, view_spec, model, precision)
    pooling = check_pooling(state, pooling)
    keys = [text_key(m.fingerprint, m.config, t) for t in texts]
    store, rows, h = state.store, state.rows, m.n_hidden_states
    # rows already in memory are answered on the event loop; disk reads go to a thread
    res = rows.try_read(keys, view, pooling, h)
    if res is None:
        res = await run_in_threadpool(rows.read, store, keys, view, pooling, h)
    cached = res.found.copy()
    metrics = state.metrics
    n_hit = int(cached.sum())
    metrics.cache_hits.inc(n_hit)
    if n_hit == len(keys):
        return FeatureResult(res.data, cached, [e.n_tokens for e in res.entries],  # type: ignore[union-attr]  # all found
                             [e.truncated for e in res.entries], m, view, pooling, keys)  # type: ignore[union-attr]  # all found
    metrics.cache_misses.inc(len(keys) - n_hit)
    data, entries = res.data, list(res.entries)
    for _attempt in range(2):  # twice: a shard quarantined between commit and read is recomputed
        miss = [i for i in range(len(keys)) if entries[i] is None]
        miss_keys = [keys[i] for i in miss]
        await state.batcher.encode(list(dict.fromkeys(texts[i] for i in miss)), model=m.fingerprint,
                                   precision=m.precision, hint=(miss_keys, pooling))
        got = rows.try_read(miss_keys, view, pooling, h)  # the batcher read them into memory
        if got is None:
            got = await run_in_threadpool(rows.read, store, miss_keys, view, pooling, h)
        data = _merge(data, got, miss, len(keys))
        for j, i in enumerate(miss):
            entries[i] = got.entries[j] if got.found[j] else None
        if all(e is not None for e in entries):
            break
    else:
        lost = sum(e is None for e in entries)
        raise ExtractionFailed(f"{lost} texts were encoded but could not be read back "
                               "(a damaged shard was quarantined twice); retry")
    out = FeatureResult(data, cached, [e.n_tokens for e in entries],  # type: ignore[union-attr]  # a None raised above
                        [e.truncated for e in entries], m, view, pooling, keys)  # type: ignore[union-attr]  # None raised
    metrics.tokens_computed.inc(out.tokens_computed)
    return out


async def warm_rows(state: AppState, hints: list[Any]) -> None:
    """After a micro-batch is stored: read all its requests' rows in one store
    read per pooling, so each request then answers from memory."""
    by_pooling: dict[str, list[str]] = {}
    for h in hints:
        if h is not None:
            by_pooling.setdefault(h[1], []).extend(h[0])
    for pooling, keys in by_pooling.items():
        await run_in_threadpool(state.rows.warm, state.store, keys, pooling)


def _merge(data: np.ndarray, got: ReadResult, idx: list[int], n: int) -> np.ndarray:
    if got.data.size == 0:
        return data
    if data.shape[1:] != got.data.shape[1:]:  # nothing was found at first: data is empty
        data = np.zeros((n,) + got.data.shape[1:], dtype=np.float32)
    sel = np.flatnonzero(got.found)
    data[np.asarray(idx)[sel]] = got.data[sel]
    return data


def plain_copy(view: View) -> bool:
    """Views whose rows are stored rows as they are (so float16 loses nothing)."""
    return view.kind in ("concat", "all")


def encode_rows(data: np.ndarray, fmt: str, dtype: str) -> list[Any]:
    """Per-text embeddings: nested lists, or base64 of little-endian ``dtype``."""
    if fmt == "base64":
        arr = np.ascontiguousarray(data, dtype="<f2" if dtype == "float16" else "<f4")
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in arr]
    return data.tolist()


def json_response(body: dict[str, Any], status: int = 200) -> Response:
    # built here rather than through the response model: validating and
    # re-encoding millions of floats with pydantic costs seconds
    return Response(json.dumps(body, separators=(",", ":")).encode(), status_code=status,
                    media_type="application/json")


def _dumps(x: Any) -> bytes:
    return json.dumps(x, separators=(",", ":")).encode()


def row_fragments(data: np.ndarray, fmt: str, dtype: str) -> list[bytes]:
    """Each row's ``embedding`` as it appears in the answer's JSON (the same text
    ``json.dumps`` gives it inside the whole body)."""
    if fmt == "base64":
        return [b'"' + e.encode("ascii") + b'"' for e in encode_rows(data, fmt, dtype)]
    return [_dumps(row) for row in data.tolist()]


def _bool(x: Any) -> bytes:
    return b"true" if x else b"false"


@functools.lru_cache(maxsize=256)
def _head(name: str, precision: str, view: str, pooling: str, shape: tuple[int, ...], fmt: str, dtype: str) -> bytes:
    """The answer's opening fields, up to ``data`` (without the closing brace)."""
    return _dumps({"model": name, "precision": precision, "view": view, "pooling": pooling, "dim": shape[-1],
                   "shape": list(shape), "format": fmt, "dtype": dtype})[:-1]


def features_body(m: ModelRef, view: View, pooling: str, shape: list[int], fmt: str, dtype: str,
                  rows: Sequence[bytes], cached: Sequence[bool], n_tokens: Sequence[int],
                  truncated: Sequence[bool], tokens_computed: int) -> bytes:
    """The answer's bytes from its rows' fragments: byte for byte what ``json.dumps`` of the
    whole answer gives (tests/unit/app/test_fast_reads.py), without formatting a float."""
    head = _head(m.name, m.precision, view.spec, pooling, tuple(shape), fmt, dtype if fmt == "base64" else "float32")
    items = b",".join(b'{"index":%d,"embedding":%b,"cached":%b,"n_tokens":%d,"truncated":%b}'
                      % (i, e, _bool(c), int(t), _bool(tr))
                      for i, (e, c, t, tr) in enumerate(zip(rows, cached, n_tokens, truncated)))
    usage = _dumps({"texts": len(rows), "cache_hits": int(sum(bool(c) for c in cached)),
                    "tokens_computed": tokens_computed})
    return head + b',"data":[' + items + b'],"usage":' + usage + b"}"


def _body(r: FeatureResult, fmt: str, dtype: str) -> bytes:
    return features_body(r.model, r.view, r.pooling, list(r.data.shape[1:]), fmt, dtype,
                         row_fragments(r.data, fmt, dtype), r.cached.tolist(), r.n_tokens, r.truncated,
                         r.tokens_computed)


def answer_dtype(m: ModelRef, view: View, requested: str | None) -> str:
    """A plain copy of float16 rows is answered in float16; int8 rows are dequantised (float32)."""
    stored = m.storage_dtype if m.storage_dtype != "int8" else "float32"
    return requested or (stored if plain_copy(view) else "float32")


def cached_answer(state: AppState, body: bytes) -> bytes | None:
    """The answer to a ``/v1/features`` body whose every text is in memory, or None.

    The fast path of app/api/fast_reads.py: the same checks as the route, in the same
    order, and the same bytes; anything else (a miss, a bad request, a model to load,
    a big answer) is None, and the route answers it as always.
    """
    try:
        req = FeaturesRequest.model_validate(json.loads(body))
        check_texts(req.texts, state)
        m, view = resolve_request(state, req.view, req.model, req.precision)
        pooling = check_pooling(state, req.pooling)
    except Exception:  # noqa: BLE001  (the route gives the error its shape)
        return None
    h = m.n_hidden_states
    shape = [len(view.needed_layers(h)), m.hidden_size] if view.kind == "all" else \
        [view.output_dim(h, m.hidden_size)]
    if len(req.texts) * math.prod(shape) > _BIG:
        return None
    fmt, dtype = req.format, answer_dtype(m, view, req.dtype)
    keys = [text_key(m.fingerprint, m.config, t) for t in req.texts]
    got = state.rows.try_fragments(keys, view, pooling, h, ("features", view.spec, fmt, dtype),
                                   lambda data: row_fragments(data, fmt, dtype))
    if got is None:
        return None
    rows, entries = got
    state.metrics.cache_hits.inc(len(keys))
    return features_body(m, view, pooling, shape, fmt, dtype, rows, [True] * len(keys),
                         [e.n_tokens for e in entries], [e.truncated for e in entries], 0)


_BIG = 200_000  # numbers in an answer encoded off the event loop


@router.post("/features", response_model=FeaturesResponse, responses=ERROR_RESPONSES,
             dependencies=[Depends(require_json)],
             summary="Feature vectors for texts (cached rows, misses encoded once)")
async def features(req: FeaturesRequest, state: AppState = Depends(get_state)) -> Response:
    check_texts(req.texts, state)
    r = await compute_features(state, req.texts, req.view, req.pooling, req.model, req.precision)
    dtype = answer_dtype(r.model, r.view, req.dtype)
    if r.data.size > _BIG:  # big answers are encoded off the event loop
        body = await run_in_threadpool(_body, r, req.format, dtype)
    else:
        body = _body(r, req.format, dtype)
    return Response(body, media_type="application/json")

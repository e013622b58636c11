"""``POST /v1/features``: feature vectors for texts, from the store, encoding
only the misses (through the worker, micro-batched with other requests).

The request path: check limits -> parse the view against the served model ->
key every text -> read the hits (from memory, app/api/rowcache.py, or from the
store in a thread; never through the worker) -> hand the misses to the
batcher and await them -> read those -> answer in input order. The reading and
encoding is ``compute_features`` (app/api/text_features.py, the one features
service of app/features_service.py with the batcher as its encoder), shared with
``/v1/embeddings`` and the heads.

Example::

    curl -s localhost:8000/v1/features -H 'content-type: application/json' \\
         -d '{"texts": ["a film", "a play"], "view": "layer:-2", "pooling": "mean"}'
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from layerbank.app.api.deps import AppState, ModelRef, get_state
from layerbank.app.api.route_helpers import (
    check_pooling,
    check_texts,
    dumps,
    json_response,
    require_json,
    resolve_request,
    row_fragments,
)
from layerbank.app.api.schemas import FeaturesRequest, FeaturesResponse, error_responses
from layerbank.app.api.text_features import FeatureResult, compute_features, warm_rows
from layerbank.cache.keys import text_key
from layerbank.cache.views import View

__all__ = [
    "ERROR_RESPONSES",
    "answer_dtype",
    "cached_answer",
    "features_body",
    # app/api/main.py hooks it on the batcher (it lives in app/api/text_features.py)
    "warm_rows",
    # routes/jobs.py imports it from here still; its home is app/api/route_helpers.py
    "json_response",
    "router",
]

ERROR_RESPONSES = error_responses(401, 413, 415, 422, 429, 500, 503, 504)

router = APIRouter(prefix="/v1", tags=["features"])


def plain_copy(view: View) -> bool:
    """Views whose rows are stored rows as they are (so float16 loses nothing)."""
    return view.kind in ("concat", "all")


def _bool(x: Any) -> bytes:
    return b"true" if x else b"false"


@functools.lru_cache(maxsize=256)
def _head(name: str, precision: str, view: str, pooling: str, shape: tuple[int, ...], fmt: str, dtype: str) -> bytes:
    """The answer's opening fields, up to ``data`` (without the closing brace)."""
    return dumps({"model": name, "precision": precision, "view": view, "pooling": pooling, "dim": shape[-1],
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
    usage = dumps({"texts": len(rows), "cache_hits": int(sum(bool(c) for c in cached)),
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

"""``POST /v1/embeddings``: the OpenAI embeddings API, so an OpenAI client
pointed at layerbank (``base_url=http://host:port/v1``) works unchanged.

- ``input``: a string or a list of strings (token-id arrays are a 422 that
  names LangChain's ``check_embedding_ctx_length=False``: the store is keyed
  by text).
- ``encoding_format``: ``float`` (lists) or ``base64`` (little-endian float32,
  as OpenAI sends it; the official client asks for base64 by default and
  decodes it).
- The vectors are the model's own sentence embedding where it ships a
  sentence-transformers recipe (``modules.json``: for all-MiniLM-L6-v2 the
  last layer, mean-pooled, L2-normalised, as ``SentenceTransformer.encode``
  gives), made from the stored rows; without a recipe, the server's default
  view and pooling, unnormalised (app/api/embedding_recipe.py). ``/info``
  says which, per model (``models[].embeddings``). The layerbank extensions
  ``view``, ``pooling`` and ``normalize`` (``extra_body`` in the client)
  override each part. ``/v1/features`` keeps the server's research default.
  ``dimensions``, when given, must equal the vector width.
- ``usage.prompt_tokens``: tokens of every input, cached or not.
- ``model``: any name ``/info`` lists for the served model (``model_names``
  in the schema: ``default``, ``all-MiniLM-L6-v2``, its hub name, its
  fingerprint, its path). Any other name is a 422 that says which is served.
- Errors come in OpenAI's shape, ``{"error": {"message", "type", "param",
  "code"}}``, so the SDK's exception text carries the reason (errors.py).

Example::

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    client.embeddings.create(model="all-MiniLM-L6-v2", input=["a film"]).data[0].embedding
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends
from fastapi.responses import Response

from layerbank.app.api.deps import AppState, get_state
from layerbank.app.api.embedding_recipe import choose
from layerbank.app.api.errors import InvalidInput
from layerbank.app.api.route_helpers import (
    check_pooling,
    check_texts,
    encode_rows,
    json_response,
    require_json,
    resolve_request,
    row_fragments,
)
from layerbank.app.api.schemas import EmbeddingsRequest, EmbeddingsResponse, OpenAIErrorResponse
from layerbank.app.api.served_models import ensure_model, find_model
from layerbank.app.api.text_features import compute_features
from layerbank.cache.keys import text_key

__all__ = ["cached_answer", "router"]

router = APIRouter(prefix="/v1", tags=["openai"])
_ERRORS: dict[int | str, dict[str, Any]] = {
    c: {"model": OpenAIErrorResponse} for c in (401, 413, 415, 422, 429, 500, 503, 504)}


@router.post("/embeddings", response_model=EmbeddingsResponse, responses=_ERRORS,
             dependencies=[Depends(require_json)], summary="OpenAI-compatible embeddings")
async def embeddings(req: EmbeddingsRequest, state: AppState = Depends(get_state)) -> Response:
    texts = [req.input] if isinstance(req.input, str) else list(req.input)
    if not texts:
        raise InvalidInput("input: give a text or a non-empty list of texts", field="input")
    check_texts(texts, state, field="input")
    if req.view == "all_layers":
        raise InvalidInput("input: /v1/embeddings returns one vector per text; use /v1/features "
                           "for all_layers", field="view")
    await ensure_model(state, req.model)  # another served model's first use loads it
    # the model's own recipe, part by part overridden by the request (app/api/embedding_recipe.py)
    how = choose(find_model(state, req.model).info, state.settings, view=req.view,
                 pooling=req.pooling, normalize=req.normalize)
    m, parsed = resolve_request(state, how.view, req.model, req.precision)
    dim = parsed.output_dim(m.n_hidden_states, m.hidden_size)
    if req.dimensions is not None and req.dimensions != dim:
        raise InvalidInput(f"dimensions: this view gives {dim}-dimensional vectors; vectors are not "
                           f"truncated (omit dimensions or send {dim})", field="dimensions")
    r = await compute_features(state, texts, how.view, how.pooling, req.model, req.precision)
    data = _unit_rows(r.data) if how.normalize else r.data
    fmt = "base64" if req.encoding_format == "base64" else "json"
    rows = encode_rows(data, fmt, "float32")
    tokens = int(sum(r.n_tokens))
    return json_response({
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(rows)],
        "model": r.model.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })


def cached_answer(state: AppState, body: bytes) -> bytes | None:
    """The answer to an ``/v1/embeddings`` body whose every text is in memory, or None
    (app/api/fast_reads.py): the route's checks in its order, its bytes; anything else
    is None and the route answers it."""
    try:
        req = EmbeddingsRequest.model_validate(json.loads(body))
        texts = [req.input] if isinstance(req.input, str) else list(req.input)
        if not texts or req.view == "all_layers":
            return None
        check_texts(texts, state, field="input")
        how = choose(find_model(state, req.model).info, state.settings, view=req.view,
                     pooling=req.pooling, normalize=req.normalize)
        m, parsed = resolve_request(state, how.view, req.model, req.precision)
        dim = parsed.output_dim(m.n_hidden_states, m.hidden_size)
        if (req.dimensions is not None and req.dimensions != dim) or len(texts) * dim > 200_000:
            return None
        pooling = check_pooling(state, how.pooling)
    except Exception:  # noqa: BLE001  (the route gives the error its shape)
        return None
    fmt = "base64" if req.encoding_format == "base64" else "json"
    keys = [text_key(m.fingerprint, m.config, t) for t in texts]
    got = state.rows.try_fragments(
        keys, parsed, pooling, m.n_hidden_states, ("embeddings", parsed.spec, fmt, how.normalize),
        lambda data: row_fragments(_unit_rows(data) if how.normalize else data, fmt, "float32"))
    if got is None:
        return None
    rows, entries = got
    state.metrics.cache_hits.inc(len(keys))
    tokens = int(sum(e.n_tokens for e in entries))
    # json.dumps of the route's answer, key for key (tests/unit/app/test_fast_reads.py)
    items = b",".join(b'{"object":"embedding","index":%d,"embedding":%b}' % (i, e) for i, e in enumerate(rows))
    return (b'{"object":"list","data":[' + items + b'],"model":' + json.dumps(m.name).encode()
            + b',"usage":{"prompt_tokens":%d,"total_tokens":%d}}' % (tokens, tokens))


def _unit_rows(x: np.ndarray) -> np.ndarray:
    """Each row L2-normalised, as sentence-transformers' Normalize module does (eps 1e-12)."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, np.float32(1e-12))

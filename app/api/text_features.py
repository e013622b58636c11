"""Features for texts over HTTP: layerbank.app.features_service with the store
(through the row cache) as the reader and the micro-batcher as the encoder.

``compute_features`` is what ``/v1/features``, ``/v1/embeddings`` and a head's
predictions share: rows already in memory (app/api/rowcache.py) are read on the
event loop, others from the store in a thread, never through the worker; the
misses go to the batcher, which encodes them with other requests' misses and
reads them into memory (``warm_rows``) before this request reads them again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.concurrency import run_in_threadpool

from layerbank.app.api.deps import AppState, ModelRef
from layerbank.app.api.errors import ExtractionFailed
from layerbank.app.api.route_helpers import check_pooling, resolve_request
from layerbank.app.api.served_models import ensure_model
from layerbank.app.features_service import AsyncTextSource, TextsLost, features_for_async
from layerbank.cache.keys import text_key
from layerbank.cache.store import ReadResult
from layerbank.cache.views import View

__all__ = ["FeatureResult", "compute_features", "warm_rows"]


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


async def compute_features(state: AppState, texts: list[str], view_spec: str | None,
                           pooling: str | None, model: str | None,
                           precision: str | None = None) -> FeatureResult:
    await ensure_model(state, model)  # another served model's first use loads it
    m, view = resolve_request(state, view_spec, model, precision)
    pooling = check_pooling(state, pooling)
    try:
        got = await features_for_async(texts, _Batched(state, m, view, pooling).source())
    except TextsLost as e:
        raise ExtractionFailed(f"{e.lost} texts were encoded but could not be read back "
                               "(a damaged shard was quarantined twice); retry") from None
    [res] = got.results
    out = FeatureResult(res.data, got.cached, [e.n_tokens for e in got.entries],
                        [e.truncated for e in got.entries], m, view, pooling, got.keys)
    if not got.cached.all():
        state.metrics.tokens_computed.inc(out.tokens_computed)
    return out


class _Batched:
    """One request's reader and encoder: the row cache and store, and the batcher."""

    def __init__(self, state: AppState, m: ModelRef, view: View, pooling: str) -> None:
        self.state, self.m, self.view, self.pooling = state, m, view, pooling
        self._first = True

    def source(self) -> AsyncTextSource:
        return AsyncTextSource(keys=self.keys, read=self.read, encode=self.encode)

    def keys(self, texts: list[str]) -> list[str]:
        return [text_key(self.m.fingerprint, self.m.config, t) for t in texts]

    async def read(self, keys: list[str]) -> list[ReadResult]:
        rows, h = self.state.rows, self.m.n_hidden_states
        # rows already in memory are answered on the event loop; disk reads go to a thread
        res = rows.try_read(keys, self.view, self.pooling, h)
        if res is None:
            res = await run_in_threadpool(rows.read, self.state.store, keys, self.view, self.pooling, h)
        if self._first:  # the request's own texts; later reads are its misses, read back
            self._first = False
            metrics, n_hit = self.state.metrics, int(res.found.sum())
            metrics.cache_hits.inc(n_hit)
            if n_hit < len(keys):
                metrics.cache_misses.inc(len(keys) - n_hit)
        return [res]

    async def encode(self, texts: list[str], keys: list[str] | None) -> int:
        await self.state.batcher.encode(texts, model=self.m.fingerprint, precision=self.m.precision,
                                        hint=(keys, self.pooling))
        return len(texts)


async def warm_rows(state: AppState, hints: list[Any]) -> None:
    """After a micro-batch is stored: read all its requests' rows in one store
    read per pooling, so each request then answers from memory."""
    by_pooling: dict[str, list[str]] = {}
    for h in hints:
        if h is not None:
            by_pooling.setdefault(h[1], []).extend(h[0])
    for pooling, keys in by_pooling.items():
        await run_in_threadpool(state.rows.warm, state.store, keys, pooling)

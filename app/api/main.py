"""The FastAPI application: ``create_app(settings) -> FastAPI``.

The app reads the feature store directly (cached reads never touch the
worker) and submits misses and dataset extractions as jobs that the worker
process runs. It never imports torch: ``layerbank serve`` starts the worker
as a separate process (app/cli/serve.py).

Request path through the middleware, outermost first: request timer
(metrics) -> lab pages -> Host/Origin (keyless servers only, app/api/origin.py) -> API key ->
body size limit -> cached reads answered from memory (app/api/fast_reads.py) -> routes. Errors from any layer come
out in one shape (app/api/errors.py).

Example::

    from layerbank.app.api.main import create_app
    from layerbank.app.api.settings import Settings
    app = create_app(Settings(data_dir="layerbank-data"))
    # uvicorn.run(app) -- or `layerbank serve`, which also starts the worker
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from starlette.routing import Route

from layerbank.app.api.batcher import Batcher
from layerbank.app.api.catalog_health import install_catalog_handlers, watch_catalog
from layerbank.app.api.deps import ApiKeyGuard, AppState, BodyLimitGuard
from layerbank.app.api.errors import install_error_handlers
from layerbank.app.api.fast_reads import CachedReads
from layerbank.app.api.lab import LabPages
from layerbank.app.api.metrics import Metrics, RequestTimer
from layerbank.app.api.origin import OriginGuard, allowed_host_names
from layerbank.app.api.routes import (
    dataset_stats,
    datasets,
    docs,
    embeddings,
    features,
    heads,
    jobs,
    ops,
    probes,
    regimes,
)
from layerbank.app.api.schemas import apply_limits
from layerbank.app.api.served_models import model_names
from layerbank.app.api.settings import Settings, get_settings

__all__ = ["create_app"]

log = logging.getLogger("layerbank.api")
_REFRESH_S = 0.5  # how often the app re-reads which worker and model are live


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; the store opens at start-up (lifespan), not here."""
    settings = settings or get_settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = AppState(settings)
        state.metrics = metrics
        metrics.bind(state)
        state.batcher = Batcher(state.queue, window_ms=settings.batch_window_ms,
                                max_pending=settings.max_queue_depth,
                                on_done=lambda hints: features.warm_rows(state, hints),
                                data_dir=state.store.root)
        app.state.layerbank = state
        state.refresh_model()
        watcher = asyncio.create_task(_watch_model(state))
        state.catalog_problem = None  # set by the catalog check (app/api/catalog_health.py)
        checker = asyncio.create_task(watch_catalog(state, settings.catalog_check_seconds))
        try:
            yield
        finally:
            watcher.cancel()
            checker.cancel()
            await state.batcher.close()
            state.close()

    # /docs and /redoc come from files in the package (routes/docs.py), not FastAPI's CDN links
    app = FastAPI(title="layerbank", version=ops.VERSION, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Hidden states of every layer, computed once and served from a "
                              "cache. Errors: {\"error\", \"type\"} everywhere.")
    metrics = Metrics()
    install_error_handlers(app)
    install_catalog_handlers(app)  # damaged catalog -> 503, SQLite's disk full -> 507
    for r in (features.router, embeddings.router, datasets.router, jobs.router, ops.router,
              probes.router, heads.router, regimes.router, docs.router, dataset_stats.router):
        app.include_router(r)
    _openapi_with_limits(app, settings)
    # added innermost first: the timer sees every request, 401s and 413s included
    answers = {"/v1/features": features.cached_answer, "/v1/embeddings": embeddings.cached_answer}
    app.add_middleware(CachedReads, answers=answers,
                       routes={r.path: r for r in (*features.router.routes, *embeddings.router.routes)
                               if isinstance(r, Route) and r.path in answers})  # APIRoute is a Route
    app.add_middleware(BodyLimitGuard, max_bytes=settings.max_body_bytes)
    app.add_middleware(ApiKeyGuard, api_key=settings.api_key)
    if not settings.api_key:  # with a key, a browser can't act for the user anyway
        app.add_middleware(OriginGuard, allowed=allowed_host_names(settings.host, settings.allowed_hosts))
    # the lab's pages hold no data: answered before the key guard, so a browser can ask for the key
    app.add_middleware(LabPages)
    app.add_middleware(RequestTimer, metrics=metrics)
    return app


def _openapi_with_limits(app: FastAPI, settings: Settings) -> None:
    """The schema at /openapi.json carries this server's limits and, once the
    worker has registered the model, its layer range and names."""
    generate = app.openapi
    made_for: list[Any] = [object()]  # the model the cached schema was made for

    def openapi() -> dict[str, Any]:
        state = getattr(app.state, "layerbank", None)
        model = None if state is None else state.model
        if app.openapi_schema is None or made_for[0] is not model:
            app.openapi_schema = None
            apply_limits(generate(), max_texts=settings.max_texts_per_request,
                         max_chars=settings.max_chars_per_text,
                         max_dataset_texts=settings.max_dataset_texts,
                         n_states=None if model is None else model.n_hidden_states,
                         model_names=None if state is None or model is None else model_names(state))
            _document_forbidden(app.openapi_schema)
            made_for[0] = model
        return app.openapi_schema  # type: ignore[return-value]  # generate() above set it

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to customise it


def _document_forbidden(schema: dict[str, Any] | None) -> None:
    """Every operation may answer 403: the Host and Origin guard (app/api/origin.py) runs
    before routing, so no route declares it; the schema says so, in that route's error shape."""
    for operations in (schema or {}).get("paths", {}).values():
        for op in operations.values():
            responses = op.get("responses", {})
            shape = responses.get("422") or responses.get("404") or {
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
            responses.setdefault("403", {
                "description": "a Host name this server does not answer to, or a cross-site request "
                               "on a server without an API key",
                "content": shape.get("content", {})})


async def _watch_model(state: AppState) -> None:
    """Keep the app's view of live workers and their model fresh."""
    from layerbank.cache.outage import OutageWait, catalog_outage

    outage = OutageWait(log)
    while True:
        try:  # in a thread: a catalog that does not answer must not stall every request with it
            await asyncio.to_thread(state.refresh_model)
            outage.over()
        except Exception as e:
            if catalog_outage(e):
                outage.begin(e)  # one warning per outage, not a traceback per tick
            else:  # a locked or busy catalog: try again next tick
                log.exception("could not refresh the worker and model state")
        await asyncio.sleep(_REFRESH_S)

"""Prometheus metrics at ``/metrics``, one registry per app.

Measured in the app process:

    layerbank_request_seconds{method,route,status}   histogram of request latency
    layerbank_cache_hits_total / _cache_misses_total  texts answered from / missing in the store
    layerbank_tokens_computed_total                   tokens encoded for HTTP requests' misses
    layerbank_encode_batches_total / _encode_batch_texts_total   micro-batches and their texts

Read from the catalog at scrape time (so they include the worker's work and
survive restarts):

    layerbank_tokens_extracted_total        every token the worker encoded (requests and datasets)
    layerbank_texts_extracted_total
    layerbank_jobs{state}                   jobs per state
    layerbank_queue_depth{queue}            requests waiting for misses; queued jobs
    layerbank_quarantined_shards_total      shards that failed their checksum
    layerbank_store_keys / _store_shards / _store_bytes
    layerbank_row_cache_rows / _row_cache_bytes   rows held in memory (app/api/rowcache.py)
    layerbank_workers_live, layerbank_worker_restarts_total

Example::

    metrics = Metrics()
    app.add_middleware(RequestTimer, metrics=metrics)
    metrics.bind(state)                 # once the store is open
    body = metrics.render()
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from layerbank.app.api.deps import AppState

__all__ = ["CONTENT_TYPE", "Metrics", "RequestTimer"]

disable_created_metrics()  # the *_created series only add noise to every scrape
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    """Made with the app; ``bind(state)`` adds the catalog figures once the store is open."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.latency = Histogram("layerbank_request_seconds", "HTTP request latency",
                                 ["method", "route", "status"], buckets=_BUCKETS, registry=r)
        self.cache_hits = Counter("layerbank_cache_hits", "texts answered from the store", registry=r)
        self.cache_misses = Counter("layerbank_cache_misses", "texts not yet stored when asked",
                                    registry=r)
        self.tokens_computed = Counter("layerbank_tokens_computed",
                                       "tokens encoded for the misses of HTTP requests", registry=r)
        self._collector: _CatalogCollector | None = None

    def bind(self, state: AppState) -> None:
        if self._collector is not None:
            self.registry.unregister(self._collector)
        self._collector = _CatalogCollector(state)
        self.registry.register(self._collector)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _CatalogCollector:
    """Figures that live in the catalog or the batcher, read at scrape time."""

    def __init__(self, state: AppState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        s = self.state
        cat = s.store.catalog
        for name, help_ in (("tokens_extracted", "tokens encoded by the worker"),
                            ("texts_extracted", "texts encoded by the worker"),
                            ("quarantined_shards", "shards quarantined after a failed checksum")):
            yield CounterMetricFamily(f"layerbank_{name}", help_, value=cat.counter(name))
        jobs = GaugeMetricFamily("layerbank_jobs", "jobs per state", labels=["state"])
        for state, n in s.queue.counts().items():
            jobs.add_metric([state], n)
        yield jobs
        depth = GaugeMetricFamily("layerbank_queue_depth", "work waiting", labels=["queue"])
        depth.add_metric(["requests_waiting_for_misses"], s.batcher.waiting if s.batcher else 0)
        depth.add_metric(["jobs_queued"], s.queue.queued())
        yield depth
        stats = cat.stats()
        yield GaugeMetricFamily("layerbank_store_keys", "stored texts", value=stats["keys"])
        yield GaugeMetricFamily("layerbank_store_shards", "committed shards", value=stats["shards"])
        yield GaugeMetricFamily("layerbank_store_bytes", "bytes of committed shards",
                                value=stats["bytes"])
        yield GaugeMetricFamily("layerbank_row_cache_rows", "rows held in memory", value=len(s.rows))
        yield GaugeMetricFamily("layerbank_row_cache_bytes", "bytes of rows held in memory",
                                value=s.rows.bytes)
        yield GaugeMetricFamily("layerbank_workers_live", "workers with a fresh heartbeat",
                                value=len(s.workers))
        yield CounterMetricFamily("layerbank_worker_restarts", "worker processes restarted by serve",
                                  value=s.worker_restarts)
        if s.batcher is not None:
            yield CounterMetricFamily("layerbank_encode_batches", "micro-batches of misses submitted",
                                      value=s.batcher.stats.batches)
            yield CounterMetricFamily("layerbank_encode_batch_texts", "texts in those micro-batches",
                                      value=s.batcher.stats.texts)


class RequestTimer:
    """Pure ASGI middleware (no BaseHTTPMiddleware overhead): one histogram
    observation per request, labelled by the route's template, not its path,
    so ids do not explode the label set."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics
        self._children: dict[tuple[str, str, str], Any] = {}  # labels() costs more than observe()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500

        async def send_status(msg: Message) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            labels = (scope["method"], getattr(route, "path", None) or "unmatched", str(status))
            child = self._children.get(labels)
            if child is None:
                child = self._children[labels] = self.metrics.latency.labels(*labels)
            child.observe(time.perf_counter() - t0)

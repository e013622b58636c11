"""What every request depends on: the app's state (store, queue, batcher, the
model the worker serves) and two guards that run before routing (API key,
body size).

The app learns which model it serves from the worker: a live worker (fresh
``worker_seen`` row, and on this host a process that exists) names its
model fingerprint, and the ``models`` table holds that model's shape and
resolved extraction config. ``AppState.refresh_model`` re-reads this a few
times a second; the last model seen stays usable for cached reads while a
worker restarts.

Example::

    state = get_state(request)
    model = state.require_model()        # 503 not_ready until a worker registered one
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from layerbank.app.api.errors import InvalidInput, NotReady, body_for
from layerbank.app.api.rowcache import ROW_CACHE_BYTES, RowCache
from layerbank.app.api.settings import Settings
from layerbank.cache.datasets import DatasetStore
from layerbank.cache.jobs import JobQueue, pid_alive
from layerbank.cache.keys import ExtractionConfig
from layerbank.cache.store import FeatureStore, open_reader_budget

__all__ = ["ApiKeyGuard", "AppState", "BodyLimitGuard", "ModelRef", "get_state"]


@dataclass(frozen=True)
class ModelRef:
    """The served model, as the worker registered it."""

    fingerprint: str
    config: str  # ExtractionConfig.canonical(): part of every key
    name: str
    n_hidden_states: int
    hidden_size: int
    storage_dtype: str
    precision: str
    info: dict[str, Any]

    @classmethod
    def from_info(cls, fingerprint: str, info: dict[str, Any]) -> ModelRef:
        """The model as the catalog's ``models`` table holds it (registered by a worker)."""
        cfg = json.loads(info["config"])
        return cls(fingerprint, info["config"], str(info.get("name", fingerprint)),
                   int(info["n_hidden_states"]), int(info["hidden_size"]),
                   str(cfg.get("storage_dtype", "float16")), str(cfg.get("precision", "fp32")), info)

    def names(self) -> list[str]:
        """Every name a request's ``model`` may use for this model."""
        path = str(self.info.get("path", ""))
        # "all-MiniLM-L6-v2 (embedded)" is also asked for as all-MiniLM-L6-v2 and its hub name
        base = self.name.split(" (")[0]
        out = ["default", self.name, base, f"sentence-transformers/{base}", self.fingerprint, path,
               os.path.basename(path.rstrip("/"))]
        return [n for n in dict.fromkeys(out) if n]

    def accepts(self, requested: str | None) -> bool:
        """Whether a request's ``model`` names this model."""
        return requested is None or requested in self.names()

    def at_precision(self, requested: str | None) -> ModelRef:
        """This model computing at a request's ``precision`` (None: as served).

        The worker publishes what each mode resolves to on its device
        (``precision_modes``), so the config, and with it every key, is made
        here without torch. A bf16 request's keys differ from an fp32 one's:
        the two never answer each other. 422 for a mode the device lacks.
        """
        if requested is None:
            return self
        modes = self.info.get("precision_modes") or {self.precision: self.precision}
        if requested not in modes:
            raise InvalidInput(f"precision must be one of {', '.join(modes)}, got {requested!r}",
                               field="precision")
        resolved = modes[requested]
        if resolved is None:
            raise InvalidInput(f"precision {requested} is not available on the worker's device "
                               f"({self.info.get('device', 'cpu')}); fp16 needs CUDA, use bf16 or fp32",
                               field="precision")
        if resolved == self.precision:
            return self
        cfg = dataclasses.replace(ExtractionConfig.from_json(self.config), precision=resolved)
        return dataclasses.replace(self, config=cfg.canonical(), precision=resolved)


class AppState:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = FeatureStore(settings.data_dir, catalog_url=settings.catalog_url,
                                  max_open_readers=open_reader_budget(settings.reader_memory_mb))
        self.queue = JobQueue(self.store.catalog)
        self.datasets = DatasetStore(self.store.catalog)
        self.model: ModelRef | None = None
        # several models (app/api/served_models.py): every model the live worker serves, as it
        # describes them, and those whose config it registered, by fingerprint
        self.served: list[dict[str, Any]] = []
        self.models: dict[str, ModelRef] = {}
        self.loading: dict[str, str] = {}  # fingerprint -> id of the job loading it
        self.rows = RowCache(ROW_CACHE_BYTES, dtype="float32")  # replaced once the model is known
        self.workers: list[dict[str, Any]] = []
        self.host = socket.gethostname()
        self.started = time.time()
        self.worker_restarts = 0  # set by `layerbank serve`'s supervisor
        self.catalog_problem: str | None = None  # set by the catalog check (app/api/catalog_health.py)
        # filled in by create_app (they need the state)
        self.batcher: Any = None
        self.metrics: Any = None

    @property
    def liveness_window_s(self) -> float:
        return 3 * self.settings.heartbeat_seconds + 2.0

    def refresh_model(self) -> None:
        """Re-read which workers are alive and which model they serve."""
        live = [w for w in self.queue.live_workers(self.liveness_window_s)
                if w.get("state") != "stopped" and self._process_alive(w)]
        live.sort(key=lambda w: w["last_seen"], reverse=True)
        self.workers = live
        if not live:
            return
        self._refresh_others(live[0].get("models") or [])
        fp = str(live[0].get("fingerprint") or "")
        if not fp or (self.model is not None and self.model.fingerprint == fp):
            return
        info = self.store.catalog.model_info(fp)
        if info is None:
            return
        self.model = ModelRef.from_info(fp, info)
        # rows are kept in the storage dtype: float16 in memory loses nothing stored as float16
        # (int8 rows are read back dequantised, as float32)
        dtype = "float32" if self.model.storage_dtype == "int8" else self.model.storage_dtype
        self.rows = RowCache(ROW_CACHE_BYTES, dtype=dtype)

    def _refresh_others(self, served: list[dict[str, Any]]) -> None:
        """The served models besides the default; a config counts only once the live
        worker has registered it in this run (settings may have changed since an older one)."""
        self.served = [m for m in served if not m.get("default")]
        models = {}
        for m in self.served:
            fp = str(m.get("fingerprint", ""))
            if not m.get("registered"):
                continue
            if fp in self.models:
                models[fp] = self.models[fp]
            elif (info := self.store.catalog.model_info(fp)) is not None:
                models[fp] = ModelRef.from_info(fp, info)
        self.models = models

    def _process_alive(self, w: dict[str, Any]) -> bool:
        if w.get("host") != self.host:
            return True  # another machine: the heartbeat is all we know
        try:
            return pid_alive(int(w["pid"]))
        except (ValueError, TypeError):  # no usable pid recorded: trust the heartbeat
            return True

    @property
    def ready(self) -> bool:
        return self.model is not None and bool(self.workers)

    def require_model(self) -> ModelRef:
        if self.model is None:
            raise NotReady("the encoder is still loading (no worker has registered a model yet); "
                           "retry when /ready answers 200", headers={"Retry-After": "2"})
        return self.model

    def close(self) -> None:
        self.store.close()


async def get_state(request: Request) -> AppState:
    return request.app.state.layerbank


async def _send_error(scope: Scope, send: Send, status: int, message: str, type_: str,
                      headers: list[tuple[bytes, bytes]] | None = None, **extra: Any) -> None:
    body = json.dumps(body_for(scope["path"], status, message, type_, **extra)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())] + (headers or [])})
    await send({"type": "http.response.body", "body": body})


class ApiKeyGuard:
    """``Authorization: Bearer <key>`` on every route except /health."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self.key = api_key.encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.key is None or scope["type"] != "http" or scope["path"] == "/health":
            await self.app(scope, receive, send)
            return
        given = b""
        for k, v in scope["headers"]:
            if k == b"authorization":
                scheme, _, token = v.partition(b" ")
                if scheme.lower() == b"bearer":
                    given = token.strip()
                break
        if not hmac.compare_digest(given, self.key):
            await _send_error(scope, send, 401, "missing or wrong API key: send 'Authorization: Bearer "
                              "<key>'", "unauthorized", [(b"www-authenticate", b"Bearer")])
            return
        await self.app(scope, receive, send)


class BodyLimitGuard:
    """413 for bodies over ``max_body_bytes``, by Content-Length or while streaming.

    A chunked body that grows past the limit makes ``receive`` report a
    disconnect to the app, and the response the app then tries to send is
    replaced by the 413.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max = max_bytes

    def _message(self) -> str:
        return f"request body exceeds max_body_bytes ({self.max:,} bytes)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for k, v in scope["headers"]:
            if k == b"content-length":
                if v.isdigit() and int(v) > self.max:
                    await _send_error(scope, send, 413, self._message(), "too_large", limit="max_body_bytes")
                    return
                break
        seen = 0
        over = False
        started = False

        async def limited_receive() -> Message:
            nonlocal seen, over
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max:
                    over = True
                    return {"type": "http.disconnect"}
            return msg

        async def guarded_send(msg: Message) -> None:
            nonlocal started
            if over:
                if not started and msg["type"] == "http.response.start":
                    started = True
                    await _send_error(scope, send, 413, self._message(), "too_large", limit="max_body_bytes")
                return
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not over:
                raise
            if not started:
                await _send_error(scope, send, 413, self._message(), "too_large", limit="max_body_bytes")

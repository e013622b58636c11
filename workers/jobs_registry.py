"""Job kinds the worker runs: a registry from kind name to handler, and what a handler sees.

A handler takes a ``JobContext`` (below) and returns a JSON-serialisable
result (stored as the job's ``result``). It raises ``JobError`` for a job that
cannot run as submitted (the message becomes the job's error text, shown to
users), and checks ``ctx.should_continue()`` between units of work (batches,
epochs): when it turns False the handler should raise (any exception, e.g.
``layerbank.workers.extract.Stopped``); the runner (``layerbank.cache.runner``)
then records cancelled or hands the job back, whichever applies.

``JobContext`` lives here, not in worker.py, so that the worker imports this
registry and nothing here imports the worker (no import cycle): it knows its
worker only through the ``JobHost`` protocol.

Built-in kinds:

    encode      {"texts": [...], "model": str | None, "want_tokens": bool}
                the synchronous misses of HTTP requests (priority ENCODE_PRIORITY)
    extract     {"dataset_id": str, "want_tokens": bool}
                a dataset's extraction (priority 0), by the dataset's model
    load_model  {"model": str}
                load a served model on its first use and register it, so the API
                can make its keys (priority ENCODE_PRIORITY)

To add a kind, in your own module::

    from layerbank.workers.jobs_registry import register_kind

    @register_kind("regimes")
    def run_regimes_job(ctx) -> dict:
        texts = ...  # ctx.job.payload, ctx.datasets, ctx.store, ctx.encoder
        ctx.progress({"done": 1, "total": 10})
        return {...}

and add the module's name to ``KIND_MODULES`` below so the worker imports it
at start (it is imported lazily: a kind's heavy dependencies load only in the
worker process).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from layerbank.cache import request_texts
from layerbank.cache.jobs import Job, JobQueue
from layerbank.cache.runner import JobError, Lease

from .batching import default_max_tokens
from .extract import ExtractSummary, extract

if TYPE_CHECKING:
    from layerbank.cache.datasets import DatasetStore
    from layerbank.cache.store import FeatureStore

    from .backends import ExtractionBackend
    from .encoder import Encoder

__all__ = [
    "ENCODE_PRIORITY",
    "JOB_KINDS",
    "KIND_MODULES",
    "URGENT_KINDS",
    "JobContext",
    "JobError",
    "JobHost",
    "register_kind",
    "run_encode",
    "run_extract",
    "run_load_model",
]

ENCODE_PRIORITY = 100
CPU_ENCODE_MAX_TOKENS = 512  # see encode_budget
URGENT_KINDS = ("encode", "load_model")  # run between the batches of any other kind

Handler = Callable[["JobContext"], Any]
JOB_KINDS: dict[str, Handler] = {}
KIND_MODULES: list[str] = ["layerbank.workers.regimes.job_kind"]  # modules that call register_kind when imported


class JobHost(Protocol):
    """What a handler may reach of the worker running it (``layerbank.workers.worker.Worker``)."""

    store: FeatureStore
    encoder: Encoder
    datasets: DatasetStore
    backend: ExtractionBackend
    queue: JobQueue
    id: str
    stopping: threading.Event
    options: Any  # WorkerOptions

    def encoder_at(self, precision: str | None, model: str | None = None) -> Encoder: ...

    def serve_urgent(self) -> None: ...


class JobContext:
    """What a handler sees: its job, the store, the encoder, and its controls."""

    def __init__(self, worker: JobHost, job: Job, lease: Lease) -> None:
        self.worker = worker
        self.job = job
        self.lease = lease
        self.store = worker.store
        self.encoder = worker.encoder
        self.datasets = worker.datasets
        self.options = worker.options
        self.stopped = lease.stopped  # cancelled, or the lease was lost

    def progress(self, p: Any) -> None:
        """Record progress (a dict, or anything with ``as_dict()``)."""
        self.lease.report(p.as_dict() if hasattr(p, "as_dict") else dict(p))

    def should_continue(self) -> bool:
        # every job, urgent ones too: a 300-text request's batches let a 1-text miss through
        # (serve_urgent runs one level deep, so nested requests do not recurse)
        self.worker.serve_urgent()
        return not (self.stopped.is_set() or self.worker.stopping.is_set())


def register_kind(name: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        JOB_KINDS[name] = fn
        return fn
    return deco


def _count(ctx: JobContext, summary: ExtractSummary) -> None:
    if summary.tokens_encoded:
        ctx.store.catalog.bump("tokens_extracted", summary.tokens_encoded)
        ctx.store.catalog.bump("texts_extracted", summary.texts_encoded)


@register_kind("encode")
def run_encode(ctx: JobContext) -> dict[str, Any]:
    """Synchronous misses: payload ``{"texts": [...], "model": str | None,
    "precision": str | None, "want_tokens": bool}`` (precision: the resolved
    mode the API made the keys for; None: as served); a big request names a
    ``texts_file`` instead of ``texts`` (``layerbank.cache.request_texts``)."""
    p = ctx.job.payload
    # the model the API made the keys for (its fingerprint); another served one loads now
    enc = ctx.worker.encoder_at(p.get("precision"), model=p.get("model"))
    texts = request_texts.texts_of(ctx.store.root, p)  # inline, or a big request's file
    summary = extract(texts, ctx.store, enc, job_id=ctx.job.id,
                      want_tokens=bool(p.get("want_tokens")), part_size=ctx.options.part_size,
                      max_tokens=encode_budget(ctx), should_continue=ctx.should_continue)
    _count(ctx, summary)
    return summary.as_dict()


def encode_budget(ctx: JobContext) -> int:
    """Padded tokens per batch for request misses.

    A micro-batch mixes texts of any length, and a CPU spends its time on
    padded tokens: 64 SST-2 phrases (1,057 tokens, longest 40) took 1.9 s as
    one batch (2,560 padded tokens) and 0.88 s as length-sorted batches of at
    most 512 padded tokens (1 thread). A GPU needs big batches to be busy,
    so it keeps the configured budget.
    """
    if ctx.encoder.device.type == "cpu":
        return min(ctx.options.max_tokens or CPU_ENCODE_MAX_TOKENS, CPU_ENCODE_MAX_TOKENS)
    return ctx.options.max_tokens or default_max_tokens(ctx.encoder.device.type)


@register_kind("extract")
def run_extract(ctx: JobContext) -> dict[str, Any]:
    """A dataset's extraction: payload ``{"dataset_id": str, "want_tokens": bool}``."""
    ds_id = ctx.job.payload["dataset_id"]
    ds = ctx.datasets.get(ds_id)
    if ds is None:
        raise JobError(f"dataset {ds_id} was deleted before it was extracted")
    # the dataset was registered for a model and at a precision of its own (part of its config)
    enc = ctx.worker.encoder_at(json.loads(ds.config).get("precision"), model=ds.meta.get("fingerprint"))
    fp = ds.meta.get("fingerprint", enc.fingerprint)
    if fp != enc.fingerprint or ds.config != enc.config.canonical():
        raise JobError(f"dataset {ds_id} was registered for model {ds.model!r} ({fp}) with config "
                       f"{ds.config}; this worker serves {enc.fingerprint} with "
                       f"{enc.config.canonical()}")
    items = ctx.datasets.items(ds_id)
    want_tokens = bool(ctx.job.payload.get("want_tokens")) or ds.task == "token"
    # the worker's backend: this process's encoder, or actors on a Ray cluster
    summary = ctx.worker.backend.run(items.texts, ctx.job.id, want_tokens=want_tokens,
                                     progress=ctx.progress, should_continue=ctx.should_continue,
                                     encoder=enc)
    _count(ctx, summary)
    return summary.as_dict()


@register_kind("load_model")
def run_load_model(ctx: JobContext) -> dict[str, Any]:
    """Load a served model on its first use: payload ``{"model": name or fingerprint}``.

    Loading registers its shape and extraction config in the catalog (the
    API makes its keys from them, without torch); unloading it later to
    stay within the memory budget keeps that registration.
    """
    enc = ctx.worker.encoder_at(None, model=str(ctx.job.payload["model"]))
    return {"fingerprint": enc.fingerprint, "name": enc.info.get("name")}

"""Which of the served models a request names, and loading one on its first use.

A server may serve several encoders (``--model`` given more than once). The
worker describes every one in its liveness row (name, path, fingerprint,
whether it registered the model's config in this run; workers/model_pool.py);
the default is ``AppState.model`` as with one model. A request's ``model``
(a dataset's, a head's fingerprint) picks one:

    None or a name of the default       -> the default, as with one model
    a name of a registered model        -> that model: its keys, made here
    a name of a model not loaded yet    -> a ``load_model`` job, awaited, then as above
    anything else                       -> 422 naming what is served

The keys need the model's resolved extraction config (max length, precision
as measured on the device), which only loading it tells; so the first
request for a model waits for its load (seconds), and every later one,
even after the worker unloaded it to stay within its memory budget, makes
keys at once: rows of one model never answer another, whose fingerprint
differs.

Example::

    m = await ensure_model(state, req.model)   # a ModelRef; 422 for a model not served
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from starlette.concurrency import run_in_threadpool

from layerbank.app.api.batcher import ENCODE_PRIORITY
from layerbank.app.api.deps import AppState, ModelRef
from layerbank.app.api.embedding_recipe import describe as describe_embeddings
from layerbank.app.api.errors import InvalidInput, NotReady, Timeout, job_failure

__all__ = ["describe_models", "ensure_model", "find_model", "model_names"]

_LOAD_TIMEOUT_S = 600.0
_POLL_S = 0.01


class _NotLoaded(NotReady):
    """A served model whose config the worker has not registered yet (503 if nobody loads it)."""

    def __init__(self, entry: dict[str, Any]) -> None:
        super().__init__(f"model {entry.get('name')!r} is loading; retry shortly",
                         headers={"Retry-After": "2"})
        self.entry = entry


def _entry_names(entry: dict[str, Any]) -> list[str]:
    path = str(entry.get("path") or "")
    out = [str(entry.get("name") or ""), path, os.path.basename(path.rstrip("/")),
           str(entry.get("fingerprint") or "")]
    return [n for n in dict.fromkeys(out) if n]


def find_model(state: AppState, requested: str | None) -> ModelRef:
    """The registered model ``requested`` names (None: the default); 422 for one not served."""
    default = state.require_model()
    if default.accepts(requested):
        return default
    for entry in state.served:
        if requested in _entry_names(entry):
            m = state.models.get(str(entry.get("fingerprint")))
            if m is None:
                raise _NotLoaded(entry)
            return m
    if not state.served:  # one model: the message as it always was
        names = ", ".join(repr(n) for n in default.names()[:4])
        raise InvalidInput(f"model {requested!r} is not served here; this server serves {default.name!r} "
                           f"(fingerprint {default.fingerprint}); send model= one of {names}, or omit it",
                           field="model")
    others = ", ".join(f"{e.get('name')!r} (fingerprint {e.get('fingerprint')})" for e in state.served)
    raise InvalidInput(f"model {requested!r} is not served here; this server serves {default.name!r} "
                       f"(fingerprint {default.fingerprint}, the default), {others}; send model= one "
                       "of their names or fingerprints (GET /info lists them), or omit it for the default",
                       field="model")


async def ensure_model(state: AppState, requested: str | None) -> ModelRef:
    """``find_model``, loading a served model first when this is its first use."""
    try:
        return find_model(state, requested)
    except _NotLoaded as e:
        entry = e.entry
    fp = str(entry["fingerprint"])
    job_id = state.loading.get(fp)
    job = None if job_id is None else await run_in_threadpool(state.queue.get, job_id)
    if job is None or job.state not in ("queued", "running"):  # none yet, or it ended: load (again)
        job_id = await run_in_threadpool(state.queue.submit, "load_model", {"model": fp},
                                         priority=ENCODE_PRIORITY)
        state.loading[fp] = job_id
    assert job_id is not None
    deadline = time.monotonic() + _LOAD_TIMEOUT_S
    while time.monotonic() < deadline:
        job = await run_in_threadpool(state.queue.get, job_id)
        if job is None or job.state in ("failed", "cancelled"):
            error = "the job disappeared" if job is None else (job.error or job.state)
            if job is not None and job.error_type == "storage":  # a full disk: 507, as for any job
                raise job_failure(error, job.error_type, what=f"loading model {entry.get('name')!r} failed")
            # the request is fine and the model's files are not: this server cannot serve it now
            raise NotReady(f"model {entry.get('name')!r} is served but could not be loaded: {error}")
        if job.state == "succeeded":
            await run_in_threadpool(state.refresh_model)
            return find_model(state, requested)
        await asyncio.sleep(_POLL_S)
    raise Timeout(f"model {entry.get('name')!r} did not load within {_LOAD_TIMEOUT_S:.0f} s")


def model_names(state: AppState) -> list[str] | None:
    """Every name a request's ``model`` may use (the OpenAPI enum); None before the default is known."""
    if state.model is None:
        return None
    names = list(state.model.names())
    for entry in state.served:
        names += _entry_names(entry)
    return list(dict.fromkeys(names))


def describe_models(state: AppState) -> list[dict[str, Any]]:
    """``/info``'s ``models``: every served model, the default first, with its shape and
    extraction config once it has been loaded."""
    out: list[dict[str, Any]] = []
    # a row is /info's JSON (mixed values), so dict[str, Any] as in the return type;
    # the ref is None for a served model not loaded yet
    refs: list[tuple[ModelRef | None, dict[str, Any]]] = (
        [(state.model, {"default": True, "loaded": True})] if state.model is not None else [])
    for entry in state.served:
        refs.append((state.models.get(str(entry.get("fingerprint"))),
                     {"name": entry.get("name"), "path": entry.get("path"),
                      "fingerprint": entry.get("fingerprint"), "default": False,
                      "loaded": bool(entry.get("loaded"))}))
    for m, base in refs:
        row = dict(base)
        if m is not None:
            row.update({"name": m.name, "path": m.info.get("path"), "fingerprint": m.fingerprint,
                        "layers": m.n_hidden_states - 1, "n_hidden_states": m.n_hidden_states,
                        "hidden_size": m.hidden_size, "precision": m.precision,
                        "extraction_config": m.config,
                        # what /v1/embeddings answers for it, and from which files
                        "embeddings": describe_embeddings(m.info, state.settings)})
        out.append(row)
    return out

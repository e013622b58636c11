"""Extraction on a Ray cluster: a pool of encoder actors that stay warm.

The driver (the API host, or the CLI) plans the job exactly as
``layerbank.workers.extract`` does: the job's unique texts in order of length, cut into
parts of ``part_size``; part ``p`` becomes shard ``{job_id}-{p:05d}``. Parts
already committed (a resubmitted job) and texts already stored are skipped.
The parts still to do go to an ``EncoderPool`` (``layerbank.workers.backends.ray_pool``)
of ``ShardEncoder`` actors (``num_gpus=1, num_cpus=0`` when the cluster has
GPUs). A server's worker starts its pool once and keeps it across jobs
(``RayBackend.start``); ``extract_with_ray`` without a pool starts one for
the call. Each actor encodes one part and hands its rows to the store's
shard storage (``FeatureStore.storage``, cache/storage.py; the local one is
the shared shard directory), which writes the write-once shard; the actor
returns only metadata (name, keys, token counts, truncation flags, bytes).
**Only the driver commits**, through ``FeatureStore.commit``, so SQLite
stays on the API host.

Failure semantics (see docs/operations.md): the pool replaces a dead actor
and re-queues its parts; the retry writes the same shard name, so a key is
never stored twice. A part whose shard was written but not committed is
written again by the next run and its file replaced. Once every part is
committed, the files a lost attempt left (named after its part, cut off
mid-write) are removed. Ray is imported
lazily: without the extra, calling this says ``pip install 'layerbank[ray]'``.

Example::

    summary = extract_with_ray(texts, store, encoder, job_id="j1", address="local", actors=2)
    summary.texts_encoded, summary.shards_written
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from layerbank.cache.fingerprint import default_model_path
from layerbank.cache.store import FeatureStore

from ..encoder import Encoder
from ..extract import ExtractSummary, Progress, Stopped, plan_parts
from .ray_actor import ShardEncoder
from .ray_pool import EncoderPool, PoolError

__all__ = [
    "INSTALL_HINT",
    "RayExtractionError",
    "RayUnavailable",
    "ShardEncoder",
    "connect",
    "encoder_spec",
    "extract_with_ray",
    "require_ray",
]

INSTALL_HINT = "pip install 'layerbank[ray]'"
log = logging.getLogger("layerbank.ray")
_TICK_S = 1.0  # the driver calls progress/should_continue at least this often (lease heartbeats)


class RayUnavailable(RuntimeError):
    """Ray (the optional extra) is not installed."""


class RayExtractionError(RuntimeError):
    """The Ray pipeline failed; committed parts stay valid, a resubmission skips them."""


def require_ray() -> Any:
    """The ``ray`` module, or ``RayUnavailable`` naming the extra to install."""
    try:
        import ray
    except ImportError as e:
        raise RayUnavailable(f"the Ray backend needs Ray: {INSTALL_HINT}") from e
    return ray


def connect(address: str | None) -> bool:
    """Connect this process to Ray unless it already is; True if this call did.

    ``address``: ``"local"`` starts a private local Ray, ``"auto"`` joins the
    cluster this host is a node of, ``"ray://host:10001"`` uses Ray Client,
    None lets Ray decide (``RAY_ADDRESS``, else a running local cluster, else
    a new one).
    """
    ray = require_ray()
    if ray.is_initialized():
        return False
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    if callable(before):
        # ray.init replaces SIGTERM with sys.exit; a worker that installed its own handler
        # (stop after the batch, hand the job back) keeps it, and closes Ray itself
        signal.signal(signal.SIGTERM, before)
    return True


def encoder_spec(encoder: Encoder) -> dict[str, Any]:
    cfg = encoder.config
    # the bundled model lives in site-packages, whose path may differ per node
    model = None if encoder.name == default_model_path() else encoder.name
    return {"model": model, "precision": cfg.precision, "max_length": cfg.max_length,
            "storage_dtype": cfg.storage_dtype, "truncation_side": cfg.truncation_side,
            "fingerprint": encoder.fingerprint, "config": cfg.canonical(),
            "poolings": list(encoder.poolings)}


def extract_with_ray(texts: Sequence[str], store: FeatureStore, encoder: Encoder, *, job_id: str,
                     want_tokens: bool = False, address: str | None = None, part_size: int = 2048,
                     max_tokens: int | None = None, actors: int = 1, gpus_per_actor: float | None = None,
                     threads: int | None = None,
                     progress: Callable[[Progress], None] | None = None,
                     should_continue: Callable[[], bool] | None = None,
                     fault: dict[str, str] | None = None, pool: EncoderPool | None = None,
                     timing: dict[str, float] | None = None) -> ExtractSummary:
    """Encode the texts not yet stored on a Ray cluster; commit shards here.

    Same parts, shard names and numbers as ``layerbank.workers.extract.extract``.
    ``pool``: warm actors to use (a server's worker keeps one; its encoder
    spec must be this encoder's); None starts ``actors`` actors for this
    call and stops them after. ``gpus_per_actor``: None = 1 when the cluster
    has GPUs, else 0 (CPU actors with ``num_cpus=1``). ``threads``: torch
    threads per actor. ``fault``: tests only (see ``ShardEncoder``).
    ``timing`` (filled in if given): ``first_batch_s``, seconds from this
    call to the end of the first encoder batch on an actor.
    """
    require_ray()  # say what to install before any work, even if all texts turn out stored
    t0, t0_wall = time.perf_counter(), time.time()
    # the same parts and shard names as the embedded backend
    plan = plan_parts(texts, store, encoder, job_id=job_id, part_size=part_size,
                      want_tokens=want_tokens)
    summary = plan.summary
    prog = Progress(0, sum(len(part.keys) for part in plan.parts), 0, 0.0)
    if progress:
        progress(prog)
    todo: list[dict[str, Any]] = []
    for part in plan.parts:
        if store.is_committed(part.name):  # a previous run of this job got this far
            prog.done += len(part.keys)
            continue
        todo.append({"name": part.name, "keys": part.keys, "texts": part.texts})
    if todo:
        if should_continue is not None and not should_continue():
            raise Stopped(f"job {job_id} stopped before it started")
        started = connect(address)
        own = pool is None
        if pool is None:
            pool = EncoderPool(encoder_spec(encoder), store.storage, size=min(actors, len(todo)),
                               gpus_per_actor=gpus_per_actor, threads=threads,
                               max_tokens=max_tokens, fault=fault)
        elif pool.spec != encoder_spec(encoder):
            raise ValueError("this pool's actors hold another encoder than the job's")
        pids: set[int] = set()
        try:
            expected = {t["name"]: t["keys"] for t in todo}
            for meta in _run(pool, todo, want_tokens, progress, should_continue, prog, t0):
                if not pids:  # the first part back: when did encoding start to pay off
                    first = max(0.0, float(meta["first_batch_at"]) - t0_wall)
                    if timing is not None:
                        timing.setdefault("first_batch_s", first)
                    log.info("job %s: first batch encoded %.2f s after the job started", job_id,
                             first)
                pids.add(int(meta["pid"]))
                _commit(store, meta, expected, want_tokens)
                summary.bytes_written += int(meta["n_bytes"])
                summary.shards_written += 1
                summary.texts_encoded += len(meta["keys"])
                summary.tokens_encoded += int(sum(meta["n_tokens"]))
                summary.truncated += int(sum(meta["truncated"]))
                prog.done += len(meta["keys"])
                prog.tokens += int(sum(meta["n_tokens"]))
                prog.seconds = time.perf_counter() - t0
                if progress:
                    progress(prog)
            log.info("job %s: %d parts encoded by Ray actor pids %s", job_id, len(todo),
                     ",".join(map(str, sorted(pids))))
            if lost := _remove_lost_attempts(store, [t["name"] for t in todo]):
                log.info("job %s: removed %d files that lost parts' attempts left", job_id, lost)
        finally:
            if own:
                pool.close()
            if started:
                require_ray().shutdown()
    summary.seconds = time.perf_counter() - t0
    return summary


def _remove_lost_attempts(store: FeatureStore, parts: list[str]) -> int:
    """Every one of ``parts`` is committed: a file named after one, other than its shard,
    is what an attempt whose actor was lost (killed, its node removed) left, cut off in
    its private temp write. Removed now, not at the worker's next start: a long-lived
    worker would keep them until then. (An actor that outlives even this, on a
    partitioned node, leaves a file that start removes: cache/leftovers.py.)"""
    prefixes = tuple(f"{p}." for p in parts)
    shards = {f"{p}.h5" for p in parts}
    removed = 0
    for s in store.storage.list(temp=True):
        if s.name.startswith(prefixes) and s.name not in shards and store.storage.delete(s.name):
            removed += 1
    return removed


def _commit(store: FeatureStore, meta: dict[str, Any], expected: dict[str, list[str]],
            want_tokens: bool) -> None:
    name = meta["name"]
    if expected.get(name) != meta["keys"]:
        raise RayExtractionError(f"shard {name} came back with other keys than were sent")
    store.commit(name, model=meta["fingerprint"], config=meta["config"], keys=meta["keys"],
                 n_tokens=meta["n_tokens"], truncated=meta["truncated"], has_tokens=want_tokens,
                 n_bytes=int(meta["n_bytes"]), poolings=meta["poolings"])


def _run(pool: EncoderPool, todo: list[dict[str, Any]], want_tokens: bool,
         progress: Callable[[Progress], None] | None, should_continue: Callable[[], bool] | None,
         prog: Progress, t0: float) -> Iterator[dict[str, Any]]:
    """The pool's results, with progress and ``should_continue`` every ``_TICK_S``.

    The ticks come even while a long part is encoding: that is what keeps a
    worker's lease alive.
    """
    results = pool.run(todo, want_tokens, tick_s=_TICK_S)
    try:
        for meta in results:
            if meta is None:
                prog.seconds = time.perf_counter() - t0
                if progress:
                    progress(prog)
                if should_continue is not None and not should_continue():
                    raise Stopped(f"stopped after {prog.done} of {prog.total} texts")
                continue
            yield meta
            if should_continue is not None and not should_continue():
                raise Stopped(f"stopped after {prog.done} of {prog.total} texts")
    except PoolError as e:
        raise RayExtractionError(f"Ray extraction failed: {e}") from e
    finally:
        results.close()  # now, not when the traceback lets go of it: cancels parts not started

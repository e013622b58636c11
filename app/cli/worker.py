"""``layerbank worker``: the extraction worker process.

``layerbank serve`` starts it and restarts it when it dies
(``app/cli/worker_process.py``). Exit status ``FATAL_EXIT`` (3) means the model
cannot be loaded: restarting would not help, so ``serve`` stops with that
message instead.

The worker exits when its parent dies (``PR_SET_PDEATHSIG`` on Linux, and a
parent-pid check every heartbeat), stopping its job at the next batch and
handing it back to the queue.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from layerbank.app.cli.common import (
    add_backend_flags,
    add_common_flags,
    add_flag,
    add_poolings_flag,
    add_setting_flags,
    settings_from,
)
from layerbank.app.cli.worker_process import FATAL_EXIT
from layerbank.settings import Settings, settings_env

# settings_env: where tests and scripts have looked for it
__all__ = ["FATAL_EXIT", "open_catalog", "register", "run", "served_models", "settings_env"]

_HARD_EXIT_S = 20.0  # a stop that takes longer than this (a stuck batch) ends the process


def register(sub: Any) -> None:
    p = sub.add_parser("worker", help="run the extraction worker (layerbank serve starts it)")
    add_common_flags(p, several_models=True)
    add_poolings_flag(p)
    add_flag(p, "--parent-pid", type=int, help="exit when this process is gone")
    # serve's gated start (app/cli/worker_process.py): import, then wait for "go" on stdin
    p.add_argument("--wait-for-go", action="store_true", help=argparse.SUPPRESS)
    add_setting_flags(p, "part_size", "model_memory_mb", "reader_memory_mb", "max_tokens_per_batch", "lease_seconds",
                      "heartbeat_seconds", "log_level")
    add_backend_flags(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    logging.getLogger("layerbank").setLevel(settings.log_level.upper())
    from layerbank.workers.encoder import Encoder, ModelLoadError, set_threads
    from layerbank.workers.quick_start import may_start_quickly
    from layerbank.workers.worker import Worker, WorkerOptions

    set_threads(settings.threads)
    options = settings.extraction_options()
    encoder, error = None, None
    # a start on the ONNX export an earlier start checked reads no weights (workers/quick_start.py):
    # then nothing is worth reading before the gate
    quick = args.wait_for_go and may_start_quickly(settings.model, engine=options["engine"],
                                                   device=options["device"], data_dir=settings.data_dir)
    try:  # gated: the model's files only, while serve checks the data directory
        if not quick:
            encoder = Encoder.load(settings.model, **options, data_dir=settings.data_dir,
                                   choose=not args.wait_for_go)
    except (ModelLoadError, ValueError) as e:
        error = e
    if args.wait_for_go:
        # a load that failed is told after the gate too, so serve has its server to stop
        if sys.stdin.readline().strip() != "go":
            return 0  # serve stopped before the data directory was ready: nothing was written
        if quick:
            try:  # verified now; any doubt and this is the usual load, choices included
                encoder = Encoder.load(settings.model, **options, data_dir=settings.data_dir)
            except (ModelLoadError, ValueError) as e:
                error = e
        elif encoder is not None:
            try:  # the measured engine and precision are read from, and stored in, the data directory
                encoder = encoder.choose(engine=options["engine"], precision=options["precision"],
                                         data_dir=settings.data_dir)
            except (ModelLoadError, ValueError) as e:
                error = e
    if encoder is None or error is not None:
        print(f"layerbank worker: error: {error}", file=sys.stderr, flush=True)
        return FATAL_EXIT
    from layerbank.workers.engines.choice import choices_line

    # what auto chose and the measured ratio behind it (also in /info)
    print(f"layerbank worker: {choices_line(encoder.info)}", file=sys.stderr, flush=True)
    store = open_catalog(settings, encoder)
    try:  # the other served models: located now (a missing one stops the server), loaded on first use
        models = served_models(settings, encoder, store)
    except ModelLoadError as e:
        print(f"layerbank worker: error: {e}", file=sys.stderr, flush=True)
        return FATAL_EXIT
    from layerbank.workers.backends import RayBackend, make_backend
    from layerbank.workers.backends.ray_backend import RayUnavailable

    try:
        backend = make_backend(settings.backend, store, encoder, part_size=settings.part_size,
                               max_tokens=settings.max_tokens_per_batch,
                               ray_address=settings.ray_address, ray_actors=settings.ray_actors)
        if isinstance(backend, RayBackend):
            backend.start()  # the actors load the model now and stay warm for every job
    except RayUnavailable as e:
        print(f"layerbank worker: error: {e}", file=sys.stderr, flush=True)
        return FATAL_EXIT
    except Exception as e:  # noqa: BLE001  (ray.init's errors: a bad address, no cluster there)
        print(f"layerbank worker: error: cannot start the Ray encoder pool: {e}", file=sys.stderr,
              flush=True)
        return FATAL_EXIT
    worker = Worker(store, encoder, WorkerOptions(
        lease_seconds=settings.lease_seconds, heartbeat_seconds=settings.heartbeat_seconds,
        part_size=settings.part_size, max_tokens=settings.max_tokens_per_batch,
        parent_pid=args.parent_pid, job_memory_mb=settings.probe_memory_mb), backend=backend, models=models)

    signals: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        # no locks here: the handler runs in the main thread between bytecodes, possibly
        # while that thread holds the very lock Event.set() would take
        signals.append(signum)

    def watch_signals() -> None:
        while not signals and not worker.stopping.is_set():
            time.sleep(0.05)
        if signals:
            worker.stop()
            time.sleep(_HARD_EXIT_S)  # a batch that does not end: leave anyway
            os._exit(1)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=watch_signals, name="worker-signals", daemon=True).start()
    logging.getLogger("layerbank.worker").info("worker %s serving %s", worker.id,
                                               encoder.info.get("name"))
    worker.run()
    backend.close()
    store.close()
    # everything durable is closed; skip the interpreter's teardown, whose final
    # garbage collection of the model took ~7 s on a busy machine (a restart waits on it)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def open_catalog(settings: Settings, encoder: Any) -> Any:
    """The store, its catalog answering and the model registered in it: a catalog that
    cannot be reached (PostgreSQL down or restarting) or whose disk is full is waited
    for here, with one log line naming why and a bounded backoff (0.5 s doubling to 5 s,
    ``layerbank.cache.outage``), not an exit that ``serve`` or a container's restart
    policy would answer with a restart into the same outage, loading the model again."""
    from layerbank.cache.outage import OutageWait, catalog_outage
    from layerbank.cache.store import FeatureStore, open_reader_budget

    wait = OutageWait(logging.getLogger("layerbank.worker"))
    while True:
        store = None
        try:
            store = FeatureStore(settings.data_dir, catalog_url=settings.catalog_url,
                                 max_open_readers=open_reader_budget(settings.reader_memory_mb))
            store.catalog.register_model(encoder.fingerprint, encoder.name,
                                         {**encoder.info, "config": encoder.config.canonical()})
        except Exception as e:
            if store is not None:
                store.close()
            if not catalog_outage(e):
                raise
            wait.wait(e)  # SIGTERM meanwhile ends the process: nothing is claimed yet
            continue
        wait.over()
        return store


def served_models(settings: Settings, encoder: Any, store: Any) -> Any:
    """The worker's ``ModelPool``: ``encoder`` (the default) and every other served model,
    each loaded with the same extraction settings and registered in the catalog on load."""
    from layerbank.workers.encoder import Encoder
    from layerbank.workers.model_pool import ModelPool, ServedModel, default_budget_bytes
    from layerbank.workers.model_source import locate_model

    def load(entry: ServedModel) -> Encoder:
        return Encoder.load(entry.spec, **settings.extraction_options(),
                            data_dir=settings.data_dir)

    def register(enc: Encoder) -> None:
        store.catalog.register_model(enc.fingerprint, enc.name, {**enc.info, "config": enc.config.canonical()})

    others = [ServedModel(locate_model(m), m) for m in settings.served_models[1:]]
    budget = (settings.model_memory_mb * 2**20 if settings.model_memory_mb
              else default_budget_bytes(encoder.device.type))
    return ModelPool(encoder, others, load=load, budget_bytes=budget, on_load=register)

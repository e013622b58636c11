"""``layerbank serve``: the HTTP API under uvicorn, and its extraction worker.

Start-up, in order: refuse a non-loopback host without an API key (unless
``--insecure``); take the data directory's lock (a second server on the same
directory is refused, naming the holder); start the worker process (supervised,
restarted if it dies), gated: it imports torch meanwhile but waits to load its model
and open the directory; check the SQLite catalog (``quick_check``, beside the
imports; damaged pages are rebuilt from the shards, a file that is no database is
refused); remove what a crash left (``FeatureStore(clean=True)``); bind the socket;
open the worker's gate; run uvicorn in this process. The bound
address is printed and written to ``<data-dir>/server.json`` (``--port 0``
picks a free port).

Every flag has an environment twin (``--max-queue-depth`` is
``LAYERBANK_MAX_QUEUE_DEPTH``).

Example::

    layerbank serve --data-dir layerbank-data --port 8000
    layerbank serve --host 0.0.0.0 --api-key "$(openssl rand -hex 16)"
"""

from __future__ import annotations

import argparse
import ctypes
import ipaddress
import json
import logging
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from layerbank.app.cli.common import (
    add_backend_flags,
    add_common_flags,
    add_poolings_flag,
    add_setting_flags,
    fail,
    settings_from,
)

__all__ = ["is_loopback", "register", "run"]

log = logging.getLogger("layerbank.serve")

# the settings serve takes as flags besides the common ones (help and twins: layerbank/settings.py)
_SETTINGS = ("host", "catalog_url", "port", "api_key", "allowed_hosts", "default_view", "default_pooling",
             "batch_window_ms", "max_texts_per_request", "max_chars_per_text", "max_body_bytes",
             "max_queue_depth", "max_dataset_texts", "max_tokens_per_batch", "part_size", "model_memory_mb",
             "reader_memory_mb", "lease_seconds", "heartbeat_seconds", "max_attempts", "log_level", "insecure")


def register(sub: Any) -> None:
    p = sub.add_parser("serve", help="HTTP API and its extraction worker")
    add_common_flags(p, several_models=True)
    add_poolings_flag(p)
    add_setting_flags(p, *_SETTINGS)
    add_backend_flags(p)
    p.set_defaults(run=run)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _bind(host: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as e:
        fail(f"cannot listen on {host}:{port}: {e.strerror or e}")
        raise
    return sock


def _few_malloc_arenas(n: int = 2) -> None:
    """Cap glibc's malloc arenas before any thread starts.

    Each request thread otherwise gets its own arena, and memory freed in one
    (HDF5 handles opened and closed, rows read) is not reused by the others:
    under a minute of misses the API's resident memory grew ~90% with the
    default and ~20% with 2 arenas (docs/reliability.md).
    """
    try:
        ctypes.CDLL("libc.so.6").mallopt(-8, n)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass  # not glibc: nothing to tune


class _CatalogCheck(threading.Thread):
    """SQLite's ``quick_check`` of the catalog, run beside the imports of the server.

    It reads every page (0.4 s at 10^6 texts on an idle 2-core VM, 3.8 s at load 28) and
    spends that time in SQLite, outside the GIL, while this process imports FastAPI,
    uvicorn and h5py (~2 s): started once the data directory's lock is held, joined
    before anything opens the catalog, so a damaged catalog is still never served from."""

    def __init__(self, path: Path) -> None:
        super().__init__(name="layerbank-catalog-check", daemon=True)
        self.path = path
        self.problem: str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            from layerbank.cache.repair import check_catalog

            self.problem = check_catalog(self.path)
        except BaseException as e:  # noqa: BLE001  (raised again in the thread that waits for it)
            self.error = e

    def result(self) -> str | None:
        self.join()
        if self.error is not None:
            raise self.error
        return self.problem


def _check_catalog(data_dir: Path, problem: str | None) -> None:
    """Rebuild a catalog with damaged pages from the shards (cache/repair.py), saying so;
    a catalog that is not a database at all is a one-line error naming `layerbank repair`
    (it may be the wrong file: nothing is replaced without being asked). ``problem``: what
    the check (``_CatalogCheck``) found, None if the catalog is sound."""
    from layerbank.cache.repair import repair_catalog

    if problem is None:
        return
    if "not a database" in problem:
        fail(f"{data_dir / 'catalog.sqlite'} is not a SQLite database ({problem}); run `layerbank repair "
             f"--data-dir {data_dir}` to rebuild it from the shards (the damaged file is kept)")
    print(f"layerbank: the catalog is damaged ({problem}); rebuilding it from the shards",
          file=sys.stderr, flush=True)
    for line in repair_catalog(data_dir).lines():
        print(f"layerbank: repair: {line}", file=sys.stderr, flush=True)


def _forget_info(info_path: Path) -> None:
    """Remove server.json if it still names this process (a replica started later owns it)."""
    try:
        if json.loads(info_path.read_text()).get("pid") == os.getpid():
            info_path.unlink(missing_ok=True)
    except (OSError, ValueError, AttributeError):
        pass


class _NoLock:
    def acquire(self) -> None:
        pass

    def release(self) -> None:
        pass


def _check_postgres(url: str) -> None:
    """Reach the PostgreSQL catalog (creating its tables) before anything starts, or
    stop with one line; its worker and probe processes find it in the environment."""
    from layerbank.cache.catalog import CATALOG_URL_ENV, Catalog, redacted

    os.environ[CATALOG_URL_ENV] = url
    try:
        Catalog("", url).close()
    except Exception as e:  # noqa: BLE001  (psycopg's errors: refused, auth, no such database)
        fail(f"cannot use the catalog at {redacted(url)}: {str(e).strip().splitlines()[0]}")


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    if not is_loopback(settings.host) and not settings.api_key and not settings.insecure:
        fail(f"refusing to listen on {settings.host} without an API key: anyone who can reach it "
             "could read and fill the store. Set --api-key (LAYERBANK_API_KEY), or pass "
             "--insecure to do it anyway")
    _few_malloc_arenas()
    from layerbank.cache.lock import DataDirBusy, DataDirLock

    data_dir = settings.data_dir.resolve()
    settings = settings.model_copy(update={"data_dir": data_dir})
    replica = settings.catalog_url is not None
    data_dir.mkdir(parents=True, exist_ok=True)
    if replica:
        _check_postgres(settings.catalog_url)  # type: ignore[arg-type]  # replica: the URL is set
    # replicas share the directory: the lock and the start-up clean-up are the SQLite server's
    # alone; beside replicas each worker removes only what no live writer owns (cache/leftovers.py)
    lock = _NoLock() if replica else DataDirLock(data_dir)
    try:
        lock.acquire()
    except DataDirBusy as e:
        fail(str(e))
    from layerbank.app.cli.worker_process import WorkerSupervisor

    fatal: list[int] = []
    serving: dict[str, Any] = {}  # the uvicorn server and the app, once made

    def on_fatal(rc: int) -> None:
        fatal.append(rc)
        if "server" in serving:
            serving["server"].should_exit = True

    def on_restart(n: int) -> None:
        state = getattr(getattr(serving.get("app"), "state", None), "layerbank", None)
        if state is not None:
            state.worker_restarts = n

    # started now, gated: it imports torch while this process imports its own modules and checks
    # the data directory, and opens the directory only once the gate is open (worker_process.py)
    supervisor = WorkerSupervisor(settings, on_fatal=on_fatal, on_restart=on_restart, gated=True).start()
    try:
        check = None if replica else _CatalogCheck(data_dir / "catalog.sqlite")
        if check is not None:
            check.start()  # while the server's modules load
        import uvicorn

        from layerbank.app.api.main import create_app
        from layerbank.app.api.slow_clients import server_config
        from layerbank.cache.store import FeatureStore

        level = settings.log_level.upper()
        logging.getLogger("layerbank").setLevel(level)
        if check is not None:
            _check_catalog(data_dir, check.result())
            FeatureStore(data_dir, clean=True).close()  # temp files and uncommitted shards of a crash
        sock = _bind(settings.host, settings.port)
        host, port = sock.getsockname()[:2]
        url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        app = create_app(settings)
        # slow clients cut after the header and body deadlines (app/api/slow_clients.py)
        server = uvicorn.Server(server_config(app, settings, log_level=level.lower(), access_log=False,
                                              timeout_graceful_shutdown=5))
        serving.update(server=server, app=app)
        supervisor.open_gate()  # the model loads after this, so a fatal exit finds the server made
        # replicas on one directory: the one started last is named (docs/operations.md)
        info_path = data_dir / "server.json"
        info_path.write_text(json.dumps({"url": url, "host": host, "port": port, "pid": os.getpid(),
                                         "hostname": socket.gethostname()}))
        print(f"layerbank: serving {url} (data {data_dir}); the worker is loading the model, "
              "/ready answers 200 once it has", file=sys.stderr, flush=True)
        try:
            server.run(sockets=[sock])
        finally:
            _forget_info(info_path)
    finally:
        supervisor.stop()
        lock.release()
    if fatal:
        print("layerbank: error: the worker could not load the model (its message is above); "
              "stopped", file=sys.stderr, flush=True)
        return fatal[0]
    return 0

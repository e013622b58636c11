"""Integration fixtures: a real ``layerbank serve`` process on a free loopback
port, with the bundled model and a temporary data directory.

Fixtures
--------
``layerbank_server`` (session)
    One server shared by every test that only needs *a* server: started once
    (the worker loads the bundled model, ~10 s), stopped at the end of the
    session. Its settings are ``SHARED_SETTINGS`` (small limits, so limit
    errors are cheap to provoke). Tests sharing it must use their own texts
    (cache state is shared) and leave it running.
``server_factory`` (function)
    ``server_factory(**settings) -> ServerProcess`` for tests that restart,
    kill or reconfigure a server; every server it made is stopped afterwards.

``ServerProcess`` helpers: ``start()``, ``stop()``, ``kill()`` (SIGKILL, a
crash), ``restart(kill=False)`` (same data directory and port),
``worker_pid()``, ``client()`` (an ``layerbank.app.client.Client``), ``get/post/...``
(httpx), ``log()`` (the server's output, shown when start-up fails).

Data helpers: ``sst_sentences(n, offset)`` takes distinct SST-2 dev phrases
(a seeded shuffle; disjoint offsets share no text); ``write_tsv(path, texts,
labels)``. Offsets used so far: test_server 0-999, test_openai_client
1000-1099, test_server_restart 1100-1519, test_precision_http 3000-3039 (a new module should start at 3100).

Example::

    def test_something(layerbank_server):
        r = layerbank_server.post("/v1/features", json={"texts": ["a text"]})
        assert r.status_code == 200
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.data_paths import DATA  # tests/data/: the subsets that ship with the repository

ROOT = Path(__file__).resolve().parents[2]

SHARED_SETTINGS: dict[str, Any] = {
    "max_texts_per_request": 64,
    "max_chars_per_text": 2000,
    "max_body_bytes": 256 * 1024,
    "max_queue_depth": 4,
    "max_tokens_per_batch": 1024,  # several batches per small dataset: several progress events
    "part_size": 64,
    "heartbeat_seconds": 1,
}


class ServerProcess:
    """A ``layerbank serve`` child process and the address it listens on."""

    def __init__(self, data_dir: Path, settings: dict[str, Any] | None = None,
                 api_key: str | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.settings = dict(settings or {})
        self.api_key = api_key
        self.port = 0  # a free port at first start; kept by restart()
        # the PostgreSQL pass's catalog as it is where the server is made (tests/conftest.py),
        # kept for every restart
        self.catalog_url = os.environ.get("LAYERBANK_CATALOG_URL")
        self.url = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-server.log"
        self._http: httpx.Client | None = None

    # -- life cycle -----------------------------------------------------------
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAYERBANK_")}
        if self.catalog_url:  # the PostgreSQL pass (tests/conftest.py)
            env["LAYERBANK_CATALOG_URL"] = self.catalog_url
        env["LAYERBANK_THREADS"] = "1"  # the test machine's cores are shared
        # engine auto exports the model to ONNX and times both engines at a fresh data dir's
        # first start (seconds each); tests/integration/test_engines.py covers it, others use torch
        env["LAYERBANK_ENGINE"] = "torch"
        for k, v in self.settings.items():
            env["LAYERBANK_" + k.upper()] = str(v)
        if self.api_key:
            env["LAYERBANK_API_KEY"] = self.api_key
        return env

    def start(self, timeout: float = 180.0) -> ServerProcess:
        info = self.data_dir / "server.json"
        info.unlink(missing_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "layerbank.app.cli.main", "serve", "--data-dir", str(self.data_dir),
             "--port", str(self.port)], cwd=ROOT, env=self.env(), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            try:
                meta = json.loads(info.read_text())
                if meta.get("pid") == self.proc.pid:
                    break
            except (OSError, ValueError):
                pass
            self._wait_or_fail(deadline, "write server.json")
        self.port, self.url = int(meta["port"]), meta["url"]
        self._http = httpx.Client(base_url=self.url, timeout=120.0, headers=self._auth())
        self.wait_ready(deadline)
        return self

    def wait_ready(self, deadline: float | None = None) -> None:
        deadline = deadline or time.monotonic() + 180.0
        while True:
            self._check_alive()
            try:
                if self.get("/ready").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            self._wait_or_fail(deadline, "answer /ready with 200")

    def _auth(self) -> dict[str, str]:
        # as the Python client: a keyless server takes form posts only with its own Origin
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {"Origin": self.url}

    def _check_alive(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"layerbank serve exited with {self.proc.returncode}:\n{self.log()}")

    def _wait_or_fail(self, deadline: float, what: str) -> None:
        if time.monotonic() > deadline:
            self.stop()
            raise TimeoutError(f"layerbank serve did not {what} in time:\n{self.log()}")
        time.sleep(0.1)

    def stop(self, timeout: float = 40.0) -> int | None:
        """SIGTERM (a clean shutdown: the worker hands its job back)."""
        if self._http is not None:
            self._http.close()
            self._http = None
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def kill(self) -> None:
        """SIGKILL the server, as a crash would; its worker follows (parent-death signal)."""
        worker = self.worker_pid(default=None)
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        if worker is not None:
            _wait_gone(worker, 30.0)

    def restart(self, kill: bool = False) -> ServerProcess:
        self.kill() if kill else self.stop()
        return self.start()

    # -- helpers ----------------------------------------------------------------
    def own_worker_pid(self, timeout: float = 180.0) -> int:
        """Wait until this server's own worker (its child) is live in /ready: beside a
        replica, /ready is 200 as soon as the other's worker is."""
        import psutil

        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            for w in self.get("/ready").json().get("workers") or []:
                try:
                    if psutil.Process(int(w["pid"])).ppid() == self.proc.pid:  # type: ignore[union-attr]
                        return int(w["pid"])
                except (psutil.Error, ValueError):
                    continue
            self._wait_or_fail(deadline, "list its own worker in /ready")

    def worker_pid(self, default: Any = ...) -> Any:
        try:
            workers = self.get("/ready").json().get("workers") or []
        except httpx.TransportError:
            workers = []
        if workers:
            # replicas on one catalog list each other's workers too: this server's is its child
            import psutil

            for w in workers:
                try:
                    if self.proc is not None and psutil.Process(int(w["pid"])).ppid() == self.proc.pid:
                        return int(w["pid"])
                except (psutil.Error, ValueError):
                    continue
            return int(workers[0]["pid"])
        if default is ...:
            raise AssertionError("no live worker")
        return default

    def client(self) -> Any:
        from layerbank.app.client import Client

        return Client(self.url, api_key=self.api_key)

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        assert self._http is not None, "server not started"
        return self._http.request(method, path, **kw)

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("POST", path, **kw)

    def delete(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("DELETE", path, **kw)

    def wait_job(self, job_id: str, timeout: float = 240,
                 until: tuple[str, ...] = ("succeeded", "failed", "cancelled")) -> dict[str, Any]:
        """Poll ``/v1/jobs/{id}`` until its state is in ``until``; the job, with
        ``seen_progress``: every progress it showed while polled. Unlike
        ``Client.wait`` a failed job is returned, for the test to assert on."""
        deadline = time.monotonic() + timeout
        seen: list[dict[str, Any]] = []
        while True:
            job = self.get(f"/v1/jobs/{job_id}").json()
            seen.append(job["progress"])
            if job["state"] in until:
                job["seen_progress"] = seen
                return job  # type: ignore[no-any-return]
            assert time.monotonic() < deadline, job
            time.sleep(0.1)

    def metric(self, name: str, labels: str = "") -> float:
        """One sample from /metrics, e.g. metric("layerbank_cache_hits_total")."""
        want = f"{name}{{{labels}}}" if labels else name
        for line in self.get("/metrics").text.splitlines():
            if line.startswith(want + " "):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(want)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise TimeoutError(f"process {pid} still alive after {timeout} s")


CHROMIUM = "/usr/bin/chromium"  # Debian's package; scripts/test.sh installs it


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's Chromium under Playwright (``playwright install`` cannot download browsers here)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (scripts/test.sh does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])  # root in CI
        yield b
        b.close()


@pytest.fixture(scope="session")
def layerbank_server(tmp_path_factory: pytest.TempPathFactory,
                     session_catalog: Callable[[], str | None]) -> Iterator[ServerProcess]:
    from tests.conftest import catalog_env

    with catalog_env(session_catalog()):  # a schema of its own, per backend pass (tests/conftest.py)
        server = ServerProcess(tmp_path_factory.mktemp("shared-server") / "data", SHARED_SETTINGS)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    made: list[ServerProcess] = []

    def make(api_key: str | None = None, **settings: Any) -> ServerProcess:
        s = ServerProcess(tmp_path / f"data{len(made)}", settings, api_key)
        made.append(s)
        return s.start()

    yield make
    for s in made:
        s.stop()


# -- data -------------------------------------------------------------------------
def _sst_dev() -> list[tuple[str, str]]:
    rows = []
    with open(DATA / "sst2" / "dev.tsv", encoding="utf-8") as fh:
        next(fh)
        for line in fh:
            text, label = line.rstrip("\n").split("\t")
            if len(text.split()) >= 4:  # whole-ish phrases, not fragments
                rows.append((text, label))
    return sorted(set(rows))


_SHUFFLED: list[tuple[str, str]] = []


def sst_sentences(n: int, offset: int) -> tuple[list[str], list[str]]:
    """``n`` SST-2 dev phrases and labels: rows ``offset:offset+n`` of one seeded
    shuffle, so tests that take disjoint ranges share no text (the cache is shared)."""
    if not _SHUFFLED:
        rows = _sst_dev()
        random.Random(0).shuffle(rows)
        _SHUFFLED.extend(rows)
    rows = _SHUFFLED[offset: offset + n]
    assert len(rows) == n, f"only {len(_SHUFFLED)} phrases"
    return [t for t, _ in rows], [lab for _, lab in rows]


def write_tsv(path: Path, texts: list[str], labels: list[str]) -> Path:
    path.write_text("sentence\tlabel\n" + "".join(f"{t}\t{lab}\n" for t, lab in zip(texts, labels)),
                    encoding="utf-8")
    return path

"""Shared fixtures: a tiny random BERT encoder and an empty feature store.

Unit tests never load real weights: ``tiny_model_dir`` builds a 2-layer,
32-wide random ``BertModel`` in-process (seeded, so every run sees the same
numbers) and saves it next to the bundled model's real tokenizer, so that
tokenization, offsets and word ids are realistic while a forward pass costs
microseconds. Integration tests (tests/integration/) use the bundled model
itself via ``layerbank.cache.fingerprint.default_model_path()``.

Fixtures
--------
``tiny_model_dir`` (session)
    Path (str) of a directory that ``transformers.AutoModel`` /
    ``AutoTokenizer`` and ``layerbank.workers.encoder.Encoder.load`` accept: 2 layers
    (so 3 hidden states h_0..h_2), hidden size 32, max 64 positions.
``tiny_encoder`` (function)
    ``Encoder.load(tiny_model_dir, device="cpu")``: a fresh encoder per test,
    so its ``calls`` counter starts at 0. Loading takes ~0.1 s.
``store`` (function)
    ``FeatureStore(tmp_path / "data")``, closed after the test.
``tiny_api`` / ``tiny_api_factory(worker=True, **settings)`` (function)
    The HTTP app in a ``TestClient`` with a ``layerbank.workers.worker.Worker`` running
    in a thread on the tiny model: ``.client``, ``.worker``, ``.settings``.
``catalog_backend`` (session, autouse, parametrised)
    Every test runs once per catalog backend named in ``LAYERBANK_TEST_CATALOGS``
    (``sqlite`` by default, for a quick local run; ``scripts/test.sh``, README's
    test command and CI, runs ``sqlite,postgres``). For
    ``postgres`` a real PostgreSQL server runs for the session
    (tests/postgres_server.py) and ``LAYERBANK_CATALOG_URL`` names a fresh schema
    per test (per module for tests that use module-scoped stores or servers), so
    every ``FeatureStore``, server, worker and probe process of the test uses it.
    Tests marked ``sqlite_only`` (the SQLite file itself: its pages, its lock,
    its WAL) are deselected for ``postgres``, not skipped.

Example::

    def test_something(tiny_encoder, store):
        summary = extract(["a text"], store, tiny_encoder, job_id="t")
        assert tiny_encoder.calls == 1
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Settings' engine "auto" exports the model to ONNX and times both engines at every fresh
# data directory's first start; the engine tests ask for it, every other test runs torch
# (in this process and the CLI processes it starts, which inherit the environment)
os.environ.setdefault("LAYERBANK_ENGINE", "torch")
os.environ.pop("LAYERBANK_CATALOG_URL", None)  # a developer's own catalog never reaches a test

# what a catalog_free test runs under: nothing listens on port 9 (discard), so the
# loopback refuses the connection at once
NO_CATALOG_URL = "postgresql://catalog-free-test@127.0.0.1:9/none?connect_timeout=1"
CATALOGS = [c.strip() for c in os.environ.get("LAYERBANK_TEST_CATALOGS", "sqlite").split(",")
            if c.strip()]
# fixtures of a wider scope that hold no catalog: a test using only these gets a schema of its own
_NO_CATALOG = {"tiny_model_dir", "family_model_dir", "catalog_backend", "postgres_server", "_module_catalog", "session_catalog",
               # wider-scoped fixtures of test modules that hold no store (a Ray cluster, a browser, a model)
               "local_ray", "cluster", "browser", "torch_encoder", "reference", "conll", "tokenizer",
               "splits", "result", "bundled", "compose", "other_dir", "other_dirs"}


# Test modules that open no catalog (the science, parsing, rendering, packaging): marked
# catalog_free here, in one list, so they run once per suite run, not once per backend.
# The marker's guard proves each claim on every run (a catalog opened fails the test).
CATALOG_FREE_MODULES = {
    "unit/test_code_map.py",
    "unit/test_compose.py",
    "unit/test_families.py",
    "unit/test_import_rules.py",
    "unit/test_no_shared_data.py",
    "unit/test_packaging.py",
    "unit/app/test_advice.py",
    "unit/app/test_heads.py",
    "unit/app/test_input_hints.py",
    "unit/app/test_inputs.py",
    "unit/app/test_mdl.py",
    "unit/app/test_plots.py",
    "unit/app/test_probe.py",
    "unit/app/test_probe_options.py",
    "unit/app/test_regimes_plot.py",
    "unit/app/test_spans.py",
    "unit/app/test_tables.py",
    "unit/app/test_token_probe.py",
    "unit/app/test_wordsets.py",
    "unit/cache/test_disk_full_type.py",
    "unit/cache/test_errors.py",
    "unit/cache/test_keys.py",
    "unit/cache/test_request_texts.py",
    "unit/cache/test_shard.py",
    "unit/cache/test_space.py",
    "unit/cache/test_space_errors.py",
    "unit/cache/test_views.py",
    "unit/cache/test_words.py",
    "unit/cache/test_words_word_ids.py",
    "unit/workers/test_batching.py",
    "unit/workers/test_determinism.py",
    "unit/workers/test_encoder.py",
    "unit/workers/test_finetune_steps.py",
    "unit/workers/test_measured.py",
    "unit/workers/test_min_padding_batches.py",
    "unit/workers/test_model_pool.py",
    "unit/workers/test_model_source.py",
    "unit/workers/test_onnx_engine.py",
    "unit/workers/test_precision_calibration.py",
    "unit/workers/test_precision_linear_cast.py",
    "unit/workers/test_recipe_directory.py",
    "unit/workers/test_regimes.py",
    "unit/workers/test_regimes_curves.py",
    "unit/workers/test_regimes_families.py",
    "unit/workers/test_regimes_options.py",
    "integration/test_regimes_sst2.py",
    "integration/test_wheel.py",
    "unit/test_suite_lists.py",
}


# Test modules about the client's side of HTTP (browsers, SDKs, the CLI's --url, a first
# hour on the default catalog): the server behind them stores through the same routes that
# test_server, test_replicas and the reliability tests exercise on both backends, so one
# pass (SQLite's) is enough; marked sqlite_only here with the reason
ONE_BACKEND_MODULES = {
    "integration/test_api_docs_browser.py": "the API docs pages in a browser",
    "integration/test_cross_site_browser.py": "cross-site requests, refused before any route",
    "integration/test_lab.py": "the lab's pages in a browser",
    "integration/test_client.py": "the Python client's side of the API",
    "integration/test_openai_client.py": "the OpenAI SDK's side of /v1/embeddings",
    "integration/test_embedding_clients.py": "LangChain's and llama-index's side",
    "integration/test_cli_url.py": "the CLI's requests through --url",
    "integration/test_cli_first_hour.py": "a first hour runs on the default catalog, SQLite",
}


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # optional: the suite runs without xdist too
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """README's test command runs two processes: a module per backend is one unit of work,
    the Ray modules one between them (tests/parallel.py says why)."""
    from tests.parallel import make_scheduler
    return make_scheduler(config, log)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sqlite_only: about the SQLite catalog file itself; "
                            "deselected on the PostgreSQL backend")
    config.addinivalue_line("markers", "postgres_only: about the PostgreSQL catalog; deselected "
                            "on the SQLite backend")
    config.addinivalue_line("markers", "catalog_free: opens no catalog (science, parsing, "
                            "rendering): runs on the first backend only, under a catalog URL "
                            "that no server answers, so a catalog opened after all fails the test")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    tests_dir = Path(__file__).parent
    for item in items:
        module = item.path.relative_to(tests_dir).as_posix()
        if module in CATALOG_FREE_MODULES:
            item.add_marker(pytest.mark.catalog_free)
        elif module in ONE_BACKEND_MODULES:
            item.add_marker(pytest.mark.sqlite_only)
        backend = getattr(item, "callspec", None) and item.callspec.params.get("catalog_backend")
        other = (backend == "postgres" and item.get_closest_marker("sqlite_only")) or \
            (backend == "sqlite" and item.get_closest_marker("postgres_only")) or \
            (backend not in (None, CATALOGS[0]) and item.get_closest_marker("catalog_free"))
        (drop if other else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """A real PostgreSQL server for the whole session (tests/postgres_server.py)."""
    import tempfile

    from tests.postgres_server import PostgresServer

    server = PostgresServer.start(Path(tempfile.mkdtemp(prefix="layerbank-pg-")))
    yield server
    server.stop()


@pytest.fixture(scope="session", params=CATALOGS, autouse=True)
def catalog_backend(request: pytest.FixtureRequest) -> str:
    """The catalog backend this pass of the suite runs on: "sqlite" or "postgres"."""
    return str(request.param)


@contextlib.contextmanager
def catalog_env(url: str | None) -> Iterator[None]:
    """``LAYERBANK_CATALOG_URL`` set to ``url`` (None: left as it is) inside the block."""
    if url is None:
        yield
        return
    old = os.environ.get("LAYERBANK_CATALOG_URL")
    os.environ["LAYERBANK_CATALOG_URL"] = url
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("LAYERBANK_CATALOG_URL", None)
        else:
            os.environ["LAYERBANK_CATALOG_URL"] = old


def _use_schema(request: pytest.FixtureRequest, backend: str, url: str | None = None) -> Iterator[None]:
    if backend != "postgres":
        yield
        return
    url = url or request.getfixturevalue("postgres_server").new_schema_url()
    with catalog_env(url):
        yield
    from layerbank.cache.postgres import close_pools

    close_pools()  # the connections of what ran under it, whatever it left open


@pytest.fixture(scope="session")
def session_catalog(request: pytest.FixtureRequest, catalog_backend: str) -> Callable[[], str | None]:
    """Makes a schema for one of the pass's session-scoped servers: each server fixture
    takes this one (so it is made again for each backend) and starts under
    ``catalog_env(session_catalog())``; the factory gives None on SQLite."""

    def new() -> str | None:
        if catalog_backend != "postgres":
            return None
        return str(request.getfixturevalue("postgres_server").new_schema_url())

    return new


@pytest.fixture(scope="module", autouse=True)
def _module_catalog(request: pytest.FixtureRequest, catalog_backend: str) -> Iterator[None]:
    """A schema for the module's wider-scoped stores and servers (set before they start)."""
    yield from _use_schema(request, catalog_backend)


def _widest_data_scope(request: pytest.FixtureRequest) -> tuple[str, list[str]]:
    """The widest scope among the test's fixtures that may hold a store or a server,
    and the session-scoped ones by name."""
    widest, sessions = "function", []
    for name in request.fixturenames:
        defs = request._fixturemanager.getfixturedefs(name, request.node)  # noqa: SLF001
        # ours (pytest's own, like tmp_path_factory, have no base id) and wider than a test
        if name in _NO_CATALOG or not defs or not defs[-1].baseid:
            continue
        scope = defs[-1].scope
        if scope == "session":
            sessions.append(name)
        elif scope in ("module", "package", "class") and widest == "function":
            widest = "module"
    return ("session" if sessions else widest), sessions


@pytest.fixture(autouse=True)
def _test_catalog(request: pytest.FixtureRequest, catalog_backend: str) -> Iterator[None]:
    """A schema of the test's own, unless it works on a module's store or server (the
    module's schema) or a session's (the pass's schema)."""
    if request.node.get_closest_marker("catalog_free"):
        # a test that claims to open no catalog runs once, so the claim is checked: a
        # catalog opened by it (or by a process it starts: they inherit the environment)
        # fails to connect, loudly, instead of quietly using a SQLite file
        with catalog_env(NO_CATALOG_URL):
            yield
        return
    scope, names = _widest_data_scope(request)
    if scope == "module":
        yield
    elif scope == "session":  # the schema of the session server it works on (its ``catalog_url``)
        urls = [getattr(request.getfixturevalue(n), "catalog_url", None) for n in names]
        yield from _use_schema(request, catalog_backend, next((u for u in urls if u), None))
    else:
        yield from _use_schema(request, catalog_backend)


# ``family_model_dir(name)``: tiny random models of every supported encoder family (tests/families.py)
from tests.families import family_model_dir  # noqa: F401

TINY_LAYERS = 2
TINY_HIDDEN = 32
TINY_MAX_POSITIONS = 64


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A saved tiny random BertModel with the bundled model's tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from layerbank.cache.fingerprint import default_model_path

    # one thread: a tiny model gains nothing from more, and on a shared, busy
    # machine extra OpenMP threads spin and wait (measured 15x slower with 2)
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(default_model_path(), use_fast=True)
    config = BertConfig(hidden_size=TINY_HIDDEN, num_hidden_layers=TINY_LAYERS,
                        num_attention_heads=2, intermediate_size=37, vocab_size=len(tok),
                        max_position_embeddings=TINY_MAX_POSITIONS)
    torch.manual_seed(0)
    model = BertModel(config).eval()
    out = tmp_path_factory.mktemp("tiny-bert")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return os.fspath(out)


@pytest.fixture
def tiny_encoder(tiny_model_dir: str):  # type: ignore[no-untyped-def]
    """A fresh ``layerbank.workers.encoder.Encoder`` on the tiny model, on the CPU."""
    from layerbank.workers.encoder import Encoder

    return Encoder.load(tiny_model_dir, device="cpu")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Any]:
    """An empty ``layerbank.cache.store.FeatureStore`` under the test's tmp directory."""
    from layerbank.cache.store import FeatureStore

    s = FeatureStore(tmp_path / "data")
    yield s
    s.close()


class TinyApi:
    """The HTTP app (a ``fastapi.testclient.TestClient``) with its worker running
    in a thread of this process on the tiny encoder: the whole request path,
    misses included, in milliseconds."""

    def __init__(self, client: Any, worker: Any, settings: Any) -> None:
        self.client = client
        self.worker = worker
        self.settings = settings
        self.data_dir = Path(settings.data_dir)


@pytest.fixture
def tiny_api_factory(tmp_path: Path, tiny_model_dir: str) -> Iterator[Callable[..., TinyApi]]:
    """``tiny_api_factory(worker=True, **settings) -> TinyApi``; everything stops afterwards.

    ``settings`` are ``layerbank.app.api.settings.Settings`` fields (``api_key=...``,
    ``max_texts_per_request=...``); ``worker=False`` gives an app with no
    worker (never ready), for error paths.
    """
    import threading
    import time

    from fastapi.testclient import TestClient

    from layerbank.app.api.main import create_app
    from layerbank.app.api.settings import Settings
    from layerbank.cache.store import FeatureStore
    from layerbank.workers.encoder import Encoder
    from layerbank.workers.worker import Worker, WorkerOptions

    stops: list[Callable[[], None]] = []

    def make(worker: bool = True, **overrides: Any) -> TinyApi:
        settings = Settings(**{"data_dir": tmp_path / f"api{len(stops)}", "batch_window_ms": 2.0,
                               "heartbeat_seconds": 0.5, **overrides})
        w = None
        if worker:
            store = FeatureStore(settings.data_dir)
            enc = Encoder.load(tiny_model_dir, device="cpu", poolings=settings.poolings,
                               storage_dtype=settings.storage_dtype)
            store.catalog.register_model(enc.fingerprint, enc.name,
                                         {**enc.info, "config": enc.config.canonical()})
            w = Worker(store, enc, WorkerOptions(heartbeat_seconds=0.5, poll_interval_s=0.002,
                                                 part_size=settings.part_size,
                                                 max_tokens=settings.max_tokens_per_batch))
            thread = threading.Thread(target=w.run, daemon=True)
            thread.start()

            def stop_worker(w: Any = w, thread: Any = thread, store: Any = store) -> None:
                w.stop()
                thread.join(10)
                store.close()
            stops.append(stop_worker)
        # a keyless app answers only to its own names and Origin (app/api/origin.py)
        client = TestClient(create_app(settings), base_url="http://localhost",
                            headers={"Origin": "http://localhost"})
        client.__enter__()
        stops.append(lambda: client.__exit__(None, None, None))
        if worker:
            deadline = time.monotonic() + 10
            while client.get("/ready").status_code != 200:
                assert time.monotonic() < deadline, client.get("/ready").text
                time.sleep(0.01)
        return TinyApi(client, w, settings)

    yield make
    for stop in reversed(stops):
        stop()


@pytest.fixture
def tiny_api(tiny_api_factory: Callable[..., TinyApi]) -> TinyApi:
    """``tiny_api_factory()`` with default settings: ready, with a worker."""
    return tiny_api_factory()

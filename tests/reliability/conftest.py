"""Reliability fixtures: real ``layerbank serve`` processes on the tiny random
encoder (the numbers do not matter here, the faults do), and real text.

Fixtures
--------
``rel_server`` (session)
    One server shared by the hostile-input, corruption and load tests:
    ``REL_SETTINGS`` (small limits, so limits are cheap to reach). Tests use
    their own texts (``phrases(n, offset)``) and leave it running.
``tiny_server_factory`` (function)
    ``tiny_server_factory(**settings) -> ServerProcess`` on the tiny model, for
    tests that kill, restart or reconfigure a server; stopped afterwards.

Helpers: ``phrases(n, offset)`` takes distinct SST-2 *training* phrases (a
seeded shuffle; the integration tests use the dev split), ``reference(texts,
tiny_model_dir, tmp, ...)`` extracts texts in-process into a clean store, the
numbers a crash-free run gives. Offsets used: hostile 0-999, corruption
1000-1999, server crash 2000-6599, worker crash 6600-9699, disk full
9700-11999, of the 13,206 phrases in tests/data/sst2/train.tsv (the load test
draws through bench/load.py, its own shuffle: 2000-4999).

Every server here listens on 127.0.0.1 and runs its worker with one thread.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import DATA, ServerProcess

REL_SETTINGS: dict[str, Any] = {
    "max_texts_per_request": 64,
    "max_chars_per_text": 2000,
    "max_body_bytes": 16 * 1024 * 1024,
    "max_queue_depth": 4,
    "max_dataset_texts": 5000,
    "part_size": 64,
    "max_tokens_per_batch": 1024,
    "heartbeat_seconds": 1,
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "reliability: fault injection, load and fuzzing (tests/reliability)")


_PHRASES: list[str] = []


def phrases(n: int, offset: int) -> list[str]:
    """``n`` distinct SST-2 training phrases of 3+ words: rows ``offset:offset+n`` of a seeded shuffle."""
    if not _PHRASES:
        seen: set[str] = set()
        with open(DATA / "sst2" / "train.tsv", encoding="utf-8") as fh:
            next(fh)
            for line in fh:
                text = line.rstrip("\n").split("\t")[0].strip()
                if len(text.split()) >= 3:
                    seen.add(text)
        rows = sorted(seen)
        random.Random(7).shuffle(rows)
        _PHRASES.extend(rows)
    out = _PHRASES[offset: offset + n]
    assert len(out) == n, f"only {len(_PHRASES)} phrases"
    return out


def reference(texts: list[str], model_dir: str, data_dir: Path, *, part_size: int,
              max_tokens: int) -> Any:
    """Extract ``texts`` in-process into a fresh store: what a run without faults stores."""
    from layerbank.cache.store import FeatureStore
    from layerbank.workers.encoder import Encoder
    from layerbank.workers.extract import extract

    store = FeatureStore(data_dir, catalog_url="")  # a catalog of its own, whatever the test runs on
    enc = Encoder.load(model_dir, device="cpu")
    summary = extract(texts, store, enc, job_id="reference", part_size=part_size,
                      max_tokens=max_tokens)
    return store, enc, summary


@pytest.fixture(scope="session")
def rel_server(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: str,
               session_catalog: Callable[[], str | None]) -> Iterator[ServerProcess]:
    from tests.conftest import catalog_env

    with catalog_env(session_catalog()):  # a schema of its own, per backend pass (tests/conftest.py)
        server = ServerProcess(tmp_path_factory.mktemp("rel-server") / "data",
                               {**REL_SETTINGS, "model": tiny_model_dir})
    server.start()
    yield server
    server.stop()


@pytest.fixture
def tiny_server_factory(tmp_path: Path, tiny_model_dir: str) -> Iterator[Callable[..., ServerProcess]]:
    made: list[ServerProcess] = []

    def make(api_key: str | None = None, start: bool = True, **settings: Any) -> ServerProcess:
        s = ServerProcess(tmp_path / f"data{len(made)}", {"model": tiny_model_dir, **settings}, api_key)
        made.append(s)
        return s.start() if start else s

    yield make
    for s in made:
        s.stop()

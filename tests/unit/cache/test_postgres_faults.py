"""The PostgreSQL catalog's faults over HTTP, on a real server of the test's own (issue 25,
rows 4 and 5): stopped while a miss waits for its encode job -> 503 with
``Retry-After`` (it was a 500 ``extraction failed: CatalogUnavailable``); its disk
full (a small tmpfs) -> 507 on the routes that write (it was a 500: psycopg's
``DiskFull`` was not recognised), and everything works again once space is freed.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.postgres_server import PostgresServer

# run in the suite's PostgreSQL pass (LAYERBANK_TEST_CATALOGS), deselected in the SQLite one
pytestmark = pytest.mark.postgres_only


@pytest.fixture
def own_server():  # type: ignore[no-untyped-def]
    """A server of the test's own (it is stopped); asked for before tiny_api_factory, so the
    app and its worker stop before it does."""
    # outside tmp_path, which the postgres user cannot enter
    server = PostgresServer.start(Path(tempfile.mkdtemp(prefix="layerbank-pg-")))
    yield server
    server.stop()


def test_a_miss_waiting_while_postgresql_stops_is_503_with_retry_after(own_server, tiny_api_factory,  # type: ignore[no-untyped-def]
                                                                       monkeypatch) -> None:
    server = own_server
    monkeypatch.setenv("LAYERBANK_CATALOG_URL", server.new_schema_url())
    api = tiny_api_factory()
    c = api.client
    assert c.post("/v1/features", json={"texts": ["a first text"]}).status_code == 200
    api.worker.stop()  # no worker: the next miss waits for its encode job ...
    time.sleep(0.3)
    stopper = threading.Timer(1.0, server.stop_keeping_data)  # ... while the catalog goes away
    stopper.start()
    t0 = time.monotonic()
    r = c.post("/v1/features", json={"texts": ["a text never seen"]})
    stopper.join()
    assert r.status_code == 503, r.text
    assert r.headers["Retry-After"] == "2" and r.json()["type"] == "not_ready"
    assert "unavailable" in r.json()["error"] and "extraction" not in r.json()["error"]
    assert time.monotonic() - t0 < 30  # bounded: the pool's timeout, not the 600 s job wait
    for method, path, body in (("get", "/v1/datasets", None),
                               ("post", "/v1/datasets", {"name": "d", "texts": ["x"]})):
        t0 = time.monotonic()
        r = c.request(method.upper(), path, json=body)
        assert r.status_code == 503 and r.headers.get("Retry-After") == "2", (path, r.text)
        assert time.monotonic() - t0 < 15, path  # the pool's 5 s, never a hang
    server.restart()
    deadline = time.monotonic() + 30  # as a client honouring Retry-After would
    while (r := c.get("/v1/datasets")).status_code == 503:
        assert time.monotonic() < deadline, r.text
        time.sleep(2)
    assert r.status_code == 200, r.text


@pytest.fixture
def small_disk():  # type: ignore[no-untyped-def]
    """A server on a 192 MB tmpfs (its files take ~60 MB of it); stopped and unmounted afterwards."""
    mnt = Path(tempfile.mkdtemp(prefix="layerbank-pgfull-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=192m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); "
                    "tests/unit/app/test_catalog_faults.py covers DiskFull at the driver boundary")
    server = PostgresServer.start(mnt / "pg")
    try:
        yield mnt, server
    finally:
        server.stop()
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
        os.rmdir(mnt)


def _fill(path: Path) -> None:
    try:
        f = open(path, "wb", buffering=0)  # noqa: SIM115  (unbuffered: close has nothing left to write)
    except OSError:  # full already
        return
    with f:  # until the disk says no
        block = b"\0" * (1 << 20)
        try:
            while True:
                f.write(block)
        except OSError:
            pass
        try:  # the last partial megabyte too
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def test_postgresql_disk_full_is_507_on_the_routes_that_write(small_disk, tiny_api_factory,  # type: ignore[no-untyped-def]
                                                              monkeypatch) -> None:
    small_disk, server = small_disk
    # keep PostgreSQL from filling the small disk with recycled WAL segments on its own
    server.psql("ALTER SYSTEM SET min_wal_size = '32MB'", database="postgres")
    server.psql("ALTER SYSTEM SET max_wal_size = '64MB'", database="postgres")
    server.psql("SELECT pg_reload_conf()", database="postgres")
    monkeypatch.setenv("LAYERBANK_CATALOG_URL", server.new_schema_url())
    api = tiny_api_factory()
    c = api.client
    assert c.post("/v1/features", json={"texts": ["a first text"]}).status_code == 200
    filler = small_disk / "filler"
    _fill(filler)
    many = [f"text number {i} " + "padding " * 40 for i in range(2000)]
    r = c.post("/v1/datasets", json={"name": "big", "texts": many})
    assert r.status_code == 507, r.text
    assert r.json()["type"] == "insufficient_storage" and "full" in r.json()["error"]
    t0 = time.monotonic()
    r = c.post("/v1/features", json={"texts": many[:64]})
    assert r.status_code == 507, r.text
    assert time.monotonic() - t0 < 30
    assert c.get("/v1/datasets").status_code == 200  # reads still answer
    filler.unlink()
    r = c.post("/v1/features", json={"texts": many[:64]})
    assert r.status_code == 200, r.text

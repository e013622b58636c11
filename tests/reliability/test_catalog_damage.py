"""A damaged catalog under a real ``layerbank serve``: found, said, and rebuilt from the shards.

- damaged key pages while the server runs: ``/ready`` turns 503 with the reason
  (the periodic ``quick_check``), no request answers 500;
- the next ``serve`` start rebuilds the key index from the shards (a log line
  says so), keeps the datasets, and every stored row answers with its original
  numbers, from the store (``cached: true``);
- a destroyed header: ``serve`` exits with one line naming ``layerbank repair``,
  no traceback; ``layerbank repair`` rebuilds it and says what was lost.
"""

from __future__ import annotations

import base64
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.integration.conftest import ROOT, ServerProcess

from .conftest import phrases

# the SQLite file itself: its pages and its header (a PostgreSQL catalog: tests/unit/cache/test_postgres.py)
pytestmark = [pytest.mark.reliability, pytest.mark.timeout(400), pytest.mark.sqlite_only]


def _rows(server: ServerProcess, texts: list[str]) -> tuple[np.ndarray, list[bool]]:
    r = server.post("/v1/features", json={"texts": texts, "view": "all_layers", "pooling": "mean",
                                          "format": "base64", "dtype": "float16"})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    return (np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f2") for d in data]),
            [d["cached"] for d in data])


def _smash_table(path: Path, table: str) -> None:
    db = sqlite3.connect(path, timeout=30)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    size = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    with open(path, "r+b") as fh:
        fh.seek((root - 1) * size + 8)
        fh.write(np.random.default_rng(1).integers(0, 256, size - 8, dtype=np.uint8).tobytes())


def _cli(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "layerbank.app.cli.main", *args, "--data-dir", str(data_dir)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_damaged_pages_then_a_destroyed_header(tiny_server_factory: Callable[..., ServerProcess]) -> None:
    server = tiny_server_factory(catalog_check_seconds=0.5)
    texts = phrases(40, 1600)
    want, cached = _rows(server, texts)
    assert cached == [False] * len(texts)
    assert len(_workers_for(server.data_dir)) == 1  # what the check after the refused start counts
    ds = server.post("/v1/datasets", json={"name": "kept", "texts": texts[:10]}).json()
    assert server.wait_job(ds["job_id"])["state"] == "succeeded"
    catalog = server.data_dir / "catalog.sqlite"

    # 1. damaged key pages under the running server
    _smash_table(catalog, "entries")
    deadline = time.monotonic() + 30
    while (r := server.get("/ready")).status_code == 200:
        assert time.monotonic() < deadline, "the periodic check never saw the damage"
        time.sleep(0.2)
    assert r.status_code == 503 and "the catalog is damaged" in r.json()["error"], r.text
    assert "layerbank repair" in r.json()["error"] and r.json()["checks"]["catalog"] is False
    r = server.post("/v1/features", json={"texts": texts[:5]})
    assert r.status_code in (200, 503), r.text  # from pages still in memory, or the damage said; never 500

    # 2. the next start rebuilds the key index from the shards
    server.stop()
    server.start()
    log = server.log()
    assert "the catalog is damaged" in log and "rebuilding it from the shards" in log, log[-2000:]
    assert "re-indexed" in log
    got, cached = _rows(server, texts)
    assert cached == [True] * len(texts)  # served from the store, not encoded again
    np.testing.assert_array_equal(got, want)
    assert server.get(f"/v1/datasets/{ds['id']}").status_code == 200  # datasets kept
    assert server.get(f"/v1/datasets/{ds['id']}/features").status_code == 200

    # 3. a destroyed header: one line naming `layerbank repair`, no traceback
    server.stop()
    with open(catalog, "r+b") as fh:
        fh.write(b"\x00" * 100)
    out = subprocess.run([sys.executable, "-m", "layerbank.app.cli.main", "serve", "--data-dir",
                          str(server.data_dir), "--port", "0"], cwd=ROOT, env=server.env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "is not a SQLite database" in lines[0] and "`layerbank repair --data-dir" in lines[0]
    assert _workers_for(server.data_dir) == [], "the worker started beside the check is ended with it"

    rep = _cli("repair", data_dir=server.data_dir)
    assert rep.returncode == 0, rep.stderr
    assert "re-indexed" in rep.stderr and "LOST every table but the key index" in rep.stderr, rep.stderr
    assert list(server.data_dir.glob("catalog.sqlite.damaged-*")), "the damaged file is kept"
    again = _cli("repair", data_dir=server.data_dir)
    assert again.returncode == 0 and "nothing to repair" in again.stderr

    server.start()
    got, cached = _rows(server, texts)
    assert cached == [True] * len(texts)
    np.testing.assert_array_equal(got, want)


def _workers_for(data_dir: Path) -> list[int]:
    """Live `layerbank worker` processes whose environment names ``data_dir``."""
    want = f"LAYERBANK_DATA_DIR={data_dir.resolve()}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            if b"worker" in cmd and want in (proc / "environ").read_bytes().split(b"\0"):
                pids.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return pids

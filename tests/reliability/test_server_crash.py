"""``layerbank serve`` SIGKILLed during dataset uploads and a running job.

One server, killed once while (a) a 3,000-text extraction job runs, (b) a
multipart upload is half-sent and (c) small JSON uploads arrive back to back.
While it is down, a crash's leftovers are planted (a temporary shard file, a
shard renamed but never committed) and one committed shard is damaged at rest.
After the restart:

- every dataset the server acknowledged (202) is there, whole, with its job;
  no dataset is half-registered, the half-sent upload left nothing;
- the jobs resume and succeed; the big dataset's features equal a clean run;
- the leftovers are gone (and the log says so), a head job's temporary
  directory included;
- the damaged shard is caught by its checksum on first read, quarantined,
  its texts recomputed: the client gets the same numbers as before the crash;
- a second server on the same data directory is refused with a clear message,
  and the first keeps serving.
"""

from __future__ import annotations

import base64
import io
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import h5py
import httpx
import numpy as np
import pytest

from layerbank.cache.catalog import Catalog, catalog_url
from layerbank.cache.keys import text_key
from layerbank.cache.views import parse_view
from tests.integration.conftest import ROOT, ServerProcess

from .conftest import phrases, reference

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

PART, MAX_TOKENS = 32, 512
SETTINGS = {"part_size": PART, "max_tokens_per_batch": MAX_TOKENS, "heartbeat_seconds": 1,
            "max_queue_depth": 1000}


def _slow_upload(url: str, sent: threading.Event) -> None:
    """Send headers and half of a multipart body, then wait to be cut off."""
    texts = phrases(400, 2000)
    boundary = "relboundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"name\"\r\n\r\nhalf-sent\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"half.txt\"\r\n"
            "Content-Type: text/plain\r\n\r\n" + "\n".join(texts) + f"\r\n--{boundary}--\r\n").encode()
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall((f"POST /v1/datasets HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n"
                      f"Content-Type: multipart/form-data; boundary={boundary}\r\n\r\n").encode())
        sock.sendall(body[: len(body) // 2])
        sent.set()
        try:
            sock.recv(1)  # returns (or raises) when the server dies
        except OSError:
            pass


def _burst(url: str, acked: list[dict[str, Any]], refused: list[str], stop: threading.Event) -> None:
    """Small JSON uploads back to back; remember every one the server acknowledged."""
    with httpx.Client(base_url=url, timeout=30) as c:
        for i in range(1000):
            if stop.is_set():
                return
            texts = phrases(20, 2500 + 20 * i)
            try:
                r = c.post("/v1/datasets", json={"name": f"burst-{i}", "texts": texts})
            except httpx.TransportError:
                return
            if r.status_code != 202:
                refused.append(f"{r.status_code} {r.text}")
                return
            acked.append({**r.json(), "texts": texts})


def _flip_keys_chunk(path: Path) -> None:
    with h5py.File(path, "r") as f:
        info = f["keys"].id.get_chunk_info(0)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0xFF]))


def _features_b64(server: ServerProcess, texts: list[str]) -> tuple[np.ndarray, list[bool]]:
    r = server.post("/v1/features", json={"texts": texts, "view": "all_layers", "pooling": "mean",
                                          "format": "base64", "dtype": "float16"})
    assert r.status_code == 200, r.text
    body = r.json()
    rows = [np.frombuffer(base64.b64decode(d["embedding"]), "<f2") for d in body["data"]]
    return np.stack(rows), [d["cached"] for d in body["data"]]


def test_server_killed_mid_upload_and_mid_job_loses_nothing(
        tmp_path: Path, tiny_model_dir: str, tiny_server_factory) -> None:  # type: ignore[no-untyped-def]
    big = phrases(3000, 3500)
    ref: dict[str, Any] = {}

    def clean_run() -> None:
        ref["store"] = reference(big, tiny_model_dir, tmp_path / "ref", part_size=PART,
                                 max_tokens=MAX_TOKENS)[0]

    ref_thread = threading.Thread(target=clean_run)  # while the server starts
    ref_thread.start()
    server: ServerProcess = tiny_server_factory(**SETTINGS)
    data = server.data_dir
    info = server.get("/info").json()["model"]
    fp, cfg = info["fingerprint"], info["extraction_config"]

    # texts whose shard will be damaged while the server is down
    group = phrases(12, 6500)
    before, _ = _features_b64(server, group)

    d1 = server.post("/v1/datasets", json={"name": "big", "texts": big})
    assert d1.status_code == 202, d1.text
    d1 = d1.json()
    cat = Catalog(data / "catalog.sqlite")

    def committed() -> int:
        return sum(1 for n in cat.shard_names() if n.startswith(d1["job_id"]))

    deadline = time.monotonic() + 120
    while committed() < 3:
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.01)

    acked: list[dict[str, Any]] = []
    refused: list[str] = []
    sent, stop = threading.Event(), threading.Event()
    uploaders = [threading.Thread(target=_slow_upload, args=(server.url, sent)),
                 threading.Thread(target=_burst, args=(server.url, acked, refused, stop))]
    for t in uploaders:
        t.start()
    assert sent.wait(30)
    while len(acked) < 3:
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.01)
    assert server.get(f"/v1/jobs/{d1['job_id']}").json()["state"] == "running"
    server.kill()  # SIGKILL: no clean-up of any kind in the API process
    stop.set()
    for t in uploaders:
        t.join(30)
    assert refused == []
    done_before = committed()

    # while it is down: what a crash leaves, and a shard damaged at rest
    shards = data / "shards"
    (shards / "crashed-00000.h5.tmp").write_bytes(b"\x89HDF half-written")
    shutil.copy(shards / min(cat.shard_names()), shards / "renamed-not-committed-00000.h5")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a head job's unpublished files, its process gone
    half_head = data / "heads" / f".hd_0123456789ab.tmp-{dead.pid}-abcdef"
    half_head.mkdir(parents=True)
    (half_head / "arrays.npz").write_bytes(b"PK half")
    group_keys = [text_key(fp, cfg, t) for t in group]
    damaged = {e.shard for e in cat.lookup(group_keys).values()}
    assert len(damaged) == 1
    _flip_keys_chunk(shards / damaged.pop())

    server.start()  # same data directory, same port
    if catalog_url() is None:  # the lone SQLite server cleans its directory before anything runs
        m = re.search(r"removed (\d+) temp files and (\d+) uncommitted shards", server.log())
        assert m and int(m.group(1)) >= 1 and int(m.group(2)) >= 1, server.log()
    else:  # beside replicas, each worker removes at start what no live writer owns
        # (the head's temp directory is the probe service's, removed by the API at start)
        while not (m := re.search(r"removed crash leftovers: (\d+) shard files", server.log())):
            assert time.monotonic() < deadline + 120, server.log()
            time.sleep(0.05)
        assert int(m.group(1)) >= 2, server.log()
    # (the resumed job may already be writing its next part: only the planted files are checked)
    assert not (shards / "crashed-00000.h5.tmp").exists()
    assert not (shards / "renamed-not-committed-00000.h5").exists()
    assert not half_head.exists()

    # nothing acknowledged was lost, nothing is half-registered
    lb = server.client()
    listed = {d["id"]: d for d in lb.datasets()}
    assert {a["id"] for a in acked} | {d1["id"]} <= set(listed)
    assert "half-sent" not in {d["name"] for d in listed.values()}
    db = cat.conn()
    for ds_id, n_items, job_id in db.execute("SELECT id, n_items, job_id FROM datasets"):
        assert db.execute("SELECT COUNT(*) FROM dataset_items WHERE dataset_id=?",
                          (ds_id,)).fetchone()[0] == n_items > 0
        assert db.execute("SELECT COUNT(*) FROM jobs WHERE id=?", (job_id,)).fetchone()[0] == 1
    assert db.execute("SELECT COUNT(*) FROM dataset_items WHERE dataset_id NOT IN "
                      "(SELECT id FROM datasets)").fetchone()[0] == 0

    # the jobs resume and succeed; the big one kept its committed parts
    job = lb.wait(d1, timeout=180)
    assert job["state"] == "succeeded"
    assert job["result"]["cache_hits"] >= done_before * PART
    assert job["result"]["cache_hits"] + job["result"]["texts_encoded"] == len(big)
    for a in acked:
        assert lb.wait(a, timeout=120)["state"] == "succeeded"

    # the big dataset's features equal a clean run's
    ref_thread.join(120)
    r = server.get(f"/v1/datasets/{d1['id']}/features")
    assert r.status_code == 200, r.text
    got = np.load(io.BytesIO(r.content))
    want = ref["store"].read_view([text_key(fp, cfg, t) for t in big], parse_view("layer:-2"),
                                  "mean", info["n_hidden_states"])
    assert want.found.all()
    np.testing.assert_array_equal(got, want.data)

    # the damaged shard: caught on read, quarantined, recomputed, same numbers
    after, cached = _features_b64(server, group)
    assert cached == [False] * len(group)
    np.testing.assert_array_equal(after, before)
    assert server.metric("layerbank_quarantined_shards_total") == 1
    assert "quarantined shard" in server.log()
    assert len(list((data / "quarantine").glob("*.h5"))) == 1

    # a second server on the same directory is refused, naming the holder (on a PostgreSQL
    # catalog it is a replica, welcome: tests/integration/test_replicas.py)
    if catalog_url() is None:
        second = subprocess.run(
            [sys.executable, "-m", "layerbank.app.cli.main", "serve", "--data-dir", str(data), "--port", "0"],
            cwd=ROOT, env=server.env(), capture_output=True, text=True, timeout=120, check=False)
        assert second.returncode == 2, second.stderr
        assert f"is in use by pid {server.proc.pid}" in second.stderr  # type: ignore[union-attr]
        assert "Traceback" not in second.stderr
    assert server.get("/ready").status_code == 200
    again, cached = _features_b64(server, group)
    assert cached == [True] * len(group)
    np.testing.assert_array_equal(again, before)
    cat.close()
    ref["store"].close()

"""A committed shard damaged on disk while the server runs.

Bytes are flipped inside a checksummed chunk (or the file is cut short) under
a running server. The next read that touches the damage fails its fletcher32
checksum; the shard is moved to ``quarantine/``, its keys are dropped from the
catalog, the request recomputes them and answers the same numbers as before,
and the server counts it (``layerbank_quarantined_shards_total``) and logs it.
A dataset whose rows were in the damaged shard never streams wrong numbers:
its features are refused with a message saying why.
"""

from __future__ import annotations

import base64
import io
import time
from pathlib import Path

import h5py
import httpx
import numpy as np
import pytest

from layerbank.cache.catalog import Catalog
from layerbank.cache.keys import text_key
from tests.integration.conftest import ServerProcess

from .conftest import phrases

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(180)]


def _all_layers(server: ServerProcess, texts: list[str], pooling: str) -> tuple[np.ndarray, list[bool]]:
    """Every stored hidden state of each text, as stored (float16), and whether it was cached."""
    r = server.post("/v1/features", json={"texts": texts, "view": "all_layers", "pooling": pooling,
                                          "format": "base64", "dtype": "float16"})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    return (np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f2") for d in data]),
            [d["cached"] for d in data])


def _shard_of(server: ServerProcess, texts: list[str]) -> Path:
    m = server.get("/info").json()["model"]
    cat = Catalog(server.data_dir / "catalog.sqlite")
    shards = {e.shard for e in cat.lookup([text_key(m["fingerprint"], m["extraction_config"], t)
                                           for t in texts]).values()}
    cat.close()
    assert len(shards) == 1, shards
    return server.data_dir / "shards" / shards.pop()


def _flip(path: Path, dataset: str) -> None:
    """XOR one byte in the middle of the dataset's first chunk (not its checksum)."""
    with h5py.File(path, "r") as f:
        info = f[dataset].id.get_chunk_info(0)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0x5A]))


@pytest.mark.parametrize("damage", ["flip pooled/cls", "flip pooled/max", "truncate"])
def test_damaged_shard_is_quarantined_and_recomputed(rel_server: ServerProcess, damage: str) -> None:
    offset = 1000 + 100 * ["flip pooled/cls", "flip pooled/max", "truncate"].index(damage)
    texts = phrases(20, offset)
    pooling = "max" if "max" in damage else "cls"
    # mean is read (and kept in the server's memory) when the texts are computed; the
    # damaged pooling has not been read yet, so the next read goes to the disk
    _all_layers(rel_server, texts, "mean")
    shard = _shard_of(rel_server, texts)
    with h5py.File(shard, "r") as f:
        stored = f[f"pooled/{pooling}"][:]
        order = [k.decode() for k in f["keys"][:]]
    m = rel_server.get("/info").json()["model"]
    want = np.stack([stored[order.index(text_key(m["fingerprint"], m["extraction_config"], t))]
                     .reshape(-1) for t in texts])
    quarantined = rel_server.metric("layerbank_quarantined_shards_total")

    if damage == "truncate":
        with open(shard, "r+b") as fh:
            fh.truncate(4096)  # the superblock stays, the data goes
    else:
        _flip(shard, f"pooled/{pooling}")

    got, cached = _all_layers(rel_server, texts, pooling)
    assert cached == [False] * len(texts)  # not served from the damaged file: recomputed
    np.testing.assert_array_equal(got, want)
    assert rel_server.metric("layerbank_quarantined_shards_total") == quarantined + 1
    assert (rel_server.data_dir / "quarantine" / shard.name).exists()
    assert not shard.exists()
    deadline = time.monotonic() + 10
    while f"quarantined shard {shard.name}" not in rel_server.log():
        assert time.monotonic() < deadline, rel_server.log()
        time.sleep(0.1)
    # from now on the recomputed rows are stored and served as before
    again, cached = _all_layers(rel_server, texts, pooling)
    assert cached == [True] * len(texts)
    np.testing.assert_array_equal(again, want)


def test_dataset_in_a_damaged_shard_never_streams_wrong_numbers(rel_server: ServerProcess) -> None:
    texts = phrases(30, 1500)
    lb = rel_server.client()
    ds = rel_server.post("/v1/datasets", json={"name": "to-damage", "texts": texts}).json()
    assert lb.wait(ds, timeout=120)["state"] == "succeeded"
    r = rel_server.get(f"/v1/datasets/{ds['id']}/features", params={"view": "layer:-1", "pooling": "cls"})
    assert r.status_code == 200 and np.load(io.BytesIO(r.content)).shape == (30, 32)
    _flip(_shard_of(rel_server, texts), "pooled/cls")

    # the damage is found while streaming: the response is cut short, never wrong
    try:
        r = rel_server.get(f"/v1/datasets/{ds['id']}/features", params={"view": "layer:-1",
                                                                         "pooling": "cls"})
    except httpx.RemoteProtocolError as e:  # an incomplete body: the client knows it is not the matrix
        assert "without sending complete message body (received 128 bytes" in str(e), repr(e)  # header only
    else:
        assert r.status_code == 409, r.status_code  # never a 200 with other numbers
        assert "no longer stored" in r.json()["error"]
    # and once quarantined, the dataset says what happened and how to recover
    r = rel_server.get(f"/v1/datasets/{ds['id']}/features", params={"view": "layer:-1", "pooling": "cls"})
    assert r.status_code == 409
    assert "no longer stored (a damaged shard was quarantined)" in r.json()["error"]
    assert rel_server.get("/health").status_code == 200

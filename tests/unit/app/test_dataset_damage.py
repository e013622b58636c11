"""A dataset whose rows sit in a damaged shard: never a 200 with wrong rows, and a
re-upload re-encodes exactly what was quarantined.

The dataset spans two shards (its first four texts were stored by an earlier
dataset), so "nothing found" and "cut off half-way" are different answers.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from layerbank.cache.keys import text_key

from ..cache.test_shard_damage import flip_header
from .test_api_datasets import _wait

FIRST = [f"an earlier dataset stored this text, number {i}" for i in range(4)]
SECOND = [f"only the second dataset has text number {i}" for i in range(4)]


def _two_shard_dataset(c) -> tuple[dict, dict, np.ndarray]:  # type: ignore[no-untyped-def]
    """The dataset FIRST + SECOND (rows 0-3 in one shard, 4-7 in another), the shard of
    rows 4-7, and the matrix downloaded while all was well."""
    early = c.post("/v1/datasets", json={"name": "early", "texts": FIRST}).json()
    assert _wait(c, early["job_id"])["state"] == "succeeded"
    ds = c.post("/v1/datasets", json={"name": "both", "texts": FIRST + SECOND}).json()
    job = _wait(c, ds["job_id"])
    assert job["state"] == "succeeded" and job["result"]["texts_encoded"] == 4
    r = c.get(f"/v1/datasets/{ds['id']}/features", params={"view": "layer:-1", "pooling": "mean"})
    assert r.status_code == 200
    before = np.load(io.BytesIO(r.content))
    return ds, c.get("/info").json()["model"], before


def _damage(c, shard: Path) -> None:  # type: ignore[no-untyped-def]
    """Flip the header of the shard's ``pooled/max`` and drop the server's open handle on it
    (an open handle has the header in memory already; a restart would open it afresh)."""
    flip_header(shard, "pooled/max")
    c.app.state.layerbank.store._forget_reader(shard.name)


def _shard_of(data_dir: Path, m: dict, texts: list[str]) -> Path:  # type: ignore[type-arg]
    from layerbank.cache.catalog import Catalog

    cat = Catalog(data_dir / "catalog.sqlite")
    shards = {e.shard for e in cat.lookup([text_key(m["fingerprint"], m["extraction_config"], t)
                                           for t in texts]).values()}
    cat.close()
    assert len(shards) == 1, shards
    return data_dir / "shards" / shards.pop()


def test_damage_in_the_second_shard_is_a_409_then_a_reupload_recomputes_it(tiny_api) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api.client
    ds, m, before = _two_shard_dataset(c)
    damaged = _shard_of(tiny_api.data_dir, m, SECOND)
    assert damaged != _shard_of(tiny_api.data_dir, m, FIRST)
    _damage(c, damaged)

    r = c.get(f"/v1/datasets/{ds['id']}/features", params={"view": "layer:-1", "pooling": "max"})
    assert r.status_code == 409, r.status_code  # checked before the first byte: not 200 with zeros
    assert r.json() == {"error": "4 of the dataset's texts are no longer stored (a damaged shard was "
                                 "quarantined); upload the dataset again to recompute them",
                        "type": "conflict"}
    assert (tiny_api.data_dir / "quarantine" / damaged.name).exists()

    again = c.post("/v1/datasets", json={"name": "both", "texts": FIRST + SECOND}).json()
    job = _wait(c, again["job_id"])
    assert job["state"] == "succeeded" and job["result"]["texts_encoded"] == 4  # just the lost ones
    r = c.get(f"/v1/datasets/{again['id']}/features", params={"view": "layer:-1", "pooling": "mean"})
    assert r.status_code == 200
    np.testing.assert_array_equal(np.load(io.BytesIO(r.content)), before)  # the same numbers


def test_damage_found_past_the_checked_part_cuts_the_download_short(tiny_api, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from layerbank.app.api.routes import datasets as route

    c = tiny_api.client
    ds, m, before = _two_shard_dataset(c)
    _damage(c, _shard_of(tiny_api.data_dir, m, SECOND))
    # as for a matrix larger than the part read ahead: rows 0-3 checked, 4-7 streamed later
    monkeypatch.setattr(route, "_CHUNK_ROWS", 4)
    monkeypatch.setattr(route, "_CHECKED_BYTES", 1)
    with pytest.raises(route.RowsLost, match="4 rows are no longer stored"):
        with c.stream("GET", f"/v1/datasets/{ds['id']}/features",
                      params={"view": "layer:-1", "pooling": "max"}) as r:
            assert r.status_code == 200
            body = b"".join(r.iter_bytes())
            pytest.fail(f"a {len(body)}-byte body ended without an error")

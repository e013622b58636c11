"""A server storing int8 rows (``storage_dtype=int8``, docs/storage.md): its answers are
the dequantised rows, in float32, within the documented error of a float32 server's, and
cached rows are answered from the store (and the row cache) like any other."""

from __future__ import annotations

import base64

import numpy as np

TEXTS = ["one text", "two texts, a little longer than the first"]


def _all_layers(api) -> tuple[dict, np.ndarray]:  # type: ignore[no-untyped-def]
    body = api.client.post("/v1/features", json={"texts": TEXTS, "view": "all_layers",
                                                  "format": "base64"}).json()
    rows = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4" if body["dtype"] == "float32"
                                   else "<f2") for d in body["data"]])
    return body, rows.reshape(len(TEXTS), *body["shape"]).astype(np.float32)


def test_an_int8_server_answers_float32_rows_within_the_bound(tiny_api_factory) -> None:  # type: ignore[no-untyped-def]
    # each app's worker is stopped once its rows are read: in the PostgreSQL pass a test's apps
    # share one schema and its job queue, and another app's worker would take the next one's job
    int8_api = tiny_api_factory(storage_dtype="int8")
    q_body, q = _all_layers(int8_api)
    int8_api.worker.stop()
    float32_api = tiny_api_factory(storage_dtype="float32")
    _, x = _all_layers(float32_api)
    float32_api.worker.stop()
    assert q_body["dtype"] == "float32"  # dequantised, never int8 bytes read as floats
    bound = np.abs(x).max(axis=-1, keepdims=True) / 254 * (1 + 1e-6) + 1e-7
    assert (np.abs(q - x) <= bound).all() and np.abs(q - x).max() > 0
    api = tiny_api_factory(storage_dtype="int8")
    _, first = _all_layers(api)  # encoded, stored, read back from the shard
    again, cached = _all_layers(api)  # from the row cache
    assert all(d["cached"] for d in again["data"])
    np.testing.assert_array_equal(cached, first)

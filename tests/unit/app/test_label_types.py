"""Labels keep their type through upload, probes, heads and predict (issue 23, item 6).

Ints uploaded come back as ints (they came back as the strings ``['1', '0']``),
strings stay strings; a ``None`` label is no label and never a class in
``/v1/datasets/{id}/stats``; a NaN label is refused: by the client with an
``ApiError`` naming the row before anything is sent, by the server with a 422.
On the tiny encoder, the whole HTTP path (worker in a thread, probe jobs in a
thread pool).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest

from layerbank.app.client import ApiError, Client
from layerbank.cache.datasets import decode_label, label_type

POS = ["a good film", "a great play", "good and warm", "a lovely story"]
NEG = ["a bad film", "a dull play", "bad and cold", "an awful story"]


@pytest.fixture
def api(tiny_api_factory):  # type: ignore[no-untyped-def]
    api = tiny_api_factory()
    api.client.app.state.probe_service.executor_factory = lambda: ThreadPoolExecutor(1)
    return api


def _wait(c: Any, job_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (job := c.get(f"/v1/jobs/{job_id}").json())["state"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.02)
    assert job["state"] == "succeeded", job
    return job  # type: ignore[no-any-return]


def _texts(n: int = 6) -> list[str]:
    return [f"{t} number {i}" for i in range(n) for t in (POS[i % 4], NEG[i % 4])]


def _round_trip(c: Any, labels: list[Any]) -> dict[str, Any]:
    """Upload, probe, fit a head from the probe, predict: every place a label shows."""
    texts = _texts(len(labels) // 2)
    r = c.post("/v1/datasets", json={"name": "typed", "texts": texts, "labels": labels})
    assert r.status_code == 202, r.text
    ds = r.json()
    _wait(c, ds["job_id"])
    probe = c.post("/v1/probes", json={"dataset": ds["id"], "views": ["layer:-1"], "poolings": ["mean"],
                                       "cv": 2, "control_task": False, "learning_curve": False,
                                       "mdl": False}).json()
    _wait(c, probe["id"])
    head = c.post("/v1/heads", json={"probe": probe["id"]}).json()
    _wait(c, head["job_id"])
    pred = c.post(f"/v1/heads/{head['id']}/predict", json={"texts": texts[:2]}).json()
    return {"dataset": c.get(f"/v1/datasets/{ds['id']}").json(),
            "stats": c.get(f"/v1/datasets/{ds['id']}/stats").json(),
            "probe": c.get(f"/v1/probes/{probe['id']}").json()["result"]["task"]["classes"],
            "head": c.get(f"/v1/heads/{head['id']}").json()["classes"],
            "predict": pred}


def test_int_labels_come_back_as_ints_everywhere(api) -> None:  # type: ignore[no-untyped-def]
    got = _round_trip(api.client, [1, 0] * 6)
    assert got["dataset"]["labels"] == [0, 1] and got["dataset"]["label_type"] == "int"
    assert got["stats"]["labels"] == {"0": 6, "1": 6} and got["stats"]["label_type"] == "int"
    assert got["probe"] == [0, 1]
    assert got["head"] == [0, 1]
    pred = got["predict"]
    assert pred["classes"] == [0, 1]
    labels = [d["label"] for d in pred["data"]]
    assert all(type(v) is int for v in labels) and set(labels) <= {0, 1}, labels


def test_string_labels_stay_strings(api) -> None:  # type: ignore[no-untyped-def]
    got = _round_trip(api.client, ["pos", "neg"] * 6)
    assert got["dataset"]["labels"] == ["neg", "pos"] and got["dataset"]["label_type"] == "str"
    assert got["probe"] == got["head"] == got["predict"]["classes"] == ["neg", "pos"]
    assert all(type(d["label"]) is str for d in got["predict"]["data"])
    # digits as text stay text: "1" is not 1
    got = _round_trip(api.client, ["1", "0"] * 6)
    assert got["probe"] == got["head"] == got["predict"]["classes"] == ["0", "1"]


def test_a_none_label_is_no_class_in_the_stats(api) -> None:  # type: ignore[no-untyped-def]
    c = api.client
    texts = _texts(3)
    r = c.post("/v1/datasets", json={"name": "gaps", "texts": texts, "labels": [1, 0, None, 0, 1, 1]})
    assert r.status_code == 202, r.text
    _wait(c, r.json()["job_id"])
    st = c.get(f"/v1/datasets/{r.json()['id']}/stats").json()
    assert st["labels"] == {"0": 2, "1": 3} and st["unlabelled"] == 1, st
    assert c.get(f"/v1/datasets/{r.json()['id']}").json()["labels"] == [0, 1]


def test_the_server_refuses_a_nan_label_naming_it(api) -> None:  # type: ignore[no-untyped-def]
    body = '{"name": "nan", "texts": ["a", "b", "c"], "labels": [1, 0, NaN]}'  # Python's JSON reads NaN
    r = api.client.post("/v1/datasets", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "labels.2 is nan, not a label; send null for a text without one"
    assert r.json()["field"] == "labels.2"


def _recording_client() -> tuple[Client, list[httpx.Request]]:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(202, json={"id": "ds_x", "job_id": "j"})

    return Client("http://lb.test", transport=httpx.MockTransport(handler)), sent


@pytest.mark.parametrize("bad", [float("nan"), np.float64("nan"), "pd.NA"])
def test_the_client_refuses_a_nan_label_before_sending(bad: Any) -> None:
    import pandas as pd

    bad = pd.NA if bad == "pd.NA" else bad
    client, sent = _recording_client()
    with pytest.raises(ApiError) as e:
        client.upload_dataset("d", ["a", "b", "c"], labels=[1, bad, 0])
    assert e.value.type == "validation"
    shown = "<NA>" if bad is pd.NA else "nan"  # numpy's NaN shown as Python's
    assert str(e.value).startswith(f"validation: labels[1] is {shown}, not a label (a missing value)")
    assert sent == []
    # a DataFrame's NaN (a float column with a gap) is named by its table row as well
    df = pd.DataFrame({"text": ["a", "", "b", "c"], "label": [1.0, 0.0, float("nan"), 0.0]})
    with pytest.raises(ApiError, match=r"^validation: row 3 \(labels\[1\]\) is nan, not a label"):
        client.upload_dataset("d", df, label_column="label")
    assert sent == []


def test_the_client_sends_ints_as_ints_and_none_as_null() -> None:
    import pandas as pd

    client, sent = _recording_client()
    client.upload_dataset("d", ["a", "b", "c"], labels=np.array([1, 0, 1]))
    df = pd.DataFrame({"text": ["a", "b"], "label": pd.Series([1, None], dtype=object)})
    client.upload_dataset("d", df, label_column="label")
    assert [json.loads(r.content)["labels"] for r in sent] == [[1, 0, 1], [1, None]]


@pytest.mark.parametrize(("labels", "kind", "stored"), [
    ([1, 0, None], "int", ["1", "0", None]),
    (["b", "a"], "str", ["b", "a"]),
    ([True, False], "bool", ["True", "False"]),
    ([0.5, 1, 2.25], "float", ["0.5", "1.0", "2.25"]),
    ([1, "a"], "str", ["1", "a"]),  # mixed: as text, as before types were kept
])
def test_label_types_round_trip_through_their_text(labels: list[Any], kind: str, stored: list[Any]) -> None:
    from layerbank.cache.datasets import _encode

    assert label_type(labels) == kind
    assert [None if v is None else _encode(v, kind) for v in labels] == stored
    back = [decode_label(s, kind) for s in stored]
    python_type = {"int": int, "str": str, "bool": bool, "float": float}[kind]
    assert all(type(v) is python_type for v in back if v is not None), back
    assert back == [v if v is None else python_type(v) for v in labels]

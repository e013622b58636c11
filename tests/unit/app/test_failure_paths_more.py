"""More failure paths from issue 16 (item 10): documented promises that had no test.

Each test here failed when the line it guards was broken on purpose
(docs/reliability.md lists which). Probe and head jobs run in a thread pool,
as in tests/unit/app/test_probe_routes.py; the rest is the real path.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from layerbank.cache.catalog import Catalog
from layerbank.cache.jobs import JobQueue

POS = ["a good film", "a great play", "good and warm", "a lovely story", "great fun", "a fine good show"]
NEG = ["a bad film", "a dull play", "bad and cold", "an awful story", "dull work", "a poor bad show"]


@pytest.fixture
def api(tiny_api_factory):  # type: ignore[no-untyped-def]
    api = tiny_api_factory()
    api.client.app.state.probe_service.executor_factory = lambda: ThreadPoolExecutor(1)
    return api


def _wait_state(c, job_id: str, states: tuple[str, ...], timeout: float = 60) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while (job := c.get(f"/v1/jobs/{job_id}").json())["state"] not in states:
        assert time.monotonic() < deadline, job
        time.sleep(0.02)
    return job  # type: ignore[no-any-return]


def _dataset(c, n_per_class: int = 6) -> dict:  # type: ignore[no-untyped-def]
    texts, labels = [], []
    for i in range(n_per_class):
        texts += [f"{POS[i % len(POS)]} number {i}", f"{NEG[i % len(NEG)]} number {i}"]
        labels += ["pos", "neg"]
    r = c.post("/v1/datasets", json={"name": "d", "texts": texts, "labels": labels})
    assert r.status_code == 202, r.text
    assert _wait_state(c, r.json()["job_id"], ("succeeded", "failed"))["state"] == "succeeded"
    return r.json()  # type: ignore[no-any-return]


PROBE = {"views": ["each_layer"], "poolings": ["mean"], "cv": 2, "learning_curve": False}


# -- 1. the 400 shape -----------------------------------------------------------------------
def test_a_body_that_cannot_be_read_is_a_400_in_the_one_error_shape(tiny_api) -> None:  # type: ignore[no-untyped-def]
    # docs/api.md: 400 bad_request is "a body that cannot be read at all": a multipart
    # upload whose parts have no headers (Starlette's parser gives up on it)
    body = b"--xyz\r\nthis part has no headers at all\r\n--xyz--\r\n"
    r = tiny_api.client.post("/v1/datasets", content=body,
                             headers={"Content-Type": "multipart/form-data; boundary=xyz"})
    assert r.status_code == 400, r.text
    got = r.json()
    assert set(got) == {"error", "type"} and got["type"] == "bad_request", got
    assert got["error"] and "detail" not in got


# -- 2. probe jobs handed back on stop, requeued after a crash ----------------------------
def test_a_running_probe_job_is_handed_back_when_the_pool_stops(api, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from layerbank.app.api.probe_jobs import jobs

    c = api.client
    ds = _dataset(c)
    entered, release = threading.Event(), threading.Event()

    def fit_that_waits(*a: Any, **k: Any) -> dict:
        entered.set()
        release.wait(30)
        raise RuntimeError("the pool was stopped; this outcome must not be recorded")

    monkeypatch.setattr(jobs, "probe_sentences", fit_that_waits)
    r = c.post("/v1/probes", json={"dataset": ds["id"], **PROBE})
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    assert entered.wait(30)
    running = c.get(f"/v1/jobs/{job_id}").json()
    assert running["state"] == "running" and running["attempts"] == 1, running
    service = c.app.state.probe_service
    pool = service._executor
    try:
        c.portal.call(service.close)  # what the server's shutdown does
    finally:
        release.set()
    job = c.get(f"/v1/jobs/{job_id}").json()
    # handed back, the attempt not counted (cache/jobs.py release(died=False))
    assert job["state"] == "queued" and job["attempts"] == 0 and job["error"] is None, job
    pool.shutdown(wait=True)  # the stopped run ends; its error is not ours to record any more
    job = c.get(f"/v1/jobs/{job_id}").json()
    assert job["state"] == "queued" and job["error"] is None, job


def test_a_probe_job_whose_process_died_is_requeued_at_lease_expiry_and_succeeds(api) -> None:  # type: ignore[no-untyped-def]
    c = api.client
    ds = _dataset(c)
    service = c.app.state.probe_service
    q = JobQueue(c.app.state.layerbank.store.catalog)
    real_next = service.claimer.next
    service.claimer.next = lambda: None  # the app's pool takes nothing while a "dead server" claims
    try:
        job_id = service.submit("probe", {"task": "sentence_classification", "dataset_id": ds["id"],
                                          "views": ["each_layer"], "poolings": ["mean"], "head": "logistic",
                                          "cv": 2, "seed": 0, "control_task": False,
                                          "learning_curve": False, "train_sizes": [4]})
        # a probe process on another machine claimed it and died: nothing renews its 1 s lease
        dead = q.claim("elsewhere:4242:probes", ["probe"], lease_s=1.0)
        assert dead is not None and dead.id == job_id
    finally:
        service.claimer.next = real_next
    assert c.get(f"/v1/jobs/{job_id}").json()["state"] == "running"
    job = _wait_state(c, job_id, ("succeeded", "failed", "cancelled"))
    assert job["state"] == "succeeded", job
    assert job["attempts"] == 2, job  # the dead run counts as an attempt
    assert c.get(f"/v1/probes/{job_id}").status_code == 200


# -- 3. a head cancelled mid-fit writes no files --------------------------------------------
def test_a_head_cancelled_while_it_fits_writes_no_files(api, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from layerbank.app.api.probe_jobs import jobs

    c = api.client
    ds = _dataset(c)
    real_fit = jobs.fit_head
    job_ids: list[str] = []

    def fit_then_cancelled(*a: Any, **k: Any) -> Any:
        head = real_fit(*a, **k)
        # the user cancels while the fit runs; the fit itself then ends
        r = c.delete(f"/v1/jobs/{job_ids[0]}")
        assert r.status_code in (200, 202), r.text
        return head

    monkeypatch.setattr(jobs, "fit_head", fit_then_cancelled)
    r = c.post("/v1/heads", json={"dataset": ds["id"], "view": "layers:1,2", "pooling": "mean"})
    assert r.status_code == 202, r.text
    head = r.json()
    job_ids.append(head["job_id"])
    job = _wait_state(c, head["job_id"], ("succeeded", "failed", "cancelled"))
    assert job["state"] == "cancelled", job
    root = api.data_dir / "heads"
    assert not (root / head["id"]).exists()
    assert not list(root.glob(f".{head['id']}.tmp-*"))  # no half-written temporary directory either
    r = c.post(f"/v1/heads/{head['id']}/predict", json={"texts": ["a good film"]})
    assert r.status_code == 409 and r.json()["type"] == "conflict"
    assert "is cancelled" in r.json()["error"], r.json()


# -- 4. the 409 for a head fitted on another model ----------------------------------------
def test_a_head_fitted_on_another_model_answers_409(api) -> None:  # type: ignore[no-untyped-def]
    c = api.client
    ds = _dataset(c)
    r = c.post("/v1/heads", json={"dataset": ds["id"], "view": "layers:1,2", "pooling": "mean"})
    assert r.status_code == 202, r.text
    head = r.json()
    assert _wait_state(c, head["job_id"], ("succeeded", "failed"))["state"] == "succeeded"
    assert c.post(f"/v1/heads/{head['id']}/predict", json={"texts": ["a good film"]}).status_code == 200
    # the catalog says what model A a head was fitted on; make that another model than this server's
    cat = Catalog(api.data_dir / "catalog.sqlite")  # SQLite, or the PostgreSQL catalog the test runs on
    with cat.tx() as db:
        db.execute("UPDATE heads SET fingerprint=?, model=? WHERE id=?", ("f" * 16, "other/model-a", head["id"]))
    cat.close()
    c.app.state.probe_service.forget_head(None)
    m = c.app.state.layerbank.model
    r = c.post(f"/v1/heads/{head['id']}/predict", json={"texts": ["a good film"]})
    assert r.status_code == 409, r.text
    got = r.json()
    assert got["type"] == "conflict" and set(got) == {"error", "type"}, got
    assert got["error"].startswith(f"head {head['id']} was fitted on features of other/model-a ({'f' * 16}, ")
    assert f"this server serves {m.name} ({m.fingerprint}, " in got["error"]
    assert got["error"].endswith("whose features it cannot read")

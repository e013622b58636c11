"""The client's retry rule and error type, against httpx.MockTransport: 429 and
503 are retried after ``Retry-After`` (seconds or an HTTP date, else a backoff),
within a count and a total time; every failure is one ``ApiError`` whose text
is the server's. Sleeping is recorded, not done. (Against a real server:
tests/integration/test_client.py.)"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable

import httpx
import pytest

from layerbank.app.client import ApiError, Client, JobFailed, JobTimeout

BUSY = {"error": "overloaded: 4 requests are already waiting for the encoder (max_queue_depth=4); "
                 "retry shortly", "type": "overloaded", "limit": "max_queue_depth"}


def _client(answers: list[httpx.Response], **kw: object) -> tuple[Client, list[float], list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers.pop(0)

    c = Client("http://lb.test", transport=httpx.MockTransport(handler), **kw)  # type: ignore[arg-type]
    slept: list[float] = []
    c._sleep = slept.append
    return c, slept, seen


def _busy(retry_after: str | None = "1", status: int = 429) -> httpx.Response:
    return httpx.Response(status, json=BUSY, headers={"Retry-After": retry_after} if retry_after else {})


def test_a_429_is_retried_after_its_retry_after_and_the_answer_returned() -> None:
    c, slept, seen = _client([_busy("2"), _busy("1"), httpx.Response(200, json={"status": "ok"})])
    assert c.health() == {"status": "ok"}
    assert slept == [2.0, 1.0] and len(seen) == 3
    assert c.retries == [(429, 2.0), (429, 1.0)]


def test_a_503_is_retried_and_without_retry_after_backs_off_doubling() -> None:
    not_ready = httpx.Response(503, json={"error": "the worker has not registered its model yet",
                                          "type": "not_ready"})
    c, slept, _ = _client([not_ready, not_ready, not_ready, httpx.Response(200, json={"status": "ok"})])
    c.health()
    assert slept == [0.5, 1.0, 2.0]


def test_an_http_date_retry_after_is_honoured() -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    c, slept, _ = _client([_busy(when), httpx.Response(200, json={"status": "ok"})])
    c.health()
    assert 28.0 <= slept[0] <= 30.0


def test_past_the_retry_count_the_servers_error_is_raised() -> None:
    c, slept, seen = _client([_busy("1")] * 3, max_retries=2)
    with pytest.raises(ApiError) as e:
        c.health()
    assert len(seen) == 3 and slept == [1.0, 1.0]
    assert (e.value.status, e.value.type, e.value.message) == (429, "overloaded", BUSY["error"])
    assert str(e.value) == f"429 overloaded: {BUSY['error']}"
    assert e.value.body["limit"] == "max_queue_depth"


def test_a_wait_past_the_total_time_is_not_slept_the_error_is_raised_at_once() -> None:
    c, slept, seen = _client([_busy("1"), _busy("60")], max_retry_seconds=10)
    with pytest.raises(ApiError, match="overloaded: 4 requests are already waiting"):
        c.health()
    assert slept == [1.0] and len(seen) == 2  # 1 s + 60 s would pass the 10 s bound


@pytest.mark.parametrize("status", [400, 404, 409, 413, 422, 500, 507])
def test_other_errors_are_not_retried(status: int) -> None:
    c, slept, seen = _client([httpx.Response(status, json={"error": "no dataset 'x'", "type": "t"})])
    with pytest.raises(ApiError) as e:
        c.dataset("x")
    assert (e.value.status, e.value.message, slept, len(seen)) == (status, "no dataset 'x'", [], 1)


def test_openai_shaped_errors_and_non_json_answers_keep_the_servers_text() -> None:
    oa = {"error": {"message": "input: texts must not be empty", "type": "invalid_request_error",
                    "param": "input", "code": "validation"}}
    c, _, _ = _client([httpx.Response(422, json=oa), httpx.Response(502, text="Bad Gateway from proxy")])
    with pytest.raises(ApiError) as e:
        c.embeddings(["x"])
    assert (e.value.status, e.value.type, e.value.message) == (422, "validation", "input: texts must not be empty")
    with pytest.raises(ApiError, match="502 error: Bad Gateway from proxy"):
        c.info()


def test_an_unreachable_server_is_an_api_error_too() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    c = Client("http://lb.test", transport=httpx.MockTransport(refuse))
    with pytest.raises(ApiError) as e:
        c.info()
    assert e.value.status is None and e.value.type == "unreachable" and "connection refused" in str(e.value)


def _jobs(*states: dict[str, object]) -> Callable[[httpx.Request], httpx.Response]:
    answers = list(states)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=answers.pop(0) if len(answers) > 1 else answers[0])
    return handler


def test_a_failed_job_is_a_job_failed_which_is_an_api_error_carrying_the_jobs_error() -> None:
    failed = {"id": "j1", "state": "failed", "error": "InputError: labels has one class", "progress": {}}
    c = Client("http://lb.test", transport=httpx.MockTransport(_jobs(failed)))
    with pytest.raises(ApiError) as e:
        c.wait("j1")
    assert isinstance(e.value, JobFailed) and e.value.job["id"] == "j1"
    assert str(e.value) == "job j1 failed: InputError: labels has one class"
    assert e.value.message == "InputError: labels has one class"


def test_wait_gives_up_after_its_timeout_with_a_job_timeout() -> None:
    running = {"id": "j2", "state": "running", "error": None, "progress": {"done": 1, "total": 4}}
    c = Client("http://lb.test", transport=httpx.MockTransport(_jobs(running)))
    c._sleep = lambda s: None
    with pytest.raises(JobTimeout) as e:
        c.wait("j2", timeout=0.0)
    assert isinstance(e.value, ApiError) and isinstance(e.value, TimeoutError)
    assert str(e.value) == "timeout: job j2 still running after 0.0 s"


def test_one_string_is_refused_as_texts_rather_than_sent_as_its_characters() -> None:
    c = Client("http://lb.test", transport=httpx.MockTransport(_jobs({})))
    with pytest.raises(TypeError, match=r"wrap it as \[text\]"):
        c.features("a great film")


def test_a_probe_on_a_dataset_still_extracting_waits_for_it_then_submits_once_more() -> None:
    calls: list[str] = []
    extracting = {"error": "dataset ds_1 is not ready: its extraction job ex1 is running",
                  "type": "conflict", "job_id": "ex1", "job_state": "running"}
    answers = {
        "POST /v1/probes": [httpx.Response(409, json=extracting),
                            httpx.Response(202, json={"id": "pr1", "job_id": "pr1", "state": "queued"})],
        "GET /v1/jobs/ex1": [httpx.Response(200, json={"id": "ex1", "state": "running", "progress": {}}),
                             httpx.Response(200, json={"id": "ex1", "state": "succeeded", "progress": {}})],
        "GET /v1/jobs/pr1": [httpx.Response(200, json={"id": "pr1", "state": "succeeded", "progress": {},
                                                       "result": {"best": {"view": "layer:4"}}})],
    }

    def handler(request: httpx.Request) -> httpx.Response:
        key = f"{request.method} {request.url.path}"
        calls.append(key)
        return answers[key].pop(0)

    c = Client("http://lb.test", transport=httpx.MockTransport(handler))
    c._sleep = lambda s: None
    result = c.probe({"id": "ds_1", "job_id": "ex1"}, views=["each_layer"], progress=False)
    assert result == {"best": {"view": "layer:4"}, "probe_id": "pr1"}
    assert calls == ["POST /v1/probes", "GET /v1/jobs/ex1", "GET /v1/jobs/ex1", "POST /v1/probes",
                     "GET /v1/jobs/pr1"]


def test_a_probe_on_a_dataset_whose_extraction_failed_raises_the_servers_409() -> None:
    failed = {"error": "dataset ds_1 has no features: its extraction job ex1 failed: disk full; upload it "
                       "again", "type": "conflict", "job_id": "ex1", "job_state": "failed"}
    c, _, seen = _client([httpx.Response(409, json=failed)])
    with pytest.raises(ApiError) as e:
        c.probe("ds_1", progress=False)
    assert (e.value.status, e.value.message, len(seen)) == (409, failed["error"], 1)

"""layerbank.app.api.errors on a bare FastAPI app: every handler's status, type and exact
words, the status table, the OpenAI shape on /v1/embeddings, and what a failed job's
stored type is answered with. No model and no data directory, so it runs in about a
second (bench/mutation.sh reruns it for every mutant of app/api/errors.py)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fastapi import FastAPI, Header
from fastapi.responses import PlainTextResponse
from fastapi.testclient import TestClient
from pydantic import BaseModel, field_validator
from starlette.exceptions import HTTPException
from starlette.routing import Route, Router

from layerbank.app.api import errors as E
from layerbank.cache.errors import InputError


class Body(BaseModel):
    texts: list[str]
    n: int = 1


class Checked(BaseModel):
    name: str

    @field_validator("name")
    @classmethod
    def _no_slash(cls, v: str) -> str:
        if "/" in v:
            raise ValueError("a name may not hold '/'")
        return v


def _app() -> FastAPI:
    app = FastAPI()
    E.install_error_handlers(app)

    @app.get("/raise/{kind}")
    def raise_(kind: str) -> None:
        if kind == "overloaded":
            raise E.Overloaded("4 jobs queued", limit="max_queue_depth", headers={"Retry-After": "5"})
        if kind == "conflict":
            raise E.Conflict("head h is running", extra={"job_id": "j1", "job_state": "running", "none": None})
        if kind == "storage":
            raise E.InsufficientStorage("the disk is full")
        if kind == "extraction":
            raise E.ExtractionFailed("extraction failed: boom")
        if kind == "invalid":
            raise E.InvalidInput("texts.0: a text may not be empty", field="texts.0")
        if kind == "input":
            raise InputError("tags.3 has 4 tags for 5 words", field="tags.3")
        if kind == "http":
            raise HTTPException(404, "no dataset 'x'")
        if kind == "teapot":
            raise HTTPException(418, "short and stout")
        raise RuntimeError("secret /etc/passwd traceback")

    @app.post("/items")
    def post_item(body: Body) -> dict[str, int]:
        return {"n": body.n}

    @app.get("/items")
    def list_items() -> dict[str, int]:
        return {}

    @app.post("/v1/embeddings")
    def embed(body: Body) -> dict[str, int]:
        raise E.Overloaded("too many", limit="max_queue_depth")

    @app.get("/params/{item_id}")
    def params(item_id: int, n: int = 1, x_count: int = Header(0)) -> dict[str, int]:
        return {"item_id": item_id}

    @app.post("/checked")
    def checked(body: Checked) -> dict[str, int]:
        return {}

    @app.delete("/elsewhere")
    def elsewhere() -> dict[str, int]:
        return {}

    @app.get("/parse/{how}")
    def parse(how: str) -> None:
        if how == "cause":
            raise HTTPException(400, "There was an error parsing the body") from ValueError("odd bytes")
        if how == "none":
            raise HTTPException(400, "There was an error parsing the body")
        if how == "other":
            raise HTTPException(400, "the upload has no file part")
        raise HTTPException(401, "who are you?", headers={"WWW-Authenticate": "Bearer"})

    async def sub(request: Any) -> PlainTextResponse:
        return PlainTextResponse("sub")

    app.mount("/sub", Router(routes=[Route("/things", sub, methods=["GET"]),
                                     Route("/things", sub, methods=["PATCH"])]))
    app.add_route("/late", sub, methods=["PATCH"])  # a route after the mount is still seen
    return app


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(_app(), raise_server_exceptions=False)


def test_the_status_table() -> None:
    assert E.STATUS_TYPES == {
        400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
        405: "method_not_allowed", 409: "conflict", 413: "too_large", 415: "unsupported_media_type",
        422: "validation", 429: "overloaded", 500: "internal", 503: "not_ready", 504: "timeout",
        507: "insufficient_storage"}
    classes = [E.ApiError, E.BadRequest, E.Unauthorized, E.NotFound, E.Conflict, E.TooLarge,
               E.UnsupportedMediaType, E.InvalidInput, E.Overloaded, E.ExtractionFailed, E.NotReady,
               E.Timeout, E.InsufficientStorage]
    assert [(c.status, c.type) for c in classes] == [
        (500, "internal"), (400, "bad_request"), (401, "unauthorized"), (404, "not_found"), (409, "conflict"),
        (413, "too_large"), (415, "unsupported_media_type"), (422, "validation"), (429, "overloaded"),
        (500, "extraction_failed"), (503, "not_ready"), (504, "timeout"), (507, "insufficient_storage")]
    for c in classes[1:]:
        if c.status != 500:
            assert E.STATUS_TYPES[c.status] == c.type


def test_api_errors_keep_their_limit_headers_and_extra_keys(client: TestClient,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="layerbank.api"):
        r = client.get("/raise/overloaded")
        assert (r.status_code, r.json()) == (429, {"error": "4 jobs queued", "type": "overloaded",
                                                   "limit": "max_queue_depth"})
        assert r.headers["retry-after"] == "5"
        r = client.get("/raise/conflict")
        assert (r.status_code, r.json()) == (409, {"error": "head h is running", "type": "conflict",
                                                   "job_id": "j1", "job_state": "running"})
        assert not caplog.records  # a 4xx is the client's: nothing in the server log
        r = client.get("/raise/storage")
        assert (r.status_code, r.json()) == (507, {"error": "the disk is full", "type": "insufficient_storage"})
        r = client.get("/raise/extraction")
        assert (r.status_code, r.json()) == (500, {"error": "extraction failed: boom", "type": "extraction_failed"})
    assert [(x.levelname, x.getMessage()) for x in caplog.records] == [
        ("ERROR", "GET /raise/storage: the disk is full"), ("ERROR", "GET /raise/extraction: extraction failed: boom")]


def test_an_invalid_input_names_its_field(client: TestClient) -> None:
    r = client.get("/raise/invalid")
    assert (r.status_code, r.json()) == (422, {"error": "texts.0: a text may not be empty", "type": "validation",
                                               "field": "texts.0"})


def test_a_domain_input_error_is_422_on_its_field(client: TestClient) -> None:
    r = client.get("/raise/input")
    assert (r.status_code, r.json()) == (422, {"error": "tags.3 has 4 tags for 5 words", "type": "validation",
                                               "field": "tags.3"})


def test_an_unexpected_error_is_500_without_its_traceback(client: TestClient,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="layerbank.api"):
        r = client.get("/raise/bug")
    assert (r.status_code, r.json()) == (500, {"error": "internal error; the server log has the details",
                                               "type": "internal"})
    assert "secret" not in r.text
    rec = [x for x in caplog.records if x.name == "layerbank.api"]
    assert [x.getMessage() for x in rec] == ["unhandled error on GET /raise/bug"]
    assert rec[0].exc_info is not None and "secret /etc/passwd" in str(rec[0].exc_info[1])


def test_starlette_http_errors_keep_their_words_and_get_a_type(client: TestClient) -> None:
    r = client.get("/raise/http")
    assert (r.status_code, r.json()) == (404, {"error": "no dataset 'x'", "type": "not_found"})
    r = client.get("/raise/teapot")  # a status outside the table still has the shape
    assert (r.status_code, r.json()) == (418, {"error": "short and stout", "type": "error"})
    r = client.get("/nowhere")
    assert (r.status_code, r.json()) == (404, {"error": "no route /nowhere; see /docs for the API",
                                               "type": "not_found"})


def test_405_names_the_methods_of_every_route_on_the_path(client: TestClient) -> None:
    r = client.put("/items", json={})
    assert r.status_code == 405 and r.headers["allow"] == "GET, POST"  # HEAD is implied by GET
    assert r.json() == {"error": "method PUT is not allowed on /items; allowed: GET, POST",
                        "type": "method_not_allowed"}


def test_validation_errors_name_the_field_and_count_the_rest(client: TestClient) -> None:
    r = client.post("/items", json={"texts": "not a list"})
    assert r.status_code == 422
    assert r.json() == {"error": "texts: Input should be a valid list", "type": "validation", "field": "texts"}
    r = client.post("/items", json={"texts": ["a", 3]})
    assert r.json()["field"] == "texts.1"
    r = client.post("/items", json={"texts": [1], "n": "x"})
    assert r.json()["error"] == "texts.0: Input should be a valid string (and 1 more problem)"
    r = client.post("/items", json={"texts": [1, 2], "n": "x"})
    assert r.json()["error"] == "texts.0: Input should be a valid string (and 2 more problems)"


def test_a_body_that_is_not_json_says_why(client: TestClient) -> None:
    r = client.post("/items", content=b'{"texts": [', headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["field"] == "body"
    assert r.json()["error"] == "the body is not valid JSON: Expecting value (at character 11)"
    r = client.post("/items", content=b'{"texts": ["\xff"]}', headers={"content-type": "application/json"})
    assert (r.status_code, r.json()) == (422, {"error": "the body is not valid JSON: it is not UTF-8 (byte 13 "
                                                        "cannot be decoded)", "type": "validation", "field": "body"})
    deep = b"[" * 100_000 + b"]" * 100_000
    r = client.post("/items", content=deep, headers={"content-type": "application/json"})
    assert (r.status_code, r.json()) == (422, {"error": "the body is not valid JSON: it is nested too deeply",
                                               "type": "validation", "field": "body"})


def test_embeddings_answer_in_openai_shape(client: TestClient) -> None:
    r = client.post("/v1/embeddings", json={"texts": ["a"]})
    assert (r.status_code, r.json()) == (429, {"error": {"message": "too many", "type": "rate_limit_error",
                                                         "param": None, "code": "overloaded"}})
    r = client.post("/v1/embeddings", json={"texts": "a"})
    assert (r.status_code, r.json()) == (422, {"error": {"message": "texts: Input should be a valid list",
                                                         "type": "invalid_request_error", "param": "texts",
                                                         "code": "validation"}})


@pytest.mark.parametrize(("status", "kind"), [(401, "authentication_error"), (429, "rate_limit_error"),
                                              (499, "invalid_request_error"), (500, "server_error"),
                                              (507, "server_error"), (404, "invalid_request_error")])
def test_openai_kinds(status: int, kind: str) -> None:
    assert E.body_for("/v1/embeddings/", status, "m", "t", field="f") == {
        "error": {"message": "m", "type": kind, "param": "f", "code": "t"}}
    assert E.body_for("/v1/features", status, "m", "t", field="f", limit=None) == {
        "error": "m", "type": "t", "field": "f"}


@pytest.mark.parametrize(("error", "error_type", "want"), [
    ("ShardWriteError: no space left on device while writing shard j-00000.h5", "storage",
     (E.InsufficientStorage, "extraction failed: no space left on device while writing shard j-00000.h5")),
    ("ProbeInputError: head: unknown head 'x'", "input", (E.InvalidInput, "extraction failed: head: unknown head 'x'")),
    ("RuntimeError: boom", "internal", (E.ExtractionFailed, "extraction failed: RuntimeError: boom")),
    ("RuntimeError: boom", None, (E.ExtractionFailed, "extraction failed: RuntimeError: boom")),
    ("worker died 3 times", "worker_died", (E.ExtractionFailed, "extraction failed: worker died 3 times")),
    ("disk 1 of 2: full", "storage", (E.InsufficientStorage, "extraction failed: disk 1 of 2: full")),
    ("no prefix at all", "storage", (E.InsufficientStorage, "extraction failed: no prefix at all")),
])
def test_a_failed_job_is_answered_from_its_stored_type(error: str, error_type: Any, want: Any) -> None:
    got = E.job_failure(error, error_type)
    assert (type(got), got.message) == want


def test_job_failure_takes_its_words_and_fallback() -> None:
    got = E.job_failure("RuntimeError: x", "internal", what="probe failed", fallback=E.ApiError)
    assert (type(got), got.status, got.message) == (E.ApiError, 500, "probe failed: RuntimeError: x")
    got = E.job_failure("OSError: full", "storage", what="head failed", fallback=E.ApiError)
    assert (type(got), got.message) == (E.InsufficientStorage, "head failed: full")


def test_query_path_and_header_fields_are_named_without_their_prefix(client: TestClient) -> None:
    assert client.get("/params/x").json()["field"] == "item_id"
    assert client.get("/params/1", params={"n": "many"}).json()["field"] == "n"
    assert client.get("/params/1", headers={"x-count": "lots"}).json()["field"] == "x-count"


def test_a_validators_words_come_without_pydantics_prefix(client: TestClient) -> None:
    r = client.post("/checked", json={"name": "a/b"})
    assert (r.status_code, r.json()) == (422, {"error": "name: a name may not hold '/'", "type": "validation",
                                               "field": "name"})


def test_other_parse_failures_and_400s_keep_their_words(client: TestClient) -> None:
    assert client.get("/parse/cause").json() == {"error": "the body is not valid JSON: ValueError: odd bytes",
                                                 "type": "validation", "field": "body"}
    assert client.get("/parse/none").json() == {"error": "the body is not valid JSON: it cannot be parsed",
                                                "type": "validation", "field": "body"}
    r = client.get("/parse/other")
    assert (r.status_code, r.json()) == (400, {"error": "the upload has no file part", "type": "bad_request"})
    r = client.get("/parse/auth")
    assert (r.status_code, r.json()) == (401, {"error": "who are you?", "type": "unauthorized"})
    assert r.headers["www-authenticate"] == "Bearer"


def test_405_looks_inside_mounted_routers_and_leaves_out_head(client: TestClient) -> None:
    r = client.put("/sub/things")
    assert r.status_code == 405 and r.headers["allow"] == "GET, PATCH"
    assert r.json()["error"] == "method PUT is not allowed on /sub/things; allowed: GET, PATCH"
    assert client.put("/elsewhere").headers["allow"] == "DELETE"
    assert client.put("/late").headers["allow"] == "PATCH"

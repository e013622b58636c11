"""Errors over HTTP: one shape, one status table, handlers registered once.

Every error response has the body ``{"error": "<what went wrong, for a
person>", "type": "<machine-readable kind>"}`` (validation errors add
``"field"``, limit errors add ``"limit"``). Route code raises the classes
below and never builds responses for errors itself.

Hierarchy (the handler is registered on the base class; Starlette finds it
for every subclass)::

    ApiError                      500 internal
    ├── BadRequest                400 bad_request
    ├── Unauthorized              401 unauthorized
    ├── NotFound                  404 not_found
    ├── Conflict                  409 conflict
    ├── TooLarge                  413 too_large      (names the limit)
    ├── UnsupportedMediaType      415 unsupported_media_type
    ├── InvalidInput              422 validation     (names the field)
    ├── Overloaded                429 overloaded     (names the limit; Retry-After)
    ├── ExtractionFailed          500 extraction_failed
    ├── NotReady                  503 not_ready
    ├── Timeout                   504 timeout
    └── InsufficientStorage       507 insufficient_storage (the disk is full)

Foreign errors are translated here, at the boundary, by handlers registered
on their base classes: FastAPI's ``RequestValidationError`` (including
malformed JSON) -> 422; Starlette's ``HTTPException`` (unknown route 404,
405 with its ``Allow`` header, ...) -> the same shape with the type from
``STATUS_TYPES``; ``layerbank.cache.errors.InputError`` (every domain input
error: ``ViewError``, ``ProbeInputError``, ``WordSetError``, ...) -> 422 on the
field it names, so domain code raises where it finds the problem and routes do
not re-raise; Starlette's ``ClientDisconnect`` (the client went away before
its body was read) -> one INFO line; anything else -> 500 ``internal`` (logged
with its traceback, never shown).

A failed job's answer comes from its stored failure type, never its message:
``job_failure(error, error_type)`` ("storage" -> 507, "input" -> 422,
"unavailable" -> 503 with ``Retry-After``, else 500).
A catalog that fails under a request (a miss waiting for its encode job, say)
is answered by ``catalog_failure(exc)`` as the catalog handlers answer it
(app/api/catalog_health.py): cannot be reached -> 503 with ``Retry-After``,
disk full -> 507, never ``extraction_failed``.

The one exception to the shape is ``/v1/embeddings``, which answers as
OpenAI does, ``{"error": {"message", "type", "param", "code"}}``, because
the OpenAI SDK puts only ``error.message`` into its exception text: in our
shape a user of the SDK saw just ``Error code: 422``. ``code`` there carries
our own type, ``param`` the field (see ``body_for``).

Example::

    raise TooLarge("128 texts in one request; the limit is 64", limit="max_texts_per_request")
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from layerbank.cache.errors import InputError

__all__ = [
    "STATUS_TYPES",
    "ApiError",
    "BadRequest",
    "Conflict",
    "ExtractionFailed",
    "InsufficientStorage",
    "InvalidInput",
    "NotFound",
    "NotReady",
    "Overloaded",
    "Timeout",
    "TooLarge",
    "Unauthorized",
    "UnsupportedMediaType",
    "body_for",
    "catalog_failure",
    "error_body",
    "install_error_handlers",
    "job_failure",
]

log = logging.getLogger("layerbank.api")

# the one status table: status -> "type" (also used for Starlette's own HTTPExceptions)
STATUS_TYPES: dict[int, str] = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 409: "conflict", 413: "too_large", 415: "unsupported_media_type",
    422: "validation", 429: "overloaded", 500: "internal", 503: "not_ready", 504: "timeout",
    507: "insufficient_storage",
}


class ApiError(Exception):
    status = 500
    type = "internal"

    def __init__(self, message: str, *, field: str | None = None, limit: str | None = None,
                 headers: dict[str, str] | None = None, extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.limit = limit
        self.headers = headers
        self.extra = extra  # more machine-readable keys for the body, e.g. {"job_id": ...}


class BadRequest(ApiError):
    status, type = 400, "bad_request"


class Unauthorized(ApiError):
    status, type = 401, "unauthorized"


class NotFound(ApiError):
    status, type = 404, "not_found"


class Conflict(ApiError):
    status, type = 409, "conflict"


class TooLarge(ApiError):
    status, type = 413, "too_large"


class UnsupportedMediaType(ApiError):
    status, type = 415, "unsupported_media_type"


class InvalidInput(ApiError):
    status, type = 422, "validation"


class Overloaded(ApiError):
    status, type = 429, "overloaded"


class ExtractionFailed(ApiError):
    status, type = 500, "extraction_failed"


class NotReady(ApiError):
    status, type = 503, "not_ready"


class Timeout(ApiError):
    status, type = 504, "timeout"


class InsufficientStorage(ApiError):
    """The worker could not write a shard: disk full, quota, or file-size limit.

    Not the request's fault and not a bug: the operator frees space and the
    same request then succeeds (nothing was committed)."""
    status, type = 507, "insufficient_storage"


# a failed job's error_type (layerbank.cache.errors.FAILURE_TYPES) -> the answer; others: 500
_FAILURE_ERRORS: dict[str, type[ApiError]] = {"storage": InsufficientStorage, "input": InvalidInput,
                                              "unavailable": NotReady}


def job_failure(error: str, error_type: str | None, *, what: str = "extraction failed",
                fallback: type[ApiError] = ExtractionFailed) -> ApiError:
    """The HTTP error for a job that failed with ``error`` (its text) of ``error_type``.

    A full disk is the operator's to fix and the request may be sent again
    unchanged, so it is a 507; input the job could not use is a 422.
    """
    cls = _FAILURE_ERRORS.get(error_type or "", fallback)
    if cls is not fallback:
        # the class name the runner put in front says nothing the status does not
        head, sep, rest = error.partition(": ")
        error = rest if sep and head.isidentifier() else error
    if cls is NotReady:  # the catalog was unreachable meanwhile: the same request may be sent again
        return NotReady(f"{what}: {error}; retry shortly",
                        headers={"Retry-After": str(CATALOG_RETRY_AFTER_S)})
    return cls(f"{what}: {error}")


CATALOG_RETRY_AFTER_S = 2  # a PostgreSQL restart or a replica's failover takes seconds


def catalog_failure(exc: BaseException) -> ApiError | None:
    """The answer for a catalog error met under a request, or None if it is not one of these:
    the catalog cannot be reached (503, Retry-After) or its disk is full (507)."""
    from layerbank.cache.postgres import CatalogUnavailable
    from layerbank.cache.space import is_disk_full

    if isinstance(exc, CatalogUnavailable):
        return NotReady(f"{exc}; nothing was changed; retry shortly",
                        headers={"Retry-After": str(CATALOG_RETRY_AFTER_S)})
    if is_disk_full(exc):
        return InsufficientStorage(f"the disk holding the catalog is full ({exc}); nothing was "
                                   "changed; free some space and send the request again")
    return None


def error_body(message: str, type_: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"error": message, "type": type_}
    body.update({k: v for k, v in extra.items() if v is not None})
    return body


# routes that speak OpenAI's error shape, so OpenAI's SDKs show the reason
OPENAI_PATHS = frozenset({"/v1/embeddings"})


def _openai_type(status: int) -> str:
    # OpenAI's own kinds: the SDK and its users branch on these
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"


def body_for(path: str, status: int, message: str, type_: str, **extra: Any) -> dict[str, Any]:
    """The error body for a request to ``path``: OpenAI's shape on OPENAI_PATHS
    (our type as ``code``, the field as ``param``), ours everywhere else."""
    if path.rstrip("/") in OPENAI_PATHS:
        return {"error": {"message": message, "type": _openai_type(status),
                          "param": extra.get("field"), "code": type_}}
    return error_body(message, type_, **extra)


def _respond(request: Request, status: int, message: str, type_: str,
             headers: Any = None, **extra: Any) -> JSONResponse:
    return JSONResponse(body_for(request.url.path, status, message, type_, **extra),
                        status_code=status, headers=headers)


def _loc(loc: tuple[Any, ...] | list[Any]) -> str:
    # ("body", "texts", 3) -> "texts.3"; the "body"/"query" prefix says nothing to a user
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts) or "body"


def _validation_message(err: dict[str, Any]) -> tuple[str, str]:
    field = _loc(err.get("loc", ()))
    if err.get("type") == "json_invalid":
        reason = (err.get("ctx") or {}).get("error", "invalid JSON")
        return "body", f"the body is not valid JSON: {reason} (at character {field})"
    msg = str(err.get("msg", "invalid value"))
    msg = msg.removeprefix("Value error, ")
    return field, f"{field}: {msg}"


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    if exc.status >= 500:
        log.error("%s %s: %s", request.method, request.url.path, exc.message)
    return _respond(request, exc.status, exc.message, exc.type, exc.headers, field=exc.field,
                    limit=exc.limit, **(exc.extra or {}))


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if not errors:
        return _respond(request, 422, "invalid request", "validation")
    field, message = _validation_message(errors[0])
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return _respond(request, 422, message, "validation", field=field)


async def _input_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InputError)
    return _respond(request, 422, str(exc), "validation", field=exc.field)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if status == 400 and detail == "There was an error parsing the body":
        # FastAPI's words for a JSON body that json.loads could not take; say why
        cause = exc.__cause__
        if isinstance(cause, ClientDisconnect):  # the client went away while its body was read
            return await _client_gone(request, cause)
        if isinstance(cause, UnicodeDecodeError):
            why = f"it is not UTF-8 (byte {cause.start + 1} cannot be decoded)"
        elif isinstance(cause, RecursionError):
            why = "it is nested too deeply"
        else:
            why = f"{type(cause).__name__}: {cause}" if cause is not None else "it cannot be parsed"
        return _respond(request, 422, f"the body is not valid JSON: {why}", "validation",
                        field="body")
    if status == 404 and detail == "Not Found":
        detail = f"no route {request.url.path}; see /docs for the API"
    headers = exc.headers
    if status == 405:
        # Starlette names only the methods of the first route on this path; a path
        # served by several routes (GET list + POST create) allows all of theirs
        allow = ", ".join(_allowed_methods(request))
        headers = {**(headers or {}), "Allow": allow}
        detail = f"method {request.method} is not allowed on {request.url.path}; allowed: {allow}"
    return _respond(request, status, detail, STATUS_TYPES.get(status, "error"), headers)


def _allowed_methods(request: Request) -> list[str]:
    methods: set[str] = set()
    scope = {**request.scope, "method": "__none__"}  # matches no route fully: path-only matching

    def visit(routes: Any) -> None:
        for route in routes:
            inner = getattr(route, "original_router", None) or getattr(route, "routes", None)
            if inner is not None and not hasattr(route, "methods"):
                visit(getattr(inner, "routes", inner))  # an included router: its own routes
                continue
            match, _ = route.matches(scope)
            if match is not Match.NONE:
                methods.update(getattr(route, "methods", None) or ())

    visit(request.app.router.routes)
    methods.discard("HEAD")  # implied by GET; the schema documents GET
    return sorted(methods)


async def _client_gone(request: Request, exc: Exception) -> JSONResponse:
    # the client went away before its request was read (closed, or cut as too slow by
    # app/api/slow_clients.py): nobody reads the answer; one INFO line, not a traceback
    client = request.client
    who = f"{client.host}:{client.port}" if client else "a client"
    log.info("%s disconnected before %s %s was read", who, request.method, request.url.path)
    return _respond(request, 400, "the client disconnected before the request was read", "bad_request")


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return _respond(request, 500, "internal error; the server log has the details", "internal")


def install_error_handlers(app: FastAPI) -> None:
    """Register every handler once, on base classes."""
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(InputError, _input_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(Exception, _unexpected)

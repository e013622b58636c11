"""The Host/Origin guard (app/api/origin.py) on its own, request by request: which
requests reach the app and which get the 403, with the exact status, headers and
words a refused client sees. A bare ASGI app behind the guard, no model, so the
whole file runs in well under a second (bench/mutation.sh runs it per mutant;
tests/unit/app/test_origin_guard.py drives the same guard inside the real app)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from layerbank.app.api.origin import OriginGuard

HOST_WORDS = ("is not one of this server's names; a server without an API key answers only to its own "
              "(loopback names, --host, --allowed-hosts)")
ORIGIN_WORDS = "is not this server; a server without an API key only takes changes from its own pages"
NO_ORIGIN_WORDS = ("post without an Origin header could come from any web page; send 'Origin: <this "
                   "server's URL>' (the Python client does) or use an API key")


async def _reached(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"reached"})


def call(method: str = "GET", path: str = "/v1/datasets", *, host: bytes | None = b"127.0.0.1:8000",
         allowed: frozenset[str] | None = frozenset(), scheme: str | None = "http",
         headers: dict[bytes, bytes] | None = None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """One request through the guard: (status, response headers, body)."""
    raw = [(b"host", host)] if host is not None else []
    raw += list((headers or {}).items())
    scope: dict[str, Any] = {"type": "http", "method": method, "path": path, "headers": raw}
    if scheme is not None:
        scope["scheme"] = scheme
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(OriginGuard(_reached, allowed)(scope, receive, send))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    return sent[0]["status"], sent[0]["headers"], sent[1]["body"]


def refused(message: str, **kw: Any) -> None:
    status, headers, body = call(**kw)
    assert status == 403, (status, body)
    assert headers == [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    assert json.loads(body) == {"error": message, "type": "forbidden"}


def reached(**kw: Any) -> None:
    assert call(**kw)[::2] == (200, b"reached"), kw


def test_a_foreign_host_is_refused_in_words_and_health_is_exempt() -> None:
    refused(f"host 'attacker.example:8000' {HOST_WORDS}", host=b"attacker.example:8000")
    refused(f"host 'attacker.example' {HOST_WORDS}", method="POST", host=b"attacker.example",
            headers={b"origin": b"http://attacker.example"})
    refused(f"host '' {HOST_WORDS}", host=None)  # no Host at all (HTTP/1.0)
    refused(f"host ':8000' {HOST_WORDS}", host=b":8000")  # a port without a name
    refused(f"host 'localhost:http' {HOST_WORDS}", host=b"localhost:http")  # a port that is no number
    refused(f"host 'caf\u00e9.example' {HOST_WORDS}", host=b"caf\xe9.example")  # bytes read as latin-1
    long = b"a" * 300 + b".example"
    refused(f"host {'a' * 100!r} {HOST_WORDS}", host=long)  # shown cut to 100 characters
    reached(path="/health", host=b"10.1.2.3")  # load balancers probe by IP
    refused(f"host '10.1.2.3' {HOST_WORDS}", path="/healthz", host=b"10.1.2.3")  # only /health itself


def test_the_openai_routes_get_the_refusal_in_openais_shape() -> None:
    status, _, body = call("POST", "/v1/embeddings", host=b"evil.example")
    assert status == 403
    assert json.loads(body) == {"error": {"message": f"host 'evil.example' {HOST_WORDS}", "type": "invalid_request_error",
                                          "param": None, "code": "forbidden"}}


def test_other_connection_types_pass_untouched() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    async def nothing() -> dict[str, Any]:
        return {}

    async def no_send(message: Any) -> None:
        raise AssertionError(message)

    for kind in ("lifespan", "websocket"):
        scope = {"type": kind, "path": "/v1/datasets", "headers": [(b"host", b"evil.example")]}
        asyncio.run(OriginGuard(app, frozenset())(scope, nothing, no_send))
    assert seen == ["lifespan", "websocket"]


@pytest.mark.parametrize("host", [b"127.0.0.1:8000", b"localhost", b"LOCALHOST.:8000", b"app.localhost",
                                  b"[::1]:8000", b"127.0.0.2", b"lab.internal:8000"])
def test_own_names_are_reached(host: bytes) -> None:
    reached(host=host, allowed=frozenset({"lab.internal"}))


def test_extra_names_and_the_wildcard() -> None:
    refused(f"host 'lab.internal' {HOST_WORDS}", host=b"lab.internal")
    reached(host=b"lab.internal", allowed=frozenset({"lab.internal"}))
    reached(host=b"anything.example", allowed=None)
    # the wildcard lets any Origin's host through too, but not a foreign Origin on it
    refused(f"cross-site request refused: Origin 'http://evil.example' {ORIGIN_WORDS}", method="POST",
            host=b"anything.example", allowed=None, headers={b"origin": b"http://evil.example"})


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_state_changing_methods_from_another_site_are_refused(method: str) -> None:
    refused(f"cross-site request refused: Origin 'http://evil.example' {ORIGIN_WORDS}", method=method,
            headers={b"origin": b"http://evil.example"})


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS"])
def test_reads_from_another_site_pass(method: str) -> None:
    reached(method=method, headers={b"origin": b"http://evil.example", b"content-type": b"text/plain"})


@pytest.mark.parametrize(("origin", "host", "scheme"), [
    (b"http://127.0.0.1:8000", b"127.0.0.1:8000", "http"),
    (b"http://localhost", b"localhost", "http"),  # no port on either side: 80
    (b"http://localhost:80", b"localhost", "http"),
    (b"http://localhost", b"localhost:80", "http"),
    (b"https://localhost", b"localhost", "https"),  # 443
    (b"https://localhost:443", b"localhost", "https"),
    (b"http://localhost.:8000", b"localhost:8000", "http"),  # a trailing dot is the same name
    (b"http://localhost:8000", b"localhost.:8000", "http"),
    (b"http://127.0.0.1:8000", b"127.0.0.1:8000", None),  # a server that sends no scheme: http
])
def test_the_servers_own_origin_passes(origin: bytes, host: bytes, scheme: str | None) -> None:
    reached(method="POST", host=host, scheme=scheme,
            headers={b"origin": origin, b"content-type": b"multipart/form-data; boundary=x"})


@pytest.mark.parametrize(("origin", "host", "scheme"), [
    ("http://evil.example:8000", b"127.0.0.1:8000", "http"),  # another name
    ("http://127.0.0.1:9999", b"127.0.0.1:8000", "http"),  # another port
    ("http://127.0.0.1", b"127.0.0.1:8000", "http"),
    ("http://localhost:8080", b"localhost", "http"),
    ("https://127.0.0.1:8000", b"127.0.0.1:8000", "http"),  # another scheme, same port
    ("http://localhost:443", b"localhost", "https"),
    ("http://localhost", b"localhost", "https"),
    ("null", b"127.0.0.1:8000", "http"),  # sandboxed frames, file:// pages
    ("http://127.0.0.1:99999", b"127.0.0.1:8000", "http"),  # a port that is no port
    ("http:///x", b"127.0.0.1:8000", "http"),  # no name
    ("ftp://localhost", b"localhost:0", "http"),  # a scheme this server does not speak, ports alike
    ("x" * 150, b"127.0.0.1:8000", "http"),
])
def test_any_other_origin_is_refused_in_words(origin: str, host: bytes, scheme: str) -> None:
    refused(f"cross-site request refused: Origin {origin[:100]!r} {ORIGIN_WORDS}", method="POST", host=host,
            scheme=scheme, headers={b"origin": origin.encode(), b"content-type": b"application/json"})


@pytest.mark.parametrize(("headers", "kind"), [
    ({b"content-type": b"multipart/form-data; boundary=x", b"content-length": b"10"}, "multipart/form-data"),
    ({b"content-type": b"application/x-www-form-urlencoded"}, "application/x-www-form-urlencoded"),
    ({b"content-type": b" Text/Plain ; charset=utf-8"}, "text/plain"),
    ({b"content-length": b"5"}, "body"),  # no Content-Type but a body
    ({b"transfer-encoding": b"chunked"}, "body"),
])
def test_a_body_a_form_can_send_without_an_origin_is_refused(headers: dict[bytes, bytes], kind: str) -> None:
    refused(f"a {kind} {NO_ORIGIN_WORDS}", method="POST", headers=headers)


@pytest.mark.parametrize("headers", [
    {b"content-type": b"application/json", b"content-length": b"20"},  # needs a preflight: never granted
    {b"content-length": b"0"},  # curl -X DELETE
    {},
    {b"content-type": b"application/json; charset=utf-8", b"transfer-encoding": b"chunked"},
])
def test_what_a_cross_site_page_cannot_send_passes_without_an_origin(headers: dict[bytes, bytes]) -> None:
    reached(method="POST", headers=headers)
    reached(method="DELETE", headers=headers)


def test_headers_other_than_the_five_read_change_nothing() -> None:
    reached(method="POST", headers={b"content-type": b"application/json", b"x-origin": b"http://evil.example",
                                    b"referer": b"http://evil.example/"})


def test_without_a_host_header_nothing_passes_even_with_the_wildcard() -> None:
    # `*` lets any name through, but the Origin check compares against the Host: none, no request
    refused(f"host '' {HOST_WORDS}", host=None, allowed=None)
    reached(host=b"anything.example", allowed=None)


def test_an_empty_listen_host_is_a_wildcard_bind_and_adds_no_name() -> None:
    from layerbank.app.api.origin import allowed_host_names

    assert allowed_host_names("", "") == frozenset()
    assert allowed_host_names(" [::] ", " Box.Example. ,, [FD00::1]") == {"box.example", "fd00::1"}

"""The Host and cross-site guard (app/api/origin.py) on its own, request by request:
which requests reach the app and which get the 403, with the exact status, headers
and words a refused client sees. The cross-site cases start with Go 1.25's own
table for ``net/http.CrossOriginProtection`` (src/net/http/csrf_test.go,
TestCrossOriginProtectionSecFetchSite), the algorithm the guard follows. A bare ASGI app behind the guard, no model, so the
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
WHY = ("is refused: a server without an API key takes changes only from its own pages and from clients "
       "that are not browsers (curl, the Python client)")


def origin_words(origin: str, host: str = "127.0.0.1:8000") -> str:
    return f"a cross-site request (Origin {origin[:100]!r} is not this server, Host {host!r}) {WHY}"


def site_words(site: str) -> str:
    return f"a cross-site request (Sec-Fetch-Site: {site}) {WHY}"


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
    # the wildcard lets any Host through, but not a foreign Origin on it
    refused(origin_words("http://evil.example", "anything.example"), method="POST",
            host=b"anything.example", allowed=None, headers={b"origin": b"http://evil.example"})


# Go's TestCrossOriginProtectionSecFetchSite, row for row (its request goes to
# https://example.com/, so Host example.com and an https scheme here)
GO_TABLE = [
    ("same-origin allowed", "POST", "same-origin", "", 200),
    ("none allowed", "POST", "none", "", 200),
    ("cross-site blocked", "POST", "cross-site", "", 403),
    ("same-site blocked", "POST", "same-site", "", 403),
    ("no header with no origin", "POST", "", "", 200),
    ("no header with matching origin", "POST", "", "https://example.com", 200),
    ("no header with mismatched origin", "POST", "", "https://attacker.example", 403),
    ("no header with null origin", "POST", "", "null", 403),
    ("GET allowed", "GET", "cross-site", "", 200),
    ("HEAD allowed", "HEAD", "cross-site", "", 200),
    ("OPTIONS allowed", "OPTIONS", "cross-site", "", 200),
    ("PUT blocked", "PUT", "cross-site", "", 403),
]


@pytest.mark.parametrize(("name", "method", "site", "origin", "status"), GO_TABLE, ids=[r[0] for r in GO_TABLE])
def test_gos_cross_origin_protection_table(name: str, method: str, site: str, origin: str, status: int) -> None:
    headers = {b"sec-fetch-site": site.encode()} if site else {}
    if origin:
        headers[b"origin"] = origin.encode()
    kw: dict[str, Any] = {"method": method, "host": b"example.com", "scheme": "https",
                          "allowed": frozenset({"example.com"}), "headers": headers}
    if status == 200:
        reached(**kw)
    elif site:
        refused(site_words(site), **kw)
    else:
        refused(origin_words(origin, "example.com"), **kw)


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_state_changing_methods_from_another_site_are_refused(method: str) -> None:
    refused(origin_words("http://evil.example"), method=method, headers={b"origin": b"http://evil.example"})
    refused(site_words("cross-site"), method=method, headers={b"sec-fetch-site": b"cross-site"})


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS"])
def test_reads_from_another_site_pass(method: str) -> None:
    reached(method=method, headers={b"origin": b"http://evil.example", b"sec-fetch-site": b"cross-site",
                                    b"content-type": b"text/plain"})


def test_sec_fetch_site_decides_before_origin() -> None:
    # a modern browser on the server's own page: same-origin, whatever Origin says
    reached(method="POST", headers={b"sec-fetch-site": b"same-origin", b"origin": b"http://evil.example"})
    # ... and a cross-site one is refused even with the server's own Origin
    refused(site_words("cross-site"), method="POST",
            headers={b"sec-fetch-site": b"cross-site", b"origin": b"http://127.0.0.1:8000"})
    # another port on the same host is same-site for a browser: refused
    refused(site_words("same-site"), method="POST", headers={b"sec-fetch-site": b"Same-Site"})
    refused(site_words("something-new"), method="POST", headers={b"sec-fetch-site": b"something-new"})
    # an empty header is no header (Go's Header.Get): Origin decides
    reached(method="POST", headers={b"sec-fetch-site": b"", b"origin": b"http://127.0.0.1:8000"})
    refused(origin_words("http://evil.example"), method="POST",
            headers={b"sec-fetch-site": b" ", b"origin": b"http://evil.example"})


@pytest.mark.parametrize("headers", [
    {b"content-type": b"multipart/form-data; boundary=x", b"content-length": b"10"},  # curl -F
    {b"content-type": b"application/x-www-form-urlencoded"},  # curl -d
    {b"content-type": b"text/plain"},
    {b"content-length": b"5"},  # a body, no Content-Type
    {b"content-type": b"application/json", b"content-length": b"20"},  # httpie, requests
    {b"content-length": b"0"},  # curl -X DELETE
    {},
])
def test_clients_that_are_not_browsers_pass_whatever_the_body(headers: dict[bytes, bytes]) -> None:
    reached(method="POST", headers=headers)
    reached(method="DELETE", headers=headers)


@pytest.mark.parametrize(("origin", "host", "scheme"), [
    (b"http://127.0.0.1:8000", b"127.0.0.1:8000", "http"),
    (b"http://localhost", b"localhost", "http"),  # no port on either side: 80
    (b"http://localhost:80", b"localhost", "http"),
    (b"http://localhost", b"localhost:80", "http"),
    (b"https://localhost", b"localhost", "https"),  # 443
    (b"https://localhost:443", b"localhost", "https"),
    (b"https://localhost", b"localhost", "http"),  # TLS ended at a proxy: Go compares no scheme either
    (b"http://LocalHost:8000", b"localhost:8000", "http"),  # names are case-blind
    (b"http://localhost.:8000", b"localhost:8000", "http"),  # a trailing dot is the same name
    (b"http://localhost:8000", b"localhost.:8000", "http"),
    (b"http://[::1]:8000", b"[::1]:8000", "http"),
    (b"http://127.0.0.1:8000", b"127.0.0.1:8000", None),  # a server that sends no scheme
])
def test_an_origin_naming_the_host_passes(origin: bytes, host: bytes, scheme: str | None) -> None:
    reached(method="POST", host=host, scheme=scheme,
            headers={b"origin": origin, b"content-type": b"multipart/form-data; boundary=x"})


@pytest.mark.parametrize(("origin", "host"), [
    ("http://evil.example:8000", "127.0.0.1:8000"),  # another name
    ("http://127.0.0.1:9999", "127.0.0.1:8000"),  # another port
    ("http://127.0.0.1", "127.0.0.1:8000"),
    ("http://localhost:8000", "127.0.0.1:8000"),  # another name for the same machine: another origin
    ("http://localhost:8080", "localhost"),
    ("http://localhost:443", "localhost"),
    ("https://localhost", "localhost:80"),
    ("null", "127.0.0.1:8000"),  # sandboxed frames, file:// pages
    ("http://127.0.0.1:99999", "127.0.0.1:8000"),  # a port that is no port
    ("http:///x", "127.0.0.1:8000"),  # no name
    ("ftp://localhost", "localhost:0"),  # a scheme a browser page cannot have here
    ("127.0.0.1:8000", "127.0.0.1:8000"),  # no scheme
    ("x" * 150, "127.0.0.1:8000"),
])
def test_any_other_origin_is_refused_in_words(origin: str, host: str) -> None:
    refused(origin_words(origin, host), method="POST", host=host.encode(),
            headers={b"origin": origin.encode(), b"content-type": b"application/json"})


def test_headers_other_than_the_three_read_change_nothing() -> None:
    reached(method="POST", headers={b"content-type": b"multipart/form-data; boundary=x",
                                    b"x-origin": b"http://evil.example", b"referer": b"http://evil.example/",
                                    b"sec-fetch-mode": b"no-cors"})


def test_without_a_host_header_nothing_passes_even_with_the_wildcard() -> None:
    # `*` lets any name through, but the Origin check compares against the Host: none, no request
    refused(f"host '' {HOST_WORDS}", host=None, allowed=None)
    reached(host=b"anything.example", allowed=None)


def test_an_empty_listen_host_is_a_wildcard_bind_and_adds_no_name() -> None:
    from layerbank.app.api.origin import allowed_host_names

    assert allowed_host_names("", "") == frozenset()
    assert allowed_host_names(" [::] ", " Box.Example. ,, [FD00::1]") == {"box.example", "fd00::1"}

"""Host and cross-site checks: a keyless server can't be driven from another web site.

A server without an API key trusts whoever can reach it. On loopback that is
the user, but also every web page the user's browser opens: a page on
``evil.example`` can POST a multipart form to ``http://127.0.0.1:8000`` (a
"simple" request, no CORS preflight), and with DNS rebinding (its own name
re-pointed at 127.0.0.1) it can even read the answers. Two checks close this,
only when no key is set (a key already stops both: a browser never sends it
on its own):

- **Host**: the request's ``Host`` must be one of the server's own names:
  loopback names (``localhost``, ``*.localhost``, ``127.0.0.0/8``, ``::1``),
  the ``--host`` it listens on, and ``--allowed-hosts`` (comma-separated;
  ``*`` turns the check off). DNS rebinding sends the attacker's name: 403.
  ``/health`` is exempt (it says nothing, and load balancers probe it by IP).
- **Cross-site**, on state-changing methods (POST, PUT, PATCH, DELETE; GET,
  HEAD and OPTIONS always pass), decided from the signals browsers send, as
  Go 1.25's ``net/http.CrossOriginProtection`` does (its test table is in
  tests/unit/app/test_origin_guard_asgi.py):

  1. ``Sec-Fetch-Site`` (every browser since 2023): ``same-origin`` or
     ``none`` (the user typed it) pass; anything else (``cross-site``,
     ``same-site``: another port or subdomain) is 403.
  2. Without it, no ``Origin`` either: not a browser (curl, httpie,
     requests, the Python client): passes, whatever the body.
  3. An ``Origin`` whose host[:port] is the request's ``Host`` passes (an
     old browser on the server's own page); any other, ``null`` included,
     is 403. Like Go, the scheme is not compared (``Host`` has none, and a
     TLS-terminating proxy changes it); a missing port is the default of
     the Origin's scheme on both sides.

The lab page is same-origin: the browser sends ``Sec-Fetch-Site: same-origin``.
"""

from __future__ import annotations

import ipaddress
import json
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from layerbank.app.api.errors import body_for

__all__ = ["OriginGuard", "allowed_host_names", "is_loopback_name"]

_UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_SAME = frozenset({"same-origin", "none"})  # Sec-Fetch-Site values of the server's own pages / the user
_READ = (b"host", b"origin", b"sec-fetch-site")
_NAMES = tuple(n.decode() for n in _READ)
_DEFAULT_PORTS = {"http": 80, "https": 443}
_WILDCARD_BINDS = {"0.0.0.0", "::", ""}
_WHY = ("a server without an API key takes changes only from its own pages and from clients that are "
        "not browsers (curl, the Python client)")


def is_loopback_name(name: str) -> bool:
    """``localhost``, ``*.localhost`` (RFC 6761), or a loopback address."""
    name = name.lower().rstrip(".").strip("[]")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def allowed_host_names(listen_host: str, extra: str) -> frozenset[str] | None:
    """The names a keyless server answers to besides loopback ones; None = any (``*``)."""
    names = {n.strip().lower().rstrip(".").strip("[]") for n in extra.split(",") if n.strip()}
    if "*" in names:
        return None
    bind = listen_host.strip().lower().strip("[]")
    if bind not in _WILDCARD_BINDS:
        names.add(bind)
    return frozenset(names)


def _split_host(value: str, default_port: int) -> tuple[str, int] | None:
    """``host[:port]`` or ``[v6][:port]`` -> (lowercase host, port); None if malformed."""
    try:
        parts = urlsplit("//" + value)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host:
        return None
    return host.rstrip("."), default_port if port is None else port


class OriginGuard:
    """403 ``forbidden`` for foreign Host names and cross-site state-changing requests."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str] | None) -> None:
        self.app = app
        self.allowed = allowed
        self._seen: dict[tuple[str, ...], str | None] = {}  # decisions by the values they read

    def _host_ok(self, host: str) -> bool:
        return self.allowed is None or is_loopback_name(host) or host in self.allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/health":
            await self.app(scope, receive, send)
            return
        headers = {k.decode(): v.decode("latin-1") for k, v in scope["headers"] if k in _READ}
        # _check reads only these: a client's repeated requests are decided once (bounded)
        seen = (scope.get("scheme", "http"), scope["method"], *(headers.get(n, "") for n in _NAMES))
        if seen in self._seen:
            problem = self._seen[seen]
        else:
            problem = self._check(scope, headers)
            if len(self._seen) >= 1024:
                self._seen.clear()
            self._seen[seen] = problem
        if problem:
            body = json.dumps(body_for(scope["path"], 403, problem, "forbidden")).encode()
            await send({"type": "http.response.start", "status": 403,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    def _check(self, scope: Scope, h: dict[str, str]) -> str | None:
        raw_host = h.get("host", "")
        default_port = _DEFAULT_PORTS.get(scope.get("scheme", "http"), 80)
        host = _split_host(raw_host, default_port)
        if host is None or not self._host_ok(host[0]):
            return (f"host {raw_host[:100]!r} is not one of this server's names; a server without an API key "
                    "answers only to its own (loopback names, --host, --allowed-hosts)")
        if scope["method"] not in _UNSAFE:
            return None
        site = h.get("sec-fetch-site", "").strip().lower()
        if site:  # the browser says where the request comes from: believe it
            if site in _SAME:
                return None
            return f"a cross-site request (Sec-Fetch-Site: {site[:40]}) is refused: {_WHY}"
        origin = h.get("origin", "")
        if not origin:  # neither header: not a browser
            return None
        if _same_host(origin, raw_host):
            return None
        return (f"a cross-site request (Origin {origin[:100]!r} is not this server, "
                f"Host {raw_host[:100]!r}) is refused: {_WHY}")


def _same_host(origin: str, raw_host: str) -> bool:
    """Origin's host[:port] is the Host (case and a trailing dot aside, a missing port
    being the default of the Origin's scheme on both sides); ``null`` or malformed: no."""
    try:
        o = urlsplit(origin)
        o_host, o_port = o.hostname, o.port
    except ValueError:
        return False
    if not o_host or o.scheme not in _DEFAULT_PORTS:
        return False
    default = _DEFAULT_PORTS[o.scheme]
    return (o_host.rstrip("."), default if o_port is None else o_port) == _split_host(raw_host, default)

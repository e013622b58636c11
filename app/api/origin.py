"""Host and Origin checks: a keyless server can't be driven from another web site.

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
- **Origin**, on state-changing methods (POST, PUT, PATCH, DELETE): an
  ``Origin`` that is not this server's own (scheme, host and port of the
  ``Host`` it was sent to; ``null`` included) is a cross-site browser
  request: 403. Without an ``Origin``, a body a browser form can send
  without preflight (form-urlencoded, multipart, text/plain, or no
  Content-Type at all) is refused as well; JSON bodies pass (a cross-site
  page cannot send them without a preflight, which this server never
  grants). Non-browser clients uploading files send their own ``Origin``
  (the Python client does; ``curl -H "Origin: http://127.0.0.1:8000"``).

The lab page is same-origin: the browser sends the server's own ``Origin``.
"""

from __future__ import annotations

import ipaddress
import json
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from layerbank.app.api.errors import body_for

__all__ = ["OriginGuard", "allowed_host_names", "is_loopback_name"]

_UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# bodies a page on any site can send with a plain <form> or fetch(no-cors), no preflight
_SIMPLE_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data", "text/plain")
_DEFAULT_PORTS = {"http": 80, "https": 443}
_WILDCARD_BINDS = {"0.0.0.0", "::", ""}


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

    def _host_ok(self, host: str) -> bool:
        return self.allowed is None or is_loopback_name(host) or host in self.allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/health":
            await self.app(scope, receive, send)
            return
        headers = {k: v for k, v in scope["headers"] if k in (b"host", b"origin", b"content-type",
                                                                b"content-length", b"transfer-encoding")}
        problem = self._check(scope, {k.decode(): v.decode("latin-1") for k, v in headers.items()})
        if problem:
            body = json.dumps(body_for(scope["path"], 403, problem, "forbidden")).encode()
            await send({"type": "http.response.start", "status": 403,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    def _check(self, scope: Scope, h: dict[str, str]) -> str | None:
        scheme = scope.get("scheme", "http")
        default_port = _DEFAULT_PORTS.get(scheme, 80)
        host = _split_host(h.get("host", ""), default_port)
        if host is None or not self._host_ok(host[0]):
            shown = h.get("host", "")[:100]
            return (f"host {shown!r} is not one of this server's names; a server without an API key "
                    "answers only to its own (loopback names, --host, --allowed-hosts)")
        if scope["method"] not in _UNSAFE:
            return None
        origin = h.get("origin")
        if origin is not None:
            o = urlsplit(origin) if origin != "null" else None
            try:
                o_port = None if o is None else (o.port or _DEFAULT_PORTS.get(o.scheme, 0))
            except ValueError:
                o_port = None
            if o is None or (o.hostname or "").rstrip(".") != host[0] or o_port != host[1] \
                    or o.scheme != scheme:
                return (f"cross-site request refused: Origin {origin[:100]!r} is not this server; "
                        "a server without an API key only takes changes from its own pages")
            return None
        ctype = h.get("content-type", "").split(";", 1)[0].strip().lower()
        has_body = h.get("content-length", "0") != "0" or "transfer-encoding" in h
        if ctype in _SIMPLE_TYPES or (not ctype and has_body):
            return (f"a {ctype or 'body'} post without an Origin header could come from any web page; "
                    "send 'Origin: <this server's URL>' (the Python client does) or use an API key")
        return None

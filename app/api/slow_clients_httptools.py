"""The slow-client deadlines of app/api/slow_clients.py on uvicorn's httptools protocol.

Why a second protocol: h11 parses HTTP in Python, httptools in C. A bare
FastAPI route on loopback answered about 2.3x fewer requests per second on
h11 than on httptools (bench/serve.py --floor --httptools-floor, 16
clients), so a cached read, a few tens of microseconds of layerbank's own
work, was bounded by the parser. ``GuardedHttpToolsProtocol`` keeps the same
two deadlines with the same timer code as GuardedH11Protocol (app/api/deadlines.py;
kept in a module of its own: slow_clients picks this one, and imports must not go in a circle): headers within ``header_timeout_s`` of the connection's
start and of each kept-alive response, the body within ``body_timeout_s`` of
its headers. ``slow_clients.guarded_protocol`` picks it where httptools is
installed (``uvicorn[standard]``), h11 otherwise.

Example::

    proto = guarded_httptools(10.0, 60.0)   # a class for uvicorn.Config(http=proto)
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from layerbank.app.api.deadlines import Deadlines

__all__ = ["GuardedHttpToolsProtocol", "guarded_httptools"]

class GuardedHttpToolsProtocol(Deadlines, HttpToolsProtocol):
    """uvicorn's httptools protocol with the header and body deadlines."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # TCP: a Transport
        super().connection_made(transport)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(self.body_timeout_s, "its request's body")  # disarmed when the body is complete

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()


def guarded_httptools(header_timeout_s: float, body_timeout_s: float) -> type[GuardedHttpToolsProtocol]:
    """The protocol class with these deadlines (uvicorn takes a class, not an instance)."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,),
                {"header_timeout_s": float(header_timeout_s), "body_timeout_s": float(body_timeout_s)})

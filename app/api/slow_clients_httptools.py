"""The slow-client deadlines of app/api/slow_clients.py on uvicorn's httptools protocol.

Why a second protocol: h11 parses HTTP in Python, httptools in C. A bare
FastAPI route on loopback answered about 2.3x fewer requests per second on
h11 than on httptools (bench/serve.py --floor --httptools-floor, 16
clients), so a cached read, a few tens of microseconds of layerbank's own
work, was bounded by the parser. ``GuardedHttpToolsProtocol`` keeps the same
two deadlines with the same timer code as GuardedH11Protocol (kept apart: that
module picks this one, and imports must not go in a circle): headers within ``header_timeout_s`` of the connection's
start and of each kept-alive response, the body within ``body_timeout_s`` of
its headers. ``slow_clients.guarded_protocol`` picks it where httptools is
installed (``uvicorn[standard]``), h11 otherwise.

Example::

    proto = guarded_httptools(10.0, 60.0)   # a class for uvicorn.Config(http=proto)
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["GuardedHttpToolsProtocol", "guarded_httptools"]

log = logging.getLogger("layerbank.api")


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the header and body deadlines."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # TCP: a Transport
        super().connection_made(transport)
        self._guard: asyncio.TimerHandle | None = None
        self._arm(self.header_timeout_s, "its request's headers")

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        if seconds > 0:
            self._guard = self.loop.call_later(seconds, self._cut, what, seconds)

    def _disarm(self) -> None:
        guard = getattr(self, "_guard", None)
        if guard is not None:
            guard.cancel()
            self._guard = None

    def _cut(self, what: str, seconds: float) -> None:
        self._guard = None
        if self.transport.is_closing():
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        log.info("closed the connection of %s: %s did not arrive within %.0f s", client, what, seconds)
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the route's receive() says http.disconnect
            self.cycle.message_event.set()
        self.transport.close()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(self.body_timeout_s, "its request's body")  # disarmed when the body is complete

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():  # kept alive: the next request's headers have a deadline too
            self._arm(self.header_timeout_s, "its next request's headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def guarded_httptools(header_timeout_s: float, body_timeout_s: float) -> type[GuardedHttpToolsProtocol]:
    """The protocol class with these deadlines (uvicorn takes a class, not an instance)."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,),
                {"header_timeout_s": float(header_timeout_s), "body_timeout_s": float(body_timeout_s)})

"""The header and body deadlines shared by both uvicorn protocols layerbank serves on.

Why a mixin: app/api/slow_clients.py (h11) and slow_clients_httptools.py (httptools)
differ only in where a request's headers and body are known to be complete; the
timer that cuts a slow client, its log line and the keep-alive re-arm are one
mechanism, kept here once. Mixed in before uvicorn's protocol class, so its
``super()`` calls reach uvicorn's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

__all__ = ["Deadlines"]

log = logging.getLogger("layerbank.api")


class Deadlines:
    """Headers within ``header_timeout_s`` of the connection's start and of each
    kept-alive response; the body within ``body_timeout_s`` of its headers."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    # set by uvicorn's protocol classes, which this is mixed into
    loop: Any
    transport: Any
    client: Any
    cycle: Any

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]  # uvicorn's protocol, after this in the MRO
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

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]  # uvicorn's protocol
        if not self.transport.is_closing():  # kept alive: the next request's headers have a deadline too
            self._arm(self.header_timeout_s, "its next request's headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]  # uvicorn's protocol

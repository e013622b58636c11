"""Slow clients are cut: a deadline for a request's headers and one for its body.

uvicorn (0.54, h11) has a keep-alive timeout for idle connections but none for
a request that arrives slowly: 500 connections trickling header bytes for 60 s
were all kept open (issue 25), each holding a socket and buffers, and the API
key is checked only once the headers are complete, so anyone could do it.
``GuardedH11Protocol`` is uvicorn's own h11 protocol with two timers:

- headers: from the connection's start, and again from the end of each
  response on a kept-alive connection, the next request's headers must be
  complete within ``header_timeout_s`` (default 10 s), or the connection is
  closed without an answer;
- body: once the headers are in, the whole body must arrive within
  ``body_timeout_s`` (default 60 s: 32 MiB, the largest body allowed, at about
  4 Mbit/s), or the connection is closed; the route sees a client disconnect,
  which app/api/errors.py logs as one INFO line.

Both are settings (``header_timeout_s``, ``body_timeout_s``; env
``LAYERBANK_HEADER_TIMEOUT_S``, ``LAYERBANK_BODY_TIMEOUT_S``). ``server_config``
builds the uvicorn config ``layerbank serve`` runs, with them and the idle
keep-alive timeout (``keep_alive_s``, default 5 s).

Example::

    server = uvicorn.Server(server_config(app, settings, log_level="info"))
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from layerbank.app.api.deadlines import Deadlines

__all__ = ["GuardedH11Protocol", "guarded_protocol", "server_config"]

class GuardedH11Protocol(Deadlines, H11Protocol):
    """uvicorn's h11 protocol with a header deadline and a body deadline (module docstring)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # TCP: a Transport
        self._guarded_cycle: Any = None
        super().connection_made(transport)

    def handle_events(self) -> None:
        super().handle_events()
        cycle = self.cycle
        if cycle is not None and cycle is not self._guarded_cycle:  # a request's headers are in
            self._guarded_cycle = cycle
            if cycle.more_body:
                self._arm(self.body_timeout_s, "its request's body")
            else:
                self._disarm()
        elif cycle is not None and not cycle.more_body and self._guard is not None \
                and not cycle.response_complete:
            self._disarm()  # the body is complete


def guarded_protocol(header_timeout_s: float, body_timeout_s: float) -> type[Any]:
    """The protocol class with these deadlines (uvicorn takes a class, not an instance): on
    httptools where it is installed (app/api/slow_clients_httptools.py: ~2.3x h11's requests/s)."""
    try:
        from layerbank.app.api.slow_clients_httptools import guarded_httptools
    except ImportError:  # uvicorn without httptools: h11
        pass
    else:
        return guarded_httptools(header_timeout_s, body_timeout_s)
    return type("GuardedH11Protocol", (GuardedH11Protocol,),
                {"header_timeout_s": float(header_timeout_s), "body_timeout_s": float(body_timeout_s)})


def server_config(app: Any, settings: Any, **kwargs: Any) -> Any:
    """The uvicorn config ``layerbank serve`` runs ``app`` with: the deadlines above, the idle
    keep-alive timeout, and ``kwargs`` (log_level, fd, ...)."""
    import uvicorn

    return uvicorn.Config(app, http=guarded_protocol(settings.header_timeout_s, settings.body_timeout_s),
                          timeout_keep_alive=int(settings.keep_alive_s), **kwargs)

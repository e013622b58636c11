"""Cached reads answered before routing: the hot path of ``/v1/features`` and ``/v1/embeddings``.

A cached one-text read is a few microseconds of work (hash the text, look the
row up in memory, join ready bytes), but FastAPI's routing, dependency
injection and body handling cost several times that (issue 28: 4-5x a bare
route of the same framework). This innermost middleware runs after every
guard (Host/Origin, API key, body size: they are outside it) and hands the
body to the route module's ``cached_answer``, which answers only when every
text's bytes are in the row cache (app/api/rowcache.py) and the request
passes the route's own checks; the bytes are those the route would send
(tests/unit/app/test_fast_reads.py). Anything else (a miss, a bad request,
another content type) goes on to the route with its body replayed, so
errors keep their shapes.

Example::

    app.add_middleware(CachedReads, answers={"/v1/features": features.cached_answer})
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CachedReads"]

Answer = Callable[[Any, bytes], "bytes | None"]
_JSON = [(b"content-type", b"application/json")]


def _is_json(scope: Scope) -> bool:
    """The route's own test (features.require_json): a JSON media type, else its 415."""
    for k, v in scope["headers"]:
        if k == b"content-type":
            main = v.split(b";")[0].strip().lower()
            return main == b"application/json" or main.endswith(b"+json")
    return False


class CachedReads:
    """POSTs to the paths of ``answers``: answered from memory when ``answers[path](state,
    body)`` gives bytes; passed on (body replayed) when it gives None."""

    def __init__(self, app: ASGIApp, answers: Mapping[str, Answer], routes: dict[str, Any] | None = None) -> None:
        self.app = app
        self.answers = answers
        self.routes = routes or {}  # path -> its route, for the request timer's label
        self.enabled = True  # tests switch it off to compare with the route's own answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = self.answers.get(scope["path"]) if scope["type"] == "http" else None
        state = getattr(scope["app"].state, "layerbank", None) if answer is not None else None
        if (answer is None or state is None or not self.enabled or scope["method"] != "POST"
                or not _is_json(scope)):
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        body = b""
        while True:
            msg = await receive()
            messages.append(msg)
            if msg["type"] != "http.request":
                break  # a disconnect (or a body over the limit): the route sees it
            body += msg.get("body", b"")
            if not msg.get("more_body", False):
                break
        out = None
        if msg["type"] == "http.request":
            try:
                out = answer(state, body)
            except Exception:  # noqa: BLE001  (the route meets the same problem and shapes its error)
                out = None
        if out is not None:
            if scope["path"] in self.routes:
                scope["route"] = self.routes[scope["path"]]
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", b"%d" % len(out))] + _JSON})
            await send({"type": "http.response.body", "body": out})
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

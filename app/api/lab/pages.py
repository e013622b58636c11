"""Serve the lab's page shell and its static files, and nothing else.

Every lab URL (``/``, ``/lab/datasets/{id}``, ``/lab/probes/{id}``, ...) gets
the same small HTML shell; its JavaScript reads the path and fetches what
the page shows from ``/v1`` with the user's key, like any other client.
The shell and the files under ``/lab/static/`` hold no data, so they are
answered before the API-key guard: a browser must be able to load the page
that asks for the key. Everything else (other methods, unknown files, the
whole API) passes through to the app untouched, errors in the API's shape.

Why an ASGI middleware and not a router: routers sit behind the key guard,
and a per-request string check costs nothing on the ``/v1`` hot paths.

The Content-Security-Policy allows only this origin (scripts, styles,
fetches, images), so a page that tried to load anything from another host
would be refused by the browser, and ``frame-ancestors 'none'`` keeps other
sites from framing it.
"""

from __future__ import annotations

import mimetypes
from importlib import resources
from pathlib import PurePosixPath

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["LAB_PAGES", "LabPages"]

# the first path segment after /lab/ of every page the shell renders
LAB_PAGES = ("datasets", "probes", "heads", "regimes", "compare")
_STATIC = "/lab/static/"
_CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'")
_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".html": "text/html; charset=utf-8", ".svg": "image/svg+xml"}


def _static_files() -> dict[str, bytes]:
    """Every file of static/, read once at start-up (a few tens of kB)."""
    root = resources.files("layerbank.app.api.lab") / "static"
    return {f.name: f.read_bytes() for f in root.iterdir() if f.is_file() and not f.name.startswith(".")}


def _is_page(path: str) -> bool:
    # plain string tests: every API request passes here (pathlib cost ~15 us, bench/lab_overhead.py)
    if path in ("/", "/lab", "/lab/"):
        return True
    if not path.startswith("/lab/"):
        return False
    parts = path[5:].split("/")  # "probes/abc" -> ["probes", "abc"]
    return len(parts) <= 2 and parts[0] in LAB_PAGES and all(parts)


class LabPages:
    """ASGI middleware: GET/HEAD of a lab page or static file is answered here."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.files = _static_files()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path.startswith(_STATIC) and path[len(_STATIC):] in self.files:
            name = path[len(_STATIC):]
            ctype = _TYPES.get(PurePosixPath(name).suffix) or mimetypes.guess_type(name)[0] or \
                "application/octet-stream"
            await _send(scope, send, self.files[name], ctype, page=False)
        elif _is_page(path):
            await _send(scope, send, self.files["index.html"], _TYPES[".html"], page=True)
        else:
            await self.app(scope, receive, send)


async def _send(scope: Scope, send: Send, body: bytes, ctype: str, page: bool) -> None:
    headers = [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode()),
               (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
               # the files change only with the package; a reload after an upgrade must see them
               (b"cache-control", b"no-cache")]
    if page:
        headers += [(b"content-security-policy", _CSP.encode()), (b"x-frame-options", b"DENY")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})

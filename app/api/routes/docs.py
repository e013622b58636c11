"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc), with every file they load
served by this server, so the API docs work on a machine with no internet.

FastAPI's own pages load their script and CSS from a CDN and their favicon
from fastapi.tiangolo.com: offline, a blank page. Here:

- Swagger UI (npm ``swagger-ui-dist``) and ReDoc's standalone bundle (npm
  ``redoc``) are vendored in ``app/api/docs_assets/`` (versions, sources,
  sha256 and licences in ``VENDORED.md`` there) and served under
  ``/docs/assets/`` and ``/redoc/assets/``. Not PyPI's ``swagger-ui-bundle``:
  its Swagger UI 4 cannot render FastAPI's OpenAPI 3.1 schema.
- ReDoc's Google Fonts link is turned off.
- Both pages carry a Content-Security-Policy that allows only this origin
  (plus inline script and style, which the pages are made of, and blob:
  workers, which ReDoc's search uses), so the browser refuses what the
  bundles might still fetch from elsewhere. ReDoc's "API docs by Redocly"
  footer loaded its logo from cdn.redoc.ly: the vendored bundle is patched
  to draw no logo (VENDORED.md), so the page asks no other host at all.
- Swagger UI's validator badge (an image from validator.swagger.io) is
  turned off.

The app is built with ``docs_url=None, redoc_url=None`` and includes this
router instead. Only the named files are served (no directory listing, no path joins from
the request). ``/`` is the lab's home (app/api/lab/pages.py), which links here.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import APIRouter
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, Response

from layerbank.app.api.errors import NotFound

__all__ = ["ASSETS", "router"]

router = APIRouter(include_in_schema=False)

_SWAGGER_FILES = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png")
_REDOC_FILES = ("redoc.standalone.js",)
# the URL of every file the two pages load, for the tests and for readers
ASSETS = tuple(f"/docs/assets/{n}" for n in _SWAGGER_FILES) + \
    tuple(f"/redoc/assets/{n}" for n in _REDOC_FILES)
_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".png": "image/png"}
_FAVICON = "/docs/assets/favicon-32x32.png"
_OPENAPI = "/openapi.json"  # FastAPI's default, which main.py keeps
_OAUTH2 = "/docs/oauth2-redirect"
_TITLE = "layerbank API"
_CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; "
        "object-src 'none'; base-uri 'none'; frame-ancestors 'none'")


def _page(html: HTMLResponse) -> HTMLResponse:
    html.headers["content-security-policy"] = _CSP
    return html


def _asset(folder: str, name: str, allowed: tuple[str, ...]) -> Response:
    if name not in allowed:
        raise NotFound(f"no docs asset {name!r}")
    body = (resources.files("layerbank.app.api") / "docs_assets" / folder / name).read_bytes()
    # the files change only with the package; a reload after an upgrade must see them
    return Response(body, media_type=_TYPES[Path(name).suffix], headers={"cache-control": "no-cache"})


@router.get("/docs/assets/{name}")
async def swagger_asset(name: str) -> Response:
    return _asset("swagger-ui", name, _SWAGGER_FILES)


@router.get("/redoc/assets/{name}")
async def redoc_asset(name: str) -> Response:
    return _asset("redoc", name, _REDOC_FILES)


@router.get("/docs")
async def swagger_ui() -> HTMLResponse:
    return _page(get_swagger_ui_html(openapi_url=_OPENAPI, title=_TITLE, swagger_js_url=ASSETS[0],
                                     swagger_css_url=ASSETS[1], swagger_favicon_url=_FAVICON,
                                     oauth2_redirect_url=_OAUTH2,
                                     swagger_ui_parameters={"validatorUrl": None}))


@router.get(_OAUTH2)
async def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc")
async def redoc() -> HTMLResponse:
    return _page(get_redoc_html(openapi_url=_OPENAPI, title=_TITLE, redoc_js_url=ASSETS[3],
                                redoc_favicon_url=_FAVICON, with_google_fonts=False))

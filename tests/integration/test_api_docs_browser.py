"""/docs and /redoc render in a real Chromium with every other host blocked.

The unit test (tests/unit/app/test_api_docs.py) checks the HTML names only the
server's URLs; this one checks that what those URLs serve actually draws the
API reference: a Swagger UI too old for OpenAPI 3.1 loaded fine and showed
"Unable to render this definition". Every request the page makes is recorded
(the page's own and its scripts', images and workers included) and none may
leave the server's origin; the console must stay free of errors, Content-
Security-Policy refusals included (ReDoc's footer logo from cdn.redoc.ly was
one: app/api/docs_assets/VENDORED.md). Real ``layerbank serve`` (the session's
shared server), Debian's Chromium driven by Playwright.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.integration.conftest import ServerProcess

pytestmark = pytest.mark.integration


def _offline_page(browser: Any, origin: str) -> tuple[Any, Any, list[str], list[str], list[str]]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    requested: list[str] = []
    foreign: list[str] = []
    errors: list[str] = []

    def own(url: str) -> bool:
        u = urlsplit(url)
        return u.scheme in ("data", "blob") or f"{u.scheme}://{u.netloc}" == origin

    def gate(route: Any) -> None:  # as on a machine with no internet: other hosts never answer
        if own(route.request.url):
            route.continue_()
        else:
            route.abort()

    ctx.route("**/*", gate)
    # every request, the ones the gate aborts and workers' included
    ctx.on("request", lambda r: (requested.append(r.url), own(r.url) or foreign.append(r.url)))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))  # CSP refusals count
    return ctx, page, requested, foreign, errors


@pytest.mark.parametrize("path,drawn", [
    ("/docs", ".opblock-summary-path[data-path='/v1/embeddings']"),
    ("/redoc", "text=OpenAI-compatible embeddings"),
])
def test_the_api_reference_draws_with_no_other_host(browser: Any, layerbank_server: ServerProcess,
                                                    path: str, drawn: str) -> None:
    origin = layerbank_server.url.rstrip("/")
    ctx, page, requested, foreign, errors = _offline_page(browser, origin)
    try:
        page.goto(origin + path)
        page.wait_for_selector(drawn, state="attached")
        page.wait_for_load_state("networkidle")
        assert page.locator("text=Unable to render this definition").count() == 0
        assert origin + "/openapi.json" in requested, requested  # the recording sees the page's requests
        assert foreign == [], foreign
        assert errors == [], errors
    finally:
        ctx.close()

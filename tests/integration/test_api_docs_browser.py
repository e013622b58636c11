"""/docs and /redoc render in a real Chromium with every other host blocked.

The unit test (tests/unit/app/test_api_docs.py) checks the HTML names only the
server's URLs; this one checks that what those URLs serve actually draws the
API reference: a Swagger UI too old for OpenAPI 3.1 loaded fine and showed
"Unable to render this definition". Real ``layerbank serve`` (the session's
shared server), Debian's Chromium driven by Playwright.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.integration.conftest import ServerProcess

pytestmark = pytest.mark.integration


def _offline_page(browser: Any, origin: str) -> tuple[Any, Any, list[str], list[str]]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    page.set_default_timeout(60_000)
    foreign: list[str] = []
    errors: list[str] = []

    def gate(route: Any) -> None:  # as on a machine with no internet: other hosts never answer
        u = urlsplit(route.request.url)
        if u.scheme in ("data", "blob") or f"{u.scheme}://{u.netloc}" == origin:
            route.continue_()
        else:
            foreign.append(route.request.url)
            route.abort()

    page.route("**/*", gate)
    page.on("pageerror", lambda e: errors.append(str(e)))
    # the pages' Content-Security-Policy refuses other hosts before a request leaves (ReDoc's
    # footer logo); those refusals are the policy working, every other console error counts
    page.on("console", lambda m: m.type == "error" and "Content Security Policy" not in m.text
            and errors.append(m.text))
    return ctx, page, foreign, errors


@pytest.mark.parametrize("path,drawn", [
    ("/docs", ".opblock-summary-path[data-path='/v1/embeddings']"),
    ("/redoc", "text=OpenAI-compatible embeddings"),
])
def test_the_api_reference_draws_with_no_other_host(browser: Any, layerbank_server: ServerProcess,
                                                    path: str, drawn: str) -> None:
    origin = layerbank_server.url.rstrip("/")
    ctx, page, foreign, errors = _offline_page(browser, origin)
    try:
        page.goto(origin + path)
        page.wait_for_selector(drawn, state="attached")
        assert page.locator("text=Unable to render this definition").count() == 0
        assert foreign == [], foreign
        assert errors == [], errors
    finally:
        ctx.close()

"""What a real browser sends, against a real keyless ``layerbank serve``: a page on
another site that posts a multipart form to the server (no preflight needed) is
refused with the 403 naming the browser's signal, and nothing is queued; the same
upload from the server's own page (as the lab makes it) is accepted. Debian's
Chromium under Playwright; the other site is ``http://evil.example``, whose page
Playwright serves itself, so to the browser it is another site in every respect.
(The request-by-request table is tests/unit/app/test_origin_guard_asgi.py.)
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.conftest import ServerProcess

pytestmark = pytest.mark.integration

EVIL = "http://evil.example"


def _form(action: str) -> str:
    return f"""<!doctype html><html><body>
<form id="f" method="post" enctype="multipart/form-data" action="{action}">
<input type="hidden" name="text_column" value="text"></form>
<script>
const dt = new DataTransfer();
dt.items.add(new File(["text\\nqueued by another site\\n"], "x.csv", {{type: "text/csv"}}));
const input = document.createElement("input");
input.type = "file"; input.name = "file"; input.files = dt.files;
document.getElementById("f").appendChild(input);
</script></body></html>"""


def test_a_cross_site_form_post_is_refused_and_the_own_page_is_not(browser: Any,
                                                                   layerbank_server: ServerProcess) -> None:
    origin = layerbank_server.url.rstrip("/")
    before = [d["id"] for d in layerbank_server.get("/v1/datasets").json()["data"]]
    ctx = browser.new_context()
    try:
        page = ctx.new_page()
        page.set_default_timeout(60_000)
        ctx.route(f"{EVIL}/**", lambda route: route.fulfill(status=200, content_type="text/html",
                                                           body=_form(f"{origin}/v1/datasets")))
        page.goto(f"{EVIL}/attack.html")
        with page.expect_response(f"{origin}/v1/datasets") as answer:
            page.evaluate("document.getElementById('f').submit()")
        r = answer.value
        sent = r.request.all_headers()
        assert sent.get("origin") == EVIL and "multipart/form-data" in sent.get("content-type", ""), sent
        assert r.status == 403, (r.status, r.text())
        # Chromium adds Sec-Fetch-Site below what Playwright reports (all_headers() lacks it); the
        # guard's answer names the header as it arrived
        assert r.json() == {"type": "forbidden", "error": (
            "a cross-site request (Sec-Fetch-Site: cross-site) is refused: a server without an API key "
            "takes changes only from its own pages and from clients that are not browsers (curl, the "
            "Python client)")}
        assert [d["id"] for d in layerbank_server.get("/v1/datasets").json()["data"]] == before

        # the same upload from the server's own page: what the lab's form does
        page.goto(f"{origin}/")
        status = page.evaluate("""async () => {
            const body = new FormData();
            body.append("file", new File(["text\\nuploaded by the server's own page\\n"], "own.csv"));
            body.append("text_column", "text");
            return (await fetch("/v1/datasets", {method: "POST", body})).status;
        }""")
        assert status == 202
    finally:
        ctx.close()

"""/docs and /redoc load nothing from another host: every URL in their HTML is
this server's own, and each of those answers 200 with the real file."""

from __future__ import annotations

import re
from pathlib import Path

from layerbank.app.api.routes.docs import ASSETS

_URL = re.compile(r"""https?://[^\s"'<>)]+""")
# what a page loads: src=, href=, url(...), and the JS calls FastAPI's HTML makes with a URL
_LOADS = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|(?:url|spec-url)\s*[:=(]\s*["']([^"']+)["']""")


def _loaded_urls(html: str) -> set[str]:
    return {a or b for a, b in _LOADS.findall(html)}


def test_docs_and_redoc_name_no_other_host_and_their_assets_answer(tiny_api_factory) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api_factory(worker=False).client
    seen: set[str] = set()
    for page in ("/docs", "/redoc"):
        r = c.get(page)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        # the browser itself refuses other hosts, should a bundle still name one
        csp = r.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "img-src 'self' data:" in csp and "https:" not in csp
        html = r.text
        assert _URL.findall(html) == [], (page, _URL.findall(html))  # no http:// or https:// at all
        loads = _loaded_urls(html)
        assert loads, page
        assert all(u.startswith("/") and not u.startswith("//") for u in loads), loads
        seen |= loads
    assert {"/openapi.json", *ASSETS} <= seen
    for url in ASSETS:
        r = c.get(url)
        assert r.status_code == 200, url
        assert r.headers["content-type"].split(";")[0] in ("text/javascript", "text/css", "image/png")
    # the bytes are the vendored files, whose sizes VENDORED.md states (ReDoc's patched: no CDN logo)
    vendored = Path(__file__).resolve().parents[3] / "app" / "api" / "docs_assets"
    for url, path, size in [("/docs/assets/swagger-ui-bundle.js", "swagger-ui/swagger-ui-bundle.js", 1_732_839),
                            ("/redoc/assets/redoc.standalone.js", "redoc/redoc.standalone.js", 1_103_360)]:
        body = c.get(url).content
        assert len(body) == size and body == (vendored / path).read_bytes()
    assert c.get("/openapi.json").status_code == 200


def test_only_the_named_assets_are_served(tiny_api_factory) -> None:  # type: ignore[no-untyped-def]
    c = tiny_api_factory(worker=False).client
    for url in ("/docs/assets/index.html", "/docs/assets/..%2F__init__.py", "/redoc/assets/LICENSE",
                "/redoc/assets/VENDORED.md"):
        r = c.get(url)
        assert r.status_code == 404, url
        assert r.json()["type"] == "not_found"


def test_home_is_a_page_not_a_404(tiny_api_factory) -> None:  # type: ignore[no-untyped-def]
    home = tiny_api_factory(worker=False).client.get("/", follow_redirects=True)  # the lab's home
    assert home.status_code == 200 and home.headers["content-type"].startswith("text/html")

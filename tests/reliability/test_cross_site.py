"""The report's attack on a real keyless ``layerbank serve``: a browser's cross-site
multipart upload (``Sec-Fetch-Site: cross-site``, or an old browser's foreign
Origin), a foreign Host, and DNS rebinding reads. All are 403 in the one error
shape and nothing is queued; the server's own pages and clients that are not
browsers (curl -F, httpie-style JSON) still work as they are."""

from __future__ import annotations

import shutil
import subprocess

import httpx
import pytest

from tests.integration.conftest import ServerProcess

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]


def test_a_web_page_cannot_drive_a_keyless_server(rel_server: ServerProcess) -> None:
    upload = {"files": {"file": ("x.csv", b"text\nqueued from another site\n", "text/csv")}}
    with httpx.Client(base_url=rel_server.url, timeout=30) as raw:  # no Origin of its own
        before = [d["id"] for d in raw.get("/v1/datasets").json()["data"]]
        r = raw.post("/v1/datasets", headers={"Origin": "http://evil.example", "Host": "attacker.example"},
                     **upload)
        assert r.status_code == 403 and r.json()["type"] == "forbidden", r.text
        assert "host 'attacker.example'" in r.json()["error"]
        r = raw.post("/v1/datasets", headers={"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
                     **upload)  # what Chromium sends for a <form> on evil.example
        assert r.status_code == 403 and "(Sec-Fetch-Site: cross-site)" in r.json()["error"], r.text
        r = raw.post("/v1/datasets", headers={"Origin": "http://evil.example"}, **upload)  # an old browser
        assert r.status_code == 403 and "Origin 'http://evil.example' is not this server" in r.json()["error"]
        r = raw.get("/v1/jobs", headers={"Host": "attacker.example"})  # DNS rebinding: reads too
        assert r.status_code == 403
        assert [d["id"] for d in raw.get("/v1/datasets").json()["data"]] == before  # nothing queued
        r = raw.post("/v1/datasets", headers={"Origin": rel_server.url, "Sec-Fetch-Site": "same-origin"},
                     **upload)  # the lab's own form
        assert r.status_code == 202, r.text
        r = raw.post("/v1/features", json={"texts": ["httpie-style JSON"]})  # no Origin: not a browser
        assert r.status_code == 200, r.text


def test_curl_uploads_a_file_as_it_is(rel_server: ServerProcess, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert shutil.which("curl"), "these tests need curl (scripts/test.sh installs it with apt)"
    csv = tmp_path / "reviews.csv"
    csv.write_text("text,label\ngood film,1\nbad film,0\n", encoding="utf-8")
    out = subprocess.run(["curl", "-sS", "-w", "\\n%{http_code}", "-F", f"file=@{csv}",
                          f"{rel_server.url}/v1/datasets"], capture_output=True, text=True, timeout=60, check=False)
    body, status = out.stdout.rsplit("\n", 1)
    assert status == "202", (status, body, out.stderr)
    assert '"id"' in body

"""The report's attack on a real keyless ``layerbank serve``: a cross-site multipart
upload with a foreign Origin and Host, and DNS rebinding reads. Both are 403 in
the one error shape and nothing is queued; the server's own Origin still works."""

from __future__ import annotations

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
        r = raw.post("/v1/datasets", headers={"Origin": "http://evil.example"}, **upload)
        assert r.status_code == 403 and "Origin 'http://evil.example' is not this server" in r.json()["error"]
        r = raw.get("/v1/jobs", headers={"Host": "attacker.example"})  # DNS rebinding: reads too
        assert r.status_code == 403
        assert [d["id"] for d in raw.get("/v1/datasets").json()["data"]] == before  # nothing queued
        r = raw.post("/v1/datasets", headers={"Origin": rel_server.url}, **upload)  # the lab's own form
        assert r.status_code == 202, r.text

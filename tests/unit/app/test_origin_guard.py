"""A keyless server refuses foreign Host names and cross-site state-changing requests
from browsers (app/api/origin.py) and lets curl, httpie and the Python client through;
with a key, API clients see no difference."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from layerbank.app.api.origin import allowed_host_names, is_loopback_name

UPLOAD = {"files": {"file": ("x.csv", b"text\nhello there\n", "text/csv")}}


def _raw(tiny_api, base: str = "http://127.0.0.1:8000") -> TestClient:  # type: ignore[no-untyped-def]
    """A second client on the same running app, sending no headers of its own."""
    return TestClient(tiny_api.client.app, base_url=base)


def _forbidden(r, says: str) -> None:  # type: ignore[no-untyped-def]
    assert r.status_code == 403, (r.status_code, r.text)
    body = r.json()
    assert body["type"] == "forbidden" and says in body["error"], body
    assert set(body) == {"error", "type"}


def test_the_cross_site_upload_of_the_report_is_refused(tiny_api) -> None:  # type: ignore[no-untyped-def]
    c = _raw(tiny_api)
    before = c.get("/v1/datasets").json()
    _forbidden(c.post("/v1/datasets", headers={"Origin": "http://evil.example",
                                               "Host": "attacker.example"}, **UPLOAD), "host 'attacker.example'")
    # the page's own name re-pointed at 127.0.0.1 (DNS rebinding) is refused on reads too
    _forbidden(c.get("/v1/datasets", headers={"Host": "attacker.example:8000"}), "not one of this server's names")
    # a browser's form post from another site: what every browser since 2023 sends
    browser = {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
    _forbidden(c.post("/v1/datasets", headers=browser, **UPLOAD), "a cross-site request (Sec-Fetch-Site: cross-site)")
    # another port on the same machine is same-site for the browser: refused too
    _forbidden(c.post("/v1/datasets", headers={"Origin": "http://127.0.0.1:9999", "Sec-Fetch-Site": "same-site"},
                      **UPLOAD), "(Sec-Fetch-Site: same-site)")
    # an older browser sends only Origin
    _forbidden(c.post("/v1/datasets", headers={"Origin": "http://evil.example"}, **UPLOAD),
               "Origin 'http://evil.example' is not this server")
    _forbidden(c.post("/v1/datasets", headers={"Origin": "null"}, **UPLOAD), "Origin 'null'")
    _forbidden(c.post("/v1/datasets", headers={"Origin": "http://127.0.0.1:9999"}, **UPLOAD), "not this server")
    _forbidden(c.delete("/v1/datasets/ds_x", headers={"Origin": "http://evil.example"}), "not this server")
    assert c.get("/v1/datasets").json() == before  # nothing was queued
    assert c.get("/health", headers={"Host": "10.1.2.3"}).status_code == 200  # probes by IP still work


def test_own_pages_and_api_clients_still_work(tiny_api) -> None:  # type: ignore[no-untyped-def]
    c = _raw(tiny_api)
    lab = {"Origin": "http://127.0.0.1:8000", "Sec-Fetch-Site": "same-origin"}
    r = c.post("/v1/datasets", headers=lab, **UPLOAD)  # the lab's upload form
    assert r.status_code == 202, r.text
    r = c.post("/v1/datasets", **UPLOAD)  # curl -F file=@x.csv: no Origin, no Sec-Fetch-Site
    assert r.status_code == 202, r.text
    assert c.post("/v1/features", json={"texts": ["httpie sends JSON, no Origin"]}).status_code == 200
    assert c.post("/v1/features", headers={"Origin": "http://127.0.0.1:8000"},  # an old browser on the lab
                  json={"texts": ["a"]}).status_code == 200
    assert c.delete(f"/v1/datasets/{r.json()['id']}").status_code == 200  # curl -X DELETE
    for base in ("http://localhost:8000", "http://[::1]:8000", "http://127.0.0.2", "http://app.localhost"):
        assert _raw(tiny_api, base).get("/v1/datasets").status_code == 200, base
    with_port = _raw(tiny_api, "http://localhost")
    assert with_port.post("/v1/datasets", headers={"Origin": "http://localhost:80"}, **UPLOAD).status_code == 202


def test_extra_names_and_the_wildcard(tiny_api_factory) -> None:  # type: ignore[no-untyped-def]
    api = tiny_api_factory(worker=False, allowed_hosts="lab.internal, Box.Example.")
    for name in ("lab.internal", "box.example", "BOX.example:8000"):
        assert _raw(api, f"http://{name}").get("/v1/datasets").status_code == 200, name
    _forbidden(_raw(api, "http://other.example").get("/v1/datasets"), "host 'other.example'")
    anyone = tiny_api_factory(worker=False, allowed_hosts="*")
    assert _raw(anyone, "http://other.example").get("/v1/datasets").status_code == 200


def test_with_a_key_api_clients_see_no_difference(tiny_api_factory) -> None:  # type: ignore[no-untyped-def]
    api = tiny_api_factory(worker=False, api_key="k")  # no worker: uploads get as far as "not ready"
    c = _raw(api, "http://any.name.example")
    auth = {"Authorization": "Bearer k"}
    assert c.get("/v1/datasets", headers=auth).status_code == 200
    r = c.post("/v1/datasets", headers={**auth, "Sec-Fetch-Site": "cross-site"}, **UPLOAD)  # a foreign Host
    assert (r.status_code, r.json()["type"]) == (503, "not_ready")  # past every guard, to the route
    assert c.post("/v1/datasets", **UPLOAD).status_code == 401  # the key still decides


@pytest.mark.parametrize("name,loopback", [("localhost", True), ("LOCALHOST.", True), ("a.localhost", True),
                                           ("127.8.9.10", True), ("[::1]", True), ("::1", True),
                                           ("localhost.evil.example", False), ("10.0.0.1", False),
                                           ("0.0.0.0", False), ("evil.example", False)])
def test_loopback_names(name: str, loopback: bool) -> None:
    assert is_loopback_name(name) is loopback


def test_the_listen_host_is_allowed_unless_it_is_a_wildcard() -> None:
    assert allowed_host_names("10.0.0.5", "") == {"10.0.0.5"}
    assert allowed_host_names("0.0.0.0", "a.example") == {"a.example"}
    assert allowed_host_names("::", "") == frozenset()
    assert allowed_host_names("127.0.0.1", "x, *") is None

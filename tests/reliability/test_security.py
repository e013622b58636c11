"""Security: API keys on every route, loopback unless a key is set, no path
traversal, no pickle on any load path, no model chosen over HTTP.

The API key tests enumerate the app's own routes, so a route added later is
covered without editing this file.
"""

from __future__ import annotations

import ast
import hmac
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.integration.conftest import ROOT, ServerProcess

from .conftest import phrases

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

KEY = "k3y-with-some-entropy-4f1c"


def _routes(routes) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    """(method, path with each {param} replaced by its name) of every route, included ones too."""
    out = []
    for r in routes:
        inner = getattr(r, "original_router", None)
        if inner is not None:
            out += _routes(inner.routes)
            continue
        path = getattr(r, "path", "")
        for m in sorted(getattr(r, "methods", None) or ()):
            if m != "HEAD":
                out.append((m, path.replace("{", "").replace("}", "")))
    return out


def test_every_route_but_health_needs_the_key(tiny_api_factory) -> None:  # type: ignore[no-untyped-def]
    api = tiny_api_factory(worker=False, api_key=KEY)
    c = api.client
    routes = _routes(c.app.routes)
    paths = {p for _, p in routes}
    assert {"/v1/features", "/v1/embeddings", "/v1/datasets", "/v1/probes", "/v1/heads",
            "/metrics", "/openapi.json"} <= paths  # the enumeration sees the real app
    for method, path in routes:
        if path == "/health":
            continue
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"},
                        {"Authorization": f"Bearer {KEY}x"}, {"Authorization": f"Bearer {KEY[:-1]}"},
                        {"Authorization": "Bearer"}, {"X-Api-Key": KEY}):
            r = c.request(method, path, headers=headers)
            assert r.status_code == 401, (method, path, headers, r.status_code)
            body = r.json()
            # /v1/embeddings answers in OpenAI's error shape, our type as its code
            got = body["error"]["code"] if path == "/v1/embeddings" else body["type"]
            assert got == "unauthorized"
            assert r.headers["www-authenticate"] == "Bearer"
        ok = c.request(method, path, headers={"Authorization": f"Bearer {KEY}"})
        # past the guard, the route's own answer: a 4xx for these empty requests, or 503 not_ready
        # (this app has no worker); never 401, never another 5xx (a 500 used to pass as "not 401")
        assert ok.status_code != 401, (method, path)
        assert ok.status_code < 500 or (ok.status_code == 503 and "not_ready" in ok.text), \
            (method, path, ok.status_code, ok.text)
    assert c.get("/health").status_code == 200
    assert c.get("/v1/no-such-route").status_code == 401  # unknown paths say nothing either


def test_the_key_is_compared_in_constant_time(tiny_api_factory, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import layerbank.app.api.deps

    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(layerbank.app.api.deps.hmac, "compare_digest", spy)
    c = tiny_api_factory(worker=False, api_key=KEY).client
    assert c.get("/info", headers={"Authorization": "Bearer guess"}).status_code == 401
    assert c.get("/info", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert calls == [(b"guess", KEY.encode()), (KEY.encode(), KEY.encode())]


def test_serve_refuses_a_public_address_without_a_key(tmp_path: Path) -> None:
    # 192.0.2.1 (TEST-NET-1) is not on this machine: where the key check passes, binding
    # fails, so nothing ever listens beyond loopback
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYERBANK_")}

    def serve(*extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "layerbank.app.cli.main", "serve", "--host", "192.0.2.1",
                                 "--port", "0", "--data-dir", str(tmp_path / f"d{len(extra)}"), *extra],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    procs = {"none": serve(), "insecure": serve("--insecure"), "key": serve("--api-key", "x", "--log-level", "INFO")}
    out = {k: p.communicate(timeout=100) for k, p in procs.items()}
    assert procs["none"].returncode == 2
    assert ("refusing to listen on 192.0.2.1 without an API key" in out["none"][1]
            and "--insecure" in out["none"][1])
    assert not (tmp_path / "d0").exists()  # refused before touching the data directory
    for k in ("insecure", "key"):
        assert procs[k].returncode == 2, out[k]
        assert "refusing" not in out[k][1] and "cannot listen on 192.0.2.1" in out[k][1], out[k][1]


def test_serve_counts_loopback_addresses_as_loopback() -> None:
    from layerbank.app.cli.serve import is_loopback

    for host in ("127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "192.168.1.4", "10.0.0.1", "example.com", "127.0.0.1.nip.io", ""):
        assert not is_loopback(host), host


TRAVERSALS = ["../../../../tmp/lb-evil", "/tmp/lb-evil", "..", "..\\..\\lb-evil", "a/../../lb-evil",
              "%2e%2e%2flb-evil", "lb-evil\x00.csv"]


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _upload(server: ServerProcess, timeout: float = 180, **kw: Any) -> httpx.Response:
    """POST /v1/datasets, waiting out the documented back-pressure: a 429 (the extraction
    queue is full, as it is when the machine is slow) is retried once its Retry-After has
    passed, until the queue has room; any other answer is returned."""
    deadline = time.monotonic() + timeout
    while True:
        r = server.post("/v1/datasets", **kw)
        if r.status_code != 429:
            return r
        assert "already queued" in r.json()["error"] and "retry-after" in r.headers, r.text
        assert time.monotonic() < deadline, f"the extraction queue stayed full for {timeout} s"
        time.sleep(min(float(r.headers["retry-after"]), 1.0))


def test_names_ids_and_file_names_never_reach_a_path(rel_server: ServerProcess, tmp_path: Path) -> None:
    outside = rel_server.data_dir.parent
    before = _tree(outside) - {p for p in _tree(outside) if p.startswith(rel_server.data_dir.name)}
    texts = phrases(2, 900)
    for evil in TRAVERSALS:
        name = evil.replace("\x00", "")
        r = _upload(rel_server, json={"name": name, "texts": texts})
        assert r.status_code in (202, 422), r.text
        if r.status_code == 202:
            assert r.json()["name"] == name  # a name is data, kept as given
        r = _upload(rel_server, files={"file": (evil + ".csv", b"text\nhello there\n", "text/csv")})
        assert r.status_code in (202, 422), r.text
        if r.status_code == 202:
            assert "/" not in r.json()["source"] and "\\" not in r.json()["source"]
        for method, path in [("GET", "/v1/datasets/{}"), ("DELETE", "/v1/datasets/{}"),
                             ("GET", "/v1/datasets/{}/features"), ("GET", "/v1/jobs/{}"),
                             ("DELETE", "/v1/jobs/{}"), ("GET", "/v1/heads/{}"), ("DELETE", "/v1/heads/{}"),
                             ("GET", "/v1/probes/{}")]:
            r = rel_server.request(method, path.format(evil.replace("\x00", "")))
            # 404/422; 405 where the client resolved "/.." onto another route
            assert r.status_code in (404, 405, 422), (method, path, evil, r.status_code, r.text)
    after = _tree(outside) - {p for p in _tree(outside) if p.startswith(rel_server.data_dir.name)}
    assert after == before  # nothing written beside the data directory
    assert not list(Path("/tmp").glob("lb-evil*"))
    assert rel_server.get("/health").status_code == 200


def test_store_and_head_paths_refuse_traversal(tmp_path: Path) -> None:
    from layerbank.app.api.probe_jobs.heads_store import HeadStore
    from layerbank.cache.keys import ExtractionConfig
    from layerbank.cache.shard import ShardContents
    from layerbank.cache.store import FeatureStore

    store = FeatureStore(tmp_path / "data")
    c = ShardContents(["0" * 64], np.ones(1), np.zeros(1), {"mean": np.ones((1, 3, 4), np.float32)})
    for bad in ["../x", "/tmp/x", "a/b", ".hidden", "..", "../../etc/passwd"]:
        with pytest.raises(ValueError, match="bad shard name"):
            store.write(bad, c, model="m", config=ExtractionConfig(max_length=8))
    heads = HeadStore(store.catalog, tmp_path / "data")
    for bad in ["../x", "hd_../../etc", "/etc/passwd", "hd_0123456789ab/../../x", "hd_0123456789AB"]:
        with pytest.raises(ValueError, match="not a head id"):
            heads.directory(bad)
    assert heads.directory("hd_0123456789ab") == tmp_path / "data" / "heads" / "hd_0123456789ab"
    assert _tree(tmp_path) <= {"data", "data/shards", "data/quarantine", "data/heads",
                               "data/catalog.sqlite", "data/catalog.sqlite-wal", "data/catalog.sqlite-shm",
                               "data/catalog.postgresql"}  # the marker of a PostgreSQL catalog
    store.close()


# -- no pickle on a load path ----------------------------------------------------------------
def _calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            base = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
            out.append((f"{base}.{name}" if base else name, node))
    return out


def _kw(call: ast.Call, name: str) -> object:
    for k in call.keywords:
        if k.arg == name:
            return k.value.value if isinstance(k.value, ast.Constant) else "<expr>"
    return None


def unsafe_loads(source: str) -> list[str]:
    """What in ``source`` could unpickle data: imports and calls, by line."""
    bad = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            for m in mods:
                if m and m.split(".")[0] in ("pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve"):
                    bad.append(f"line {node.lineno}: imports {m}")
            if isinstance(node, ast.ImportFrom) and node.module == "joblib" and \
                    any(a.name == "load" for a in node.names):
                bad.append(f"line {node.lineno}: imports joblib.load")
    for name, call in _calls(tree):
        short = name.split(".")[-1]
        if name in ("joblib.load", "pd.read_pickle", "pandas.read_pickle") or short == "read_pickle":
            bad.append(f"line {call.lineno}: {name}")
        if name == "torch.load" and _kw(call, "weights_only") is not True:
            bad.append(f"line {call.lineno}: torch.load without weights_only=True")
        if name in ("np.load", "numpy.load") and _kw(call, "allow_pickle") not in (None, False):
            bad.append(f"line {call.lineno}: np.load with allow_pickle")
        if short == "from_pretrained" and _kw(call, "trust_remote_code") is True:
            bad.append(f"line {call.lineno}: from_pretrained(trust_remote_code=True)")
    return bad


def test_the_scanner_catches_what_it_looks_for() -> None:
    src = ("import pickle\nfrom joblib import load\nimport joblib\nimport torch, numpy as np\n"
           "joblib.load('h')\ntorch.load('w')\ntorch.load('w', weights_only=False)\n"
           "torch.load('w', weights_only=True)\nnp.load('a', allow_pickle=True)\n"
           "np.load('a', allow_pickle=False)\nnp.load('a')\n"
           "AutoModel.from_pretrained('m', trust_remote_code=True)\n")
    assert unsafe_loads(src) == ["line 1: imports pickle", "line 2: imports joblib.load",
                                 "line 5: joblib.load", "line 6: torch.load without weights_only=True",
                                 "line 7: torch.load without weights_only=True",
                                 "line 9: np.load with allow_pickle",
                                 "line 12: from_pretrained(trust_remote_code=True)"]


def test_no_pickle_on_any_load_path() -> None:
    found = {}
    files = [p for d in ("app", "workers", "cache") for p in (ROOT / d).rglob("*.py")]
    assert len(files) > 30
    for p in files:
        bad = unsafe_loads(p.read_text())
        if bad:
            found[str(p.relative_to(ROOT))] = bad
    assert found == {}


def test_a_head_file_holding_objects_is_refused(tmp_path: Path) -> None:
    from layerbank.app.probes.head_files import read_head

    d = tmp_path / "head"
    d.mkdir()
    np.savez(d / "arrays.npz", coef_=np.array([{"evil": 1}], dtype=object))
    (d / "head.json").write_text('{"format": "layerbank-head/1", "head": "logistic", "params": {}, '
                                 '"fitted": {}, "arrays": ["coef_"], "metadata": {}}')

    class Head:
        def __init__(self, **kw: object) -> None:
            pass

        def get_params(self) -> dict:
            return {}

    with pytest.raises(ValueError, match="(?i)pickle"):
        read_head(d, lambda name: Head)


# -- the model is the server's choice, not the client's ------------------------------------
def test_a_request_cannot_make_the_server_load_a_model(rel_server: ServerProcess) -> None:
    jobs_before = len(rel_server.get("/v1/jobs", params={"limit": 1000}).json()["data"])
    for model in ["/etc/passwd", "../../some-model", "bert-base-uncased",
                  "hf-internal-testing/remote-code-model", "file:///tmp/x"]:
        for path, body in [("/v1/features", {"texts": ["a text"], "model": model}),
                           ("/v1/embeddings", {"input": "a text", "model": model})]:
            r = rel_server.post(path, json=body)
            assert r.status_code == 422, r.text
            body = r.json()
            assert (body["error"]["param"] if path == "/v1/embeddings" else body["field"]) == "model"
    # nothing was queued for the worker: it loads only the model it was started with
    assert len(rel_server.get("/v1/jobs", params={"limit": 1000}).json()["data"]) == jobs_before
    spec = rel_server.get("/openapi.json").json()
    fields = {name for s in spec["components"]["schemas"].values()
              for name in (s.get("properties") or {})}
    assert not fields & {"model_path", "trust_remote_code", "revision", "model_name_or_path"}

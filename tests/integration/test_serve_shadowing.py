"""``layerbank serve`` started where a folder named ``layerbank`` sits.

A user's working directory can hold a folder named ``layerbank``: ``--data-dir
layerbank``, or the parent of a clone named ``layerbank``. ``serve`` starts its
worker as ``python -m ...``; without ``-P`` that child puts the working
directory first on ``sys.path``, imports the folder as a namespace package,
fails, and is restarted forever (``/ready`` 503 "no live worker"). This test
starts the installed ``layerbank`` command as a user would, from such a
directory, and asks for features.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import ServerProcess

pytestmark = pytest.mark.integration


def test_serve_from_a_directory_holding_a_layerbank_folder(tmp_path: Path) -> None:
    data = tmp_path / "layerbank"  # the shadowing folder, and the data directory itself
    server = ServerProcess(data)  # for its environment (tests' settings) and its helpers
    data.mkdir()
    command = Path(sys.executable).with_name("layerbank")  # the console script README runs
    with open(server.log_path, "ab") as log:
        server.proc = subprocess.Popen([str(command), "serve", "--data-dir", "layerbank", "--port", "0"],
                                       cwd=tmp_path, env=server.env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            server._check_alive()
            try:
                meta = json.loads((data / "server.json").read_text())
                if meta.get("pid") == server.proc.pid:
                    break
            except (OSError, ValueError):
                pass
            server._wait_or_fail(deadline, "write server.json")
        server.url = meta["url"]
        server._http = httpx.Client(base_url=server.url, timeout=60.0, headers=server._auth())
        server.wait_ready(deadline)  # /ready 200: a live worker, not one restarting forever
        r = server.post("/v1/features", json={"texts": ["a folder named layerbank beside me"]})
        assert r.status_code == 200, r.text
        assert r.json()["dim"] == 384 and len(r.json()["data"][0]["embedding"]) == 384
        assert "restarting it" not in server.log(), server.log()
    finally:
        server.stop()

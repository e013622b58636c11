"""`layerbank serve` whose worker cannot load the model stops, saying why, instead of
answering 503 forever (docs/operations.md promised it; no test held it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]


def test_serve_stops_when_the_model_cannot_load(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYERBANK_")}
    env.update({"LAYERBANK_MODEL": str(tmp_path / "no-such-model"), "LAYERBANK_THREADS": "1",
                "HF_HUB_OFFLINE": "1"})
    data = tmp_path / "data"
    r = subprocess.run([sys.executable, "-m", "layerbank.app.cli.main", "serve", "--data-dir", str(data),
                        "--port", "0"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode != 0, r.stderr[-2000:]
    assert "the worker could not load the model" in r.stderr, r.stderr[-2000:]
    assert "no-such-model" in r.stderr  # the reason names what was asked for
    assert not (data / "server.json").exists()  # nothing left that says a server runs here

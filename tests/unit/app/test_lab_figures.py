"""One figure for one thing across the lab, the API and the advice (issue 23, item 9).

A head's size: the probe's advice estimates it before the head exists, and
``GET /v1/heads/{id}``'s ``storage`` (which the lab's head page draws) gives
it after; both are ``layerbank.app.probes.advice.head_bytes`` of the same
arrays, so the advice's "~9.2 kB" and the page's figure agree (they read
9.2 kB and 12.0 kB: the page counted the files, container and metadata
included). The page itself is driven in Chromium by tests/integration/test_lab.py.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any

import numpy as np

from layerbank.app.probes.advice import head_bytes
from layerbank.app.probes.heads import load_head
from layerbank.app.probes.regimes_plot import NO_SPREAD

POS = ["a good film", "a great play", "good and warm", "a lovely story"]
NEG = ["a bad film", "a dull play", "bad and cold", "an awful story"]


def _wait(c: Any, job_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (job := c.get(f"/v1/jobs/{job_id}").json())["state"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.02)
    assert job["state"] == "succeeded", job


def test_the_advice_and_the_head_give_one_size(tiny_api_factory: Any) -> None:
    api = tiny_api_factory()
    api.client.app.state.probe_service.executor_factory = lambda: ThreadPoolExecutor(1)
    c = api.client
    texts = [f"{t} number {i}" for i in range(6) for t in (POS[i % 4], NEG[i % 4])]
    ds = c.post("/v1/datasets", json={"name": "sizes", "texts": texts, "labels": [1, 0] * 6}).json()
    _wait(c, ds["job_id"])
    probe = c.post("/v1/probes", json={"dataset": ds["id"], "views": ["layer:-1", "layers:1,2"],
                                       "poolings": ["mean"], "cv": 2, "control_task": False,
                                       "learning_curve": False, "mdl": False}).json()
    _wait(c, probe["id"])
    advice = c.get(f"/v1/probes/{probe['id']}").json()["result"]["recommendation"]
    head = c.post("/v1/heads", json={"probe": probe["id"]}).json()
    _wait(c, head["job_id"])
    got = c.get(f"/v1/heads/{head['id']}").json()
    saved = load_head(api.data_dir / "heads" / head["id"])
    weights = head_bytes({a: getattr(saved, a) for a in saved._arrays})
    assert got["head"] == "logistic" and advice["numbers"]["head_bytes_estimated"] is True
    assert got["storage"]["frozen_head_bytes"] == advice["numbers"]["frozen_head_bytes"] == weights
    assert got["storage"]["bitfit_bytes"] == advice["numbers"]["bitfit_bytes"]
    assert weights == 8 * sum(np.asarray(getattr(saved, a)).size for a in ("mean_", "scale_", "coef_", "intercept_"))
    assert got["size_bytes"] > weights  # the files, kept apart: container and head.json on top


def test_the_regimes_page_uses_the_command_lines_words_for_one_seed() -> None:
    js = (resources.files("layerbank.app.api.lab") / "static" / "regimes.js").read_text(encoding="utf-8")
    assert f'const NO_SPREAD = "{NO_SPREAD}";' in js
    ui = (resources.files("layerbank.app.api.lab") / "static" / "ui.js").read_text(encoding="utf-8")
    assert '"?"' not in ui  # no "0 / ?" for a job without a total

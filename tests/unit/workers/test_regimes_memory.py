"""A regimes job runs under a memory limit, like probe processes (issue 25, row 3).

With ``WorkerOptions.job_memory_mb`` (``layerbank worker`` sets it from
``probe_memory_mb``) a regimes job runs in a process of its own under that
limit (workers/regimes/process.py): a real comparison still succeeds there, an
allocation past the limit is a failed job whose error says it ran out of
memory and names the limit and the setting, and a cancel ends the process.
"""

from __future__ import annotations

import time
from typing import Any

import psutil
import pytest

from layerbank.workers.regimes import process
from tests.regimes_data import NEG, POS, dataset, wait

HERE = "tests.unit.workers.test_regimes_memory"
LIMIT_MB = 256


def hog_numpy(texts: Any, labels: Any, **kw: Any) -> dict[str, Any]:
    """In the regimes process: a first allocation that fits, then one past the limit."""
    import numpy as np

    kw["progress"](1, 3)
    kw["stage"]("holding what fits")
    small = np.ones(64 * 2**20 // 8)  # within the limit
    big = np.ones((LIMIT_MB + 1024) * 2**20 // 8)  # past it: numpy's MemoryError
    return {"never": float(small[0] + big[0])}


def hog_torch(texts: Any, labels: Any, **kw: Any) -> dict[str, Any]:
    import torch

    big = torch.ones((LIMIT_MB + 1024) * 2**20 // 4)  # torch's "can't allocate memory"
    return {"never": float(big[0])}


def sleeper(texts: Any, labels: Any, **kw: Any) -> dict[str, Any]:
    import numpy as np

    held = np.ones(128 * 2**20 // 8)  # 128 MB that a cancel must give back
    kw["progress"](1, 100)
    time.sleep(600)
    return {"never": float(held[0])}


@pytest.fixture
def limited(tiny_api: Any) -> Any:
    """The tiny app whose worker runs regimes jobs in a process under LIMIT_MB, and a dataset."""
    tiny_api.worker.options.job_memory_mb = LIMIT_MB
    c = tiny_api.client
    return tiny_api, dataset(c, POS + NEG, ["pos"] * 10 + ["neg"] * 10)


def test_a_regimes_job_runs_in_its_own_process_under_the_limit(limited: Any) -> None:
    api, ds = limited
    c = api.client
    r = c.post("/v1/regimes", json={"dataset": ds, "regimes": ["frozen", "bitfit"], "seeds": 1,
                                    "max_epochs": 1})
    assert r.status_code == 202, r.text
    job = wait(c, r.json()["id"], 240)
    assert job["state"] == "succeeded", job["error"]
    assert job["progress"]["done"] == job["progress"]["total"] == 2
    assert job["progress"]["stage"].startswith("bitfit, seed 1 of 1")
    result = c.get(f"/v1/regimes/{r.json()['id']}").json()["result"]
    assert set(result["regimes"]) == {"frozen", "bitfit"}
    assert list((api.data_dir / result["artifacts_dir"]).rglob("*.safetensors"))


@pytest.mark.parametrize("hog", ["hog_numpy", "hog_torch"])
def test_a_regimes_job_past_its_memory_limit_fails_saying_so(limited: Any, monkeypatch: Any, hog: str) -> None:
    api, ds = limited
    c = api.client
    monkeypatch.setattr(process, "TRAIN", f"{HERE}:{hog}")
    r = c.post("/v1/regimes", json={"dataset": ds, "regimes": ["frozen"], "seeds": 1})
    assert r.status_code == 202, r.text
    job = wait(c, r.json()["id"], 240)
    assert job["state"] == "failed", job
    error = job["error"]
    assert error.startswith("the regimes job ran out of memory"), error
    assert f"limit of {LIMIT_MB} MB" in error and "probe_memory_mb" in error, error
    # the worker lives on and runs the next job
    monkeypatch.setattr(process, "TRAIN", "layerbank.workers.regimes.run:run_regimes")
    r = c.post("/v1/regimes", json={"dataset": ds, "regimes": ["frozen"], "seeds": 1})
    assert wait(c, r.json()["id"], 240)["state"] == "succeeded"


def test_cancelling_a_regimes_job_ends_its_process(limited: Any, monkeypatch: Any) -> None:
    api, ds = limited
    c = api.client
    monkeypatch.setattr(process, "TRAIN", f"{HERE}:sleeper")
    posted = time.time()
    r = c.post("/v1/regimes", json={"dataset": ds, "regimes": ["frozen"], "seeds": 1})
    rid = r.json()["id"]
    deadline = time.monotonic() + 120
    while c.get(f"/v1/jobs/{rid}").json()["progress"].get("done") != 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # this job's process only: earlier tests' children of this pytest process (a probe pool,
    # another fixture's worker) may still run, and are not this job's to end
    children = [p for p in psutil.Process().children() if p.is_running() and p.create_time() >= posted - 1]
    held = [p for p in children if p.memory_info().rss > 100 * 2**20]
    assert held, "no child process holds the job's 128 MB"
    t0 = time.monotonic()
    assert c.delete(f"/v1/jobs/{rid}").status_code in (200, 202)
    assert wait(c, rid, 30)["state"] == "cancelled"
    gone, alive = psutil.wait_procs(held, timeout=10)
    assert not alive, f"the regimes process still runs {time.monotonic() - t0:.1f} s after DELETE"
    assert not (api.data_dir / "regimes" / rid).exists()

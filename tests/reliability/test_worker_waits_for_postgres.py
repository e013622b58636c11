"""A worker started while its PostgreSQL catalog is down waits for it, then runs jobs
(issue 25, item 4: "workers wait instead of restart-looping").

It exited at once with ``CatalogUnavailable`` (registering its model is its first
statement); under ``layerbank serve`` or a container's restart policy that is a
restart loop for as long as the outage lasts, each try loading the model again.
Here a real ``layerbank worker`` process starts against a stopped server of the
test's own: it must stay up, say once why it waits, and, once the server is
started, register its model and run an extraction job.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from layerbank.cache.datasets import DatasetStore
from layerbank.cache.jobs import JobQueue
from layerbank.cache.store import FeatureStore
from tests.integration.conftest import ROOT
from tests.postgres_server import PostgresServer

# run in the suite's PostgreSQL pass (LAYERBANK_TEST_CATALOGS), deselected in the SQLite one
pytestmark = [pytest.mark.postgres_only, pytest.mark.reliability, pytest.mark.timeout(600)]


@pytest.fixture
def own_server():  # type: ignore[no-untyped-def]
    # outside tmp_path, which the postgres user cannot enter
    server = PostgresServer.start(Path(tempfile.mkdtemp(prefix="layerbank-pg-")))
    yield server
    server.stop()


def _worker(data_dir: Path, model: str, url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYERBANK_")}
    env.update({"LAYERBANK_MODEL": model, "LAYERBANK_THREADS": "1", "LAYERBANK_DEVICE": "cpu",
                "LAYERBANK_CATALOG_URL": url, "LAYERBANK_LOG_LEVEL": "INFO",
                "LAYERBANK_HEARTBEAT_SECONDS": "0.5", "LAYERBANK_ENGINE": "torch"})
    with open(log, "ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "layerbank.app.cli.main", "worker", "--data-dir",
                                 str(data_dir)], cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)


def test_a_worker_started_while_postgresql_is_down_waits_and_then_runs_a_job(
        own_server, tiny_model_dir: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = own_server
    url = server.new_schema_url()
    server.stop_keeping_data()
    data, log = tmp_path / "data", tmp_path / "worker.log"
    worker = _worker(data, tiny_model_dir, url, log)
    try:
        deadline = time.monotonic() + 300  # it loads the model first (minutes on a loaded machine)
        while "waiting for it" not in (text := log.read_text() if log.exists() else ""):
            assert worker.poll() is None, f"the worker exited with {worker.returncode}:\n{text[-3000:]}"
            assert time.monotonic() < deadline, text[-3000:]
            time.sleep(0.2)
        time.sleep(4)  # several retries (0.5 s doubling): still up, and said so once
        text = log.read_text()
        assert worker.poll() is None, f"the worker exited with {worker.returncode}:\n{text[-3000:]}"
        assert text.count("the catalog is unavailable") == 1, text[-3000:]
        assert "cannot be reached" in text and "Traceback" not in text, text[-3000:]

        server.restart()
        store = FeatureStore(data, catalog_url=url)
        try:
            queue, datasets = JobQueue(store.catalog), DatasetStore(store.catalog)
            deadline = time.monotonic() + 60
            while not (live := queue.live_workers(10.0)):
                assert worker.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
            fp = live[0]["fingerprint"]
            info = store.catalog.model_info(fp)
            assert info is not None, "the worker did not register its model once the catalog answered"
            texts = ["the catalog came back", "and the worker ran the job"]
            with store.catalog.tx():
                ds = datasets.create("after", texts, model=info["name"], config=info["config"],
                                     job_id="afterjob", meta={"fingerprint": fp}, dataset_id="ds_after")
                queue.submit("extract", {"dataset_id": ds.id, "want_tokens": False}, job_id="afterjob")
            deadline = time.monotonic() + 60
            while (job := queue.get("afterjob")) is not None and job.state in ("queued", "running"):
                assert worker.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.1)
            assert job is not None and job.state == "succeeded", (job, log.read_text()[-3000:])
            keys = [store.key(fp, info["config"], t) for t in texts]
            assert store.read_pooled(keys, "mean").found.all()
            assert "the catalog answers again" in log.read_text()
        finally:
            store.close()
    finally:
        if worker.poll() is None:
            worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()

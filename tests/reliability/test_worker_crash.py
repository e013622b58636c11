"""A worker SIGKILLed in the middle of an extraction job.

Two real ``layerbank worker`` processes share one data directory. The one
that runs a 3,000-text job is killed with SIGKILL after a few of its shards
are committed. The job's lease expires, the other worker claims it (attempt
2), skips the committed parts and finishes it. Meanwhile a reader polls the
store: it must never see an error, a row that differs from a clean run, or a
key that disappears again. At the end the catalog holds every key once and
every number equals a clean in-process run, bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from layerbank.cache.catalog import Catalog
from layerbank.cache.datasets import DatasetStore
from layerbank.cache.jobs import JobQueue
from layerbank.cache.shard import POOLINGS
from layerbank.cache.store import FeatureStore
from tests.integration.conftest import ROOT

from .conftest import phrases, reference

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(240)]

N_TEXTS, PART, MAX_TOKENS, LEASE_S = 3000, 48, 1024, 3.0


def _start_worker(data_dir: Path, model: str, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYERBANK_")}
    env.update({"LAYERBANK_MODEL": model, "LAYERBANK_THREADS": "1", "LAYERBANK_DEVICE": "cpu",
                "LAYERBANK_PART_SIZE": str(PART), "LAYERBANK_MAX_TOKENS_PER_BATCH": str(MAX_TOKENS),
                "LAYERBANK_LEASE_SECONDS": str(LEASE_S), "LAYERBANK_HEARTBEAT_SECONDS": "0.5",
                "LAYERBANK_LOG_LEVEL": "INFO",
                # the clean run is torch's; engines agree within 1e-4, not bit for bit (docs/decisions.md)
                "LAYERBANK_ENGINE": "torch"})
    if os.environ.get("LAYERBANK_CATALOG_URL"):  # the suite's PostgreSQL pass (tests/conftest.py)
        env["LAYERBANK_CATALOG_URL"] = os.environ["LAYERBANK_CATALOG_URL"]
    with open(log, "ab") as fh:
        # niced: on a loaded machine the test's polling must not starve while the workers run the
        # whole 63-part job before it looks (CI saw the job succeed before the kill)
        return subprocess.Popen([sys.executable, "-m", "layerbank.app.cli.main", "worker", "--data-dir", str(data_dir)],
                                cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                preexec_fn=lambda: os.nice(5))


@dataclass
class ReaderLog:
    reads: int = 0
    found_counts: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _poll(store: FeatureStore, keys: list[str], ref: dict[str, np.ndarray], stop: threading.Event,
          out: ReaderLog) -> None:
    """Read every key, every pooling, again and again, checking each row found.

    The last read starts after ``stop`` is set, so it sees everything that
    was committed before the test stopped the reader.
    """
    seen = np.zeros(len(keys), dtype=bool)
    while True:
        last = stop.is_set()
        try:
            found_before = None
            for pooling in POOLINGS:
                res = store.read_pooled(keys, pooling)
                if res.found.any():
                    rows = np.flatnonzero(res.found)
                    if not np.array_equal(res.data[rows], ref[pooling][rows]):
                        bad = rows[~(res.data[rows] == ref[pooling][rows]).all(axis=(1, 2))]
                        out.errors.append(f"{pooling}: rows {bad[:5].tolist()} differ from a clean run")
                # a key seen once stays (nothing lost); committed keys carry every pooling
                if (seen & ~res.found).any():
                    out.errors.append(f"{int((seen & ~res.found).sum())} keys vanished ({pooling})")
                if found_before is not None and (found_before & ~res.found).any():
                    out.errors.append(f"a key had {POOLINGS[0]} but not {pooling}")
                found_before = res.found
                seen |= res.found
            out.found_counts.append(int(seen.sum()))
            out.reads += 1
        except Exception as e:  # noqa: BLE001 - any error is a failure the test reports
            out.errors.append(f"{type(e).__name__}: {e}")
        if out.errors or last:
            return
        time.sleep(0.01)


def _wait(what: str, cond, timeout: float, procs: list[subprocess.Popen[bytes]], log: Path):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        for p in procs:
            assert p.poll() is None, f"a worker exited with {p.returncode}:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{log.read_text()[-4000:]}"
        time.sleep(0.005)


def test_sigkilled_worker_loses_nothing_and_serves_nothing_wrong(tmp_path: Path, tiny_model_dir: str) -> None:
    data = tmp_path / "data"
    log = tmp_path / "workers.log"
    texts = phrases(N_TEXTS, 6600)
    store = FeatureStore(data)
    workers = [_start_worker(data, tiny_model_dir, log) for _ in range(2)]
    try:
        # the clean run, computed while the workers load their model
        ref_store, enc, _ = reference(texts, tiny_model_dir, tmp_path / "ref", part_size=PART,
                                      max_tokens=MAX_TOKENS)
        keys = [store.key(enc.fingerprint, enc.config, t) for t in texts]
        ref = {p: ref_store.read_pooled(keys, p).data for p in POOLINGS}
        queue, datasets = JobQueue(store.catalog), DatasetStore(store.catalog)
        live = _wait("two live workers", lambda: len(queue.live_workers(10.0)) == 2 and
                     queue.live_workers(10.0), 180, workers, log)
        assert {w["fingerprint"] for w in live} == {enc.fingerprint}  # same keys as the clean run
        assert json.loads(store.catalog.model_info(enc.fingerprint)["config"]) == \
            json.loads(enc.config.canonical())

        reader_log, stop = ReaderLog(), threading.Event()
        reader = threading.Thread(target=_poll, args=(FeatureStore(data), keys, ref, stop, reader_log))
        reader.start()

        with store.catalog.tx():
            ds = datasets.create("crash", texts, model=enc.name, config=enc.config.canonical(),
                                 job_id="crashjob", meta={"fingerprint": enc.fingerprint},
                                 dataset_id="ds_crash")
            queue.submit("extract", {"dataset_id": ds.id, "want_tokens": False}, job_id="crashjob")

        def committed() -> int:
            return sum(1 for n in store.catalog.shard_names() if n.startswith("crashjob-"))

        def owner_stopped_mid_job() -> subprocess.Popen[bytes] | None:
            if committed() < 8:
                return None
            owner = store.catalog.conn().execute("SELECT owner FROM jobs WHERE id='crashjob'").fetchone()[0]
            victim = next(p for p in workers if f":{p.pid}:" in owner)
            victim.send_signal(signal.SIGSTOP)  # frozen at once, where it is; killed below
            return victim

        victim = _wait("8 committed shards", owner_stopped_mid_job, 120, workers, log)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        kept = store.catalog.stats()["keys"]
        survivor = next(p for p in workers if p is not victim)
        # nobody told the queue: only the lease can (not "succeeded": the job ended before the stop)
        assert queue.get("crashjob").state == "running"

        job = _wait("the job to end", lambda: (j := queue.get("crashjob")) and
                    j.state not in ("queued", "running") and j, 120, [survivor], log)
        stop.set()
        reader.join(30)

        assert job.state == "succeeded", job.error
        assert job.attempts == 2  # the lease expired and the job ran again
        owner2 = store.catalog.conn().execute("SELECT owner FROM jobs WHERE id='crashjob'").fetchone()[0]
        assert f":{survivor.pid}:" in owner2
        # the second attempt kept what the first committed
        assert job.result["cache_hits"] >= kept >= 8 * PART
        assert job.result["cache_hits"] + job.result["texts_encoded"] == N_TEXTS

        # the reader ran throughout, saw the store grow, and saw nothing wrong
        assert reader_log.errors == []
        assert reader_log.reads >= 5
        assert reader_log.found_counts[0] < N_TEXTS and reader_log.found_counts[-1] == N_TEXTS

        # every key once, every committed shard on disk, nothing registered twice
        cat = Catalog(data / "catalog.sqlite")
        db = cat.conn()
        n_entries, n_distinct = db.execute("SELECT COUNT(*), COUNT(DISTINCT key) FROM entries").fetchone()
        assert n_entries == n_distinct == N_TEXTS
        assert db.execute("SELECT SUM(n_rows) FROM shards").fetchone()[0] == N_TEXTS
        on_disk = {p.name for p in (data / "shards").glob("*.h5")}
        assert cat.shard_names() <= on_disk
        # a shard the victim renamed but never committed is removed at the next start
        store.clean()
        assert {p.name for p in (data / "shards").iterdir()} == cat.shard_names()

        # the final features equal those of a clean run, bit for bit
        for p in POOLINGS:
            res = store.read_pooled(keys, p)
            assert res.found.all()
            np.testing.assert_array_equal(res.data, ref[p])
        cat.close()
        ref_store.close()
    finally:
        for p in workers:
            if p.poll() is None:
                p.terminate()
        for p in workers:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        store.close()

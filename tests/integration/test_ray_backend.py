"""The Ray backend on a real local Ray (2 CPUs, 2 logical GPUs, tiny encoder on CPU).

One Ray instance serves the whole module (starting Ray costs seconds on
2 cores). What a user would check:
- Ray stores exactly the shards, keys and numbers the embedded backend does;
- an actor that dies mid-batch is replaced and the job still stores every
  text exactly once, and what a lost attempt left on disk is removed at the job's end;
- a job stopped half way (its driver gone) is resubmitted and leaves the
  parts already committed untouched;
- a worker whose backend is Ray runs dataset jobs there, records their
  progress in the job record, and still answers urgent requests meanwhile;
- its pool of encoder actors stays warm: consecutive jobs run in the same
  actor processes and start encoding at once; an actor killed between jobs
  is replaced and the next job stores the embedded backend's exact rows.
"""

from __future__ import annotations

import csv
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest
import ray as ray

from layerbank.cache.datasets import DatasetStore
from layerbank.cache.store import FeatureStore
from layerbank.workers.backends import ExtractionBackend, make_backend
from layerbank.workers.backends.ray_backend import RayUnavailable, extract_with_ray
from layerbank.workers.encoder import Encoder
from layerbank.workers.extract import ExtractSummary, Progress, Stopped, extract
from layerbank.workers.jobs_registry import ENCODE_PRIORITY
from layerbank.workers.worker import Worker, WorkerOptions
from tests.data_paths import SST2

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

DATA = SST2 / "dev.tsv"


def sst2_texts(n: int, seed: int) -> list[str]:
    with open(DATA, newline="") as f:
        rows = [r[0] for r in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)][1:]
    rng = np.random.default_rng(seed)
    texts = [rows[i] for i in rng.choice(len(rows), size=n, replace=False)]
    # a repeat (stored once) and a text past the tiny model's 64 positions (truncated)
    return texts + [texts[0], " ".join(texts[1:12])]


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, num_gpus=2, object_store_memory=100 * 1024**2, include_dashboard=False,
             log_to_driver=False)
    yield
    ray.shutdown()


def shard_files(store: FeatureStore) -> set[str]:
    return {p.name for p in store.shard_dir.iterdir()}


def read_shard(path: Path) -> dict[str, object]:
    with h5py.File(path, "r") as f:
        out: dict[str, object] = {"attrs": dict(f.attrs)}
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) else None)
    return out


def assert_same_shards(a: FeatureStore, b: FeatureStore) -> None:
    assert shard_files(a) == shard_files(b) == a.catalog.shard_names() == b.catalog.shard_names()
    for name in sorted(shard_files(a)):
        da, db = read_shard(a.shard_dir / name), read_shard(b.shard_dir / name)
        assert sorted(da) == sorted(db), name
        assert da["attrs"] == db["attrs"]
        for k in da:
            if k != "attrs":
                # bit-for-bit: same parts, same batches, same model, same threads
                np.testing.assert_array_equal(da[k], db[k], err_msg=f"{name}:{k}")


def assert_stored_once(store: FeatureStore, keys: list[str]) -> None:
    uniq = set(keys)
    assert set(store.lookup(sorted(uniq))) == uniq  # nothing lost
    rows = sum(store.catalog.shard_info(s)["n_rows"] for s in store.catalog.shard_names())
    assert rows == store.catalog.stats()["keys"] == len(uniq)  # nothing stored twice
    # every file in the shard directory is a committed shard: no leftovers, no temp files
    assert shard_files(store) == store.catalog.shard_names()


def test_ray_stores_the_same_features_as_embedded(tiny_model_dir: str, tmp_path: Path) -> None:
    texts = sst2_texts(240, seed=1)
    enc = Encoder.load(tiny_model_dir, device="cpu")
    emb, viaray = FeatureStore(tmp_path / "emb", catalog_url=""), FeatureStore(tmp_path / "ray")  # two catalogs
    # the same 30 texts stored beforehand in both: both backends must skip them
    for s in (emb, viaray):
        extract(texts[:30], s, enc, job_id="warm", part_size=50, max_tokens=512)
    # both through the backend interface the worker uses
    embedded = make_backend("embedded", emb, enc, part_size=50, max_tokens=512)
    on_ray = make_backend("ray", viaray, enc, part_size=50, max_tokens=512, ray_actors=2, threads=1)
    assert isinstance(on_ray, ExtractionBackend) and on_ray.name == "ray"
    want = embedded.run(texts, "j1")
    seen: list[Progress] = []
    got = on_ray.run(texts, "j1", progress=lambda p: seen.append(Progress(**vars(p))))
    assert got.as_dict() | {"seconds": 0} == want.as_dict() | {"seconds": 0}
    assert (got.cache_hits, got.texts_encoded, got.shards_written) == (30, 211, 5)
    assert got.truncated == 1 and got.keys == want.keys
    assert_same_shards(emb, viaray)
    res_e = emb.read_pooled(want.keys, "mean")
    res_r = viaray.read_pooled(got.keys, "mean")
    assert res_r.found.all()
    np.testing.assert_array_equal(res_r.data, res_e.data)
    # progress as the job record shows it: starts at 0 of 211, ends done with a rate
    assert (seen[0].done, seen[0].total) == (0, 211)
    assert (seen[-1].done, seen[-1].total, seen[-1].tokens) == (211, 211, got.tokens_encoded)
    assert seen[-1].tokens_per_second > 0
    # the same job again on Ray: everything is a hit, nothing is encoded
    again = on_ray.run(texts, "j2")
    assert (again.cache_hits, again.texts_encoded, again.shards_written) == (241, 0, 0)
    on_ray.close()
    assert ray.is_initialized()  # the backend did not start this Ray, so it leaves it running


def test_without_the_extra_the_error_says_what_to_install(tiny_model_dir: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    store = FeatureStore(tmp_path / "data")
    enc = Encoder.load(tiny_model_dir, device="cpu")
    with pytest.raises(RayUnavailable, match=r"pip install 'layerbank\[ray\]'"):
        make_backend("ray", store, enc)
    with pytest.raises(RayUnavailable, match=r"pip install 'layerbank\[ray\]'"):
        extract_with_ray(["a text"], store, enc, job_id="x")
    with pytest.raises(ValueError, match="unknown backend 'spark'; choose one of embedded, ray"):
        make_backend("spark", store, enc)


def test_actor_killed_mid_batch_still_stores_every_text_once(tiny_model_dir: str,
                                                             tmp_path: Path) -> None:
    texts = sst2_texts(120, seed=2)
    enc = Encoder.load(tiny_model_dir, device="cpu")
    store = FeatureStore(tmp_path / "data")
    marker = tmp_path / "actor-died"
    summary = extract_with_ray(texts, store, enc, job_id="k1", part_size=20, max_tokens=512,
                               actors=2, threads=1, fault={"die_once": str(marker)})
    # the fault fired: an actor process wrote the marker and then really exited
    pid = int(marker.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert (summary.texts_encoded, summary.shards_written) == (121, 7)
    assert_stored_once(store, summary.keys)
    ref = FeatureStore(tmp_path / "ref", catalog_url="")  # a catalog of its own, whatever the test runs on
    extract(texts, ref, enc, job_id="k1", part_size=20, max_tokens=512)
    assert_same_shards(ref, store)


def test_resubmitted_job_skips_committed_parts(tiny_model_dir: str, tmp_path: Path) -> None:
    texts = sst2_texts(100, seed=3)
    enc = Encoder.load(tiny_model_dir, device="cpu")
    store = FeatureStore(tmp_path / "data")

    def stop_after_first_part() -> bool:
        return store.catalog.stats()["shards"] == 0

    with pytest.raises(Stopped):
        extract_with_ray(texts, store, enc, job_id="r1", part_size=20, max_tokens=512, actors=1,
                         threads=1, should_continue=stop_after_first_part)
    first = store.catalog.shard_names()
    assert 1 <= len(first) < 6
    before = {n: (os.stat(store.shard_dir / n).st_ino, os.stat(store.shard_dir / n).st_mtime_ns)
              for n in first}
    summary: ExtractSummary = extract_with_ray(texts, store, enc, job_id="r1", part_size=20,
                                               max_tokens=512, actors=1, threads=1)
    # what the stopped run committed is found in the catalog; only the rest is encoded
    done_rows = sum(store.catalog.shard_info(n)["n_rows"] for n in first)
    assert (summary.cache_hits, summary.texts_encoded) == (done_rows, 101 - done_rows)
    assert summary.shards_written == 6 - len(first)
    # the committed parts were not rewritten: same files, untouched
    assert {n: (os.stat(store.shard_dir / n).st_ino, os.stat(store.shard_dir / n).st_mtime_ns)
            for n in first} == before
    assert_stored_once(store, summary.keys)


def test_what_lost_attempts_left_is_removed_once_every_part_is_committed(
        tiny_model_dir: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The files an attempt leaves when its actor is lost mid-write (cut off in its private
    temp name, or whole but never renamed onto the shard's) go at the job's end; another
    job's, which may still be writing, stay."""
    texts = sst2_texts(60, seed=5)
    enc = Encoder.load(tiny_model_dir, device="cpu")
    store = FeatureStore(tmp_path / "data")
    cut = store.shard_dir / "w1-00001.0123456789ab.h5.tmp"
    cut.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 500)  # the first bytes of an HDF5 file
    unrenamed = store.shard_dir / "w1-00003.89abcdef0123.h5"
    unrenamed.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 500)
    other = store.shard_dir / "w10-00001.0123456789ab.h5.tmp"
    other.write_bytes(b"another job's write in progress")
    caplog.set_level("INFO", logger="layerbank.ray")
    summary = extract_with_ray(texts, store, enc, job_id="w1", part_size=20, max_tokens=512,
                               actors=1, threads=1)
    assert summary.shards_written == 4
    assert store.catalog.shard_names() == {f"w1-0000{i}.h5" for i in range(4)}
    assert shard_files(store) == store.catalog.shard_names() | {other.name}
    assert "job w1: removed 2 files that lost parts' attempts left" in [r.getMessage() for r in caplog.records]


def test_worker_runs_dataset_jobs_on_ray(tiny_model_dir: str, tmp_path: Path) -> None:
    enc = Encoder.load(tiny_model_dir, device="cpu")
    store = FeatureStore(tmp_path / "data")
    backend = make_backend("ray", store, enc, part_size=30, max_tokens=512, ray_actors=2, threads=1)
    w = Worker(store, enc, WorkerOptions(part_size=30, max_tokens=512, progress_interval_s=0.01),
               backend=backend)
    texts = sst2_texts(90, seed=5)
    d = DatasetStore(store.catalog).create("d", texts, model="m", config=enc.config.canonical(),
                                           meta={"fingerprint": enc.fingerprint})
    extract_id = w.queue.submit("extract", {"dataset_id": d.id})
    encode_id = w.queue.submit("encode", {"texts": ["an urgent request"]}, priority=ENCODE_PRIORITY)
    w.run_job(w.queue.claim(w.id, ["extract"], 30))  # type: ignore[arg-type]
    ext, urgent = w.queue.get(extract_id), w.queue.get(encode_id)
    assert ext is not None and urgent is not None
    assert ext.state == "succeeded", ext.error
    assert (ext.result["texts_encoded"], ext.result["shards_written"]) == (91, 4)
    # the job record the API serves: done of total, and a rate
    assert ext.progress["done"] == ext.progress["total"] == 91
    assert ext.progress["tokens_per_second"] > 0
    # the driver committed the actors' shards under the job's part names
    assert store.catalog.shard_names() == {f"{extract_id}-{p:05d}.h5" for p in range(4)} | {
        f"{encode_id}-00000.h5"}
    # the urgent request ran on the worker's own encoder while the dataset job was open
    assert urgent.state == "succeeded" and ext.started < urgent.finished < ext.finished
    assert_stored_once(store, [*(store.key(enc.fingerprint, enc.config, t) for t in texts),
                               store.key(enc.fingerprint, enc.config, "an urgent request")])
    backend.close()  # its two actors hold the cluster's two logical GPUs


# A job on a warm pool shows its first encoded part within this many seconds of submission,
# and sooner than the pool took to start (what a job paid when it started its own actors).
# 5 s leaves room for a loaded machine; see the figures in docs/operations.md.
WARM_FIRST_PROGRESS_S = 5.0


@pytest.fixture(scope="module")
def warm_worker(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    """A worker as ``layerbank serve --backend ray --ray-actors 2`` starts it: pool started first.

    ``w.pool_start_s``: seconds until both actors had loaded the model."""
    enc = Encoder.load(tiny_model_dir, device="cpu")
    store = FeatureStore(tmp_path_factory.mktemp("warm") / "data")
    backend = make_backend("ray", store, enc, part_size=30, max_tokens=512, ray_actors=2, threads=1)
    t0 = time.monotonic()
    backend.start()  # type: ignore[attr-defined]
    backend.actor_pids()  # type: ignore[attr-defined]
    w = Worker(store, enc, WorkerOptions(part_size=30, max_tokens=512, progress_interval_s=0.01),
               backend=backend)
    w.pool_start_s = time.monotonic() - t0  # type: ignore[attr-defined]
    yield w
    backend.close()


def run_dataset_job(w: Worker, texts: list[str], name: str) -> tuple[str, float]:
    """Submit a dataset job, run it on a worker thread; its id and the seconds from submission
    until the job record first shows a text done (polled from this thread, as a client would)."""
    d = DatasetStore(w.store.catalog).create(name, texts, model="m", config=w.encoder.config.canonical(),
                                             meta={"fingerprint": w.encoder.fingerprint})
    job_id = w.queue.submit("extract", {"dataset_id": d.id})
    submitted = time.monotonic()
    runner = threading.Thread(target=lambda: w.run_job(w.queue.claim(w.id, ["extract"], 30)))  # type: ignore[arg-type]
    runner.start()
    first: float | None = None
    while first is None:
        rec = w.queue.get(job_id)
        assert rec is not None
        if (rec.progress or {}).get("done", 0) > 0 or rec.state in ("succeeded", "failed"):
            first = time.monotonic() - submitted
        else:
            time.sleep(0.02)
    runner.join(120)
    rec = w.queue.get(job_id)
    assert rec is not None and rec.state == "succeeded", rec and rec.error
    assert rec.result["texts_encoded"] == len(set(texts))
    return job_id, first


def test_consecutive_jobs_reuse_the_warm_actors(warm_worker: Worker) -> None:
    backend = warm_worker.backend
    warm = backend.actor_pids()  # type: ignore[attr-defined]
    assert len(set(warm)) == 2 and os.getpid() not in warm
    texts = sst2_texts(200, seed=6)  # [:60], [60:120] here, [120:] after the kill: disjoint
    run_dataset_job(warm_worker, texts[:60], "first")
    after_first = backend.actor_pids()  # type: ignore[attr-defined]
    _, first_progress_s = run_dataset_job(warm_worker, texts[60:120], "second")
    # the same two processes did both jobs: nothing was started or loaded per job
    assert backend.actor_pids() == after_first == warm  # type: ignore[attr-defined]
    for pid in warm:
        os.kill(pid, 0)  # still alive between jobs
    start_s = warm_worker.pool_start_s  # type: ignore[attr-defined]
    print(f"pool start {start_s:.2f} s; second job: first progress {first_progress_s:.2f} s after "
          f"submission, first batch {backend.last_first_batch_s:.2f} s after its start")  # type: ignore[attr-defined]
    assert first_progress_s < min(WARM_FIRST_PROGRESS_S, start_s)
    # what the backend measured: job start to the first encoded batch on an actor
    assert backend.last_first_batch_s is not None  # type: ignore[attr-defined]
    assert backend.last_first_batch_s < 3.0  # type: ignore[attr-defined]


def test_actor_killed_between_jobs_is_replaced(warm_worker: Worker, tmp_path: Path) -> None:
    backend = warm_worker.backend
    victim, survivor = backend.actor_pids()  # type: ignore[attr-defined]
    os.kill(victim, signal.SIGKILL)
    texts = sst2_texts(200, seed=6)[120:200]  # none stored by the jobs before
    job_id, _ = run_dataset_job(warm_worker, texts, "after-kill")
    now = backend.actor_pids()  # type: ignore[attr-defined]
    assert len(set(now)) == 2 and victim not in now and survivor in now
    # rows bit-identical to the embedded backend's, shard by shard under the same part names
    store, enc = warm_worker.store, warm_worker.encoder
    ref = FeatureStore(tmp_path / "ref", catalog_url="")  # a catalog of its own, whatever the test runs on
    extract(texts, ref, enc, job_id=job_id, part_size=30, max_tokens=512)
    assert shard_files(ref) == {n for n in shard_files(store) if n.startswith(job_id + "-")}
    for name in sorted(shard_files(ref)):
        da, db = read_shard(ref.shard_dir / name), read_shard(store.shard_dir / name)
        assert sorted(da) == sorted(db) and da["attrs"] == db["attrs"], name
        for k in da:
            if k != "attrs":
                np.testing.assert_array_equal(da[k], db[k], err_msg=f"{name}:{k}")
    # the dead actor's part was done again, stored once: no duplicate rows, no stray files
    job_rows = sum(store.catalog.shard_info(n)["n_rows"] for n in shard_files(ref))
    assert job_rows == len(set(texts))
    assert shard_files(store) == store.catalog.shard_names()

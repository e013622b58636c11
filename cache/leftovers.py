"""Crash leftovers removed by the next worker that starts, not only by ``serve``.

``layerbank serve`` cleans the data directory at start, under its lock, when
no writer can be running (``FeatureStore.clean``). A worker may start beside
live writers (a restarted worker under a running server, a second device), so
it removes only what no live writer can own:

- shard files (``<job>-<part>.h5.tmp``, or renamed ``.h5`` never committed) of
  jobs no live runner holds, last written before this worker started (a job
  claimed meanwhile by another worker writes its files afresh, so they are
  newer); compaction's files are left to ``serve``;
- head temp directories ``heads/.hd_<id>.tmp-<pid>-*`` whose process is dead;
- ``server.json`` whose server process is dead (a SIGKILLed ``serve``);
- a big request's texts file (``requests/<job>.json``, ``cache/request_texts.py``)
  whose job is over or gone, left by an API that died while it waited;
- temporary files of the derived files (``engines/onnx/*.tmp``: an ONNX
  export or its record; ``measured/*.tmp``: a measured decision) whose
  writer is dead: their names carry the writer's pid
  (``<final name>.<pid>-<random>.tmp``, workers/measured.py ``temp_name``); a
  name without one (written before pids were in it) older than this
  worker's start. A Bank killed during the ONNX export left one forever.

Call after ``release_orphans`` (so jobs of dead runners no longer count as held).
"""

from __future__ import annotations

import json
import logging
import re
import shutil

from .jobs import JobQueue, pid_alive
from .request_texts import requests_dir
from .store import FeatureStore

__all__ = ["clean_leftovers"]

log = logging.getLogger("layerbank.worker")


def _dead_pid(text: str) -> bool:
    return text.isdigit() and not pid_alive(int(text))


def clean_leftovers(store: FeatureStore, queue: JobQueue, *, started: float) -> dict[str, int]:
    """Remove crash leftovers older than ``started`` that no live writer owns; counts by kind."""
    held = set(queue.running_owners())
    removed = {"shard_files": 0, "head_temp_dirs": 0, "server_json": 0, "request_texts": 0,
               "engine_temp_files": 0}
    for s in sorted(store.storage.list(temp=True), key=lambda s: s.name):
        temp = s.name.endswith(".h5.tmp")
        name = s.name.removesuffix(".tmp")
        if not name.endswith(".h5") or name.startswith("compact-"):
            continue
        job = name.removesuffix(".h5").rpartition("-")[0]
        if job in held or s.mtime >= started:
            continue
        if not temp and store.catalog.shard_info(name) is not None:
            continue  # committed: not a leftover
        # its time asked again as it goes: a worker that claimed the job since writes it afresh
        if store.storage.delete(s.name, written_before=started):
            removed["shard_files"] += 1
    heads = store.root / "heads"
    if heads.is_dir():
        for d in heads.glob(".hd_*.tmp-*"):
            pid = d.name.rpartition(".tmp-")[2].split("-")[0]
            if _dead_pid(pid):
                shutil.rmtree(d, ignore_errors=True)
                removed["head_temp_dirs"] += 1
    info = store.root / "server.json"
    try:
        pid = str(json.loads(info.read_text()).get("pid", ""))
        if _dead_pid(pid):
            info.unlink(missing_ok=True)
            removed["server_json"] += 1
    except (OSError, ValueError, AttributeError):
        pass
    removed["request_texts"] = _request_texts(store, queue, started)
    removed["engine_temp_files"] = _derived_temps(store, started)
    if any(removed.values()):
        log.warning("removed crash leftovers: %d shard files, %d head temp directories, %d stale "
                    "server.json, %d request texts files, %d engine/measurement temp files",
                    removed["shard_files"], removed["head_temp_dirs"], removed["server_json"],
                    removed["request_texts"], removed["engine_temp_files"])
    return removed


# ``<final name>.<pid>-<hex>.tmp``: the writer's pid (workers/measured.py temp_name)
_TEMP_PID = re.compile(r"\.(\d+)-[0-9a-f]+\.tmp$")
_DERIVED_DIRS = ("engines/onnx", "measured")


def _derived_temps(store: FeatureStore, started: float) -> int:
    """Temp files of ONNX exports and measured decisions whose writer is dead (or, for a
    name without a pid, that are older than ``started``)."""
    n = 0
    for sub in _DERIVED_DIRS:
        d = store.root / sub
        if not d.is_dir():
            continue
        for p in d.glob("*.tmp"):
            m = _TEMP_PID.search(p.name)
            try:
                if m is not None:
                    if not _dead_pid(m.group(1)):
                        continue  # being written now, by a live process
                elif p.stat().st_mtime >= started:
                    continue
                p.unlink()
                n += 1
            except FileNotFoundError:
                continue
    return n


# an API writes a request's texts file just before it submits the job: a file this young
# may be one whose job is not in the catalog yet (another replica's, on a shared directory)
REQUEST_TEXTS_GRACE_S = 60.0


def _request_texts(store: FeatureStore, queue: JobQueue, started: float) -> int:
    """Texts files of requests whose job is no longer queued or running (its API died
    while waiting, so nobody removed the file); files written less than
    ``REQUEST_TEXTS_GRACE_S`` before ``started`` are left."""
    d = requests_dir(store.root)
    if not d.is_dir():
        return 0
    n = 0
    for p in d.iterdir():
        job_id = p.name.split(".", 1)[0]
        try:
            if p.stat().st_mtime >= started - REQUEST_TEXTS_GRACE_S:
                continue
        except FileNotFoundError:
            continue
        job = queue.get(job_id)
        if job is not None and job.state in ("queued", "running"):
            continue
        p.unlink(missing_ok=True)
        n += 1
    return n

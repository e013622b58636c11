"""What a probe or head job does, in the process that runs it (layerbank.app.api.probe_jobs.service
starts it in a process pool; nothing here touches the event loop).

``run_job(data_dir, job_id, owner, ...)`` opens the store itself (handles are
per process), reads the job's payload from the catalog, runs it and records
the outcome on the job row: ``finish`` with the result, ``fail`` with a
message a person can act on, or ``cancelled`` when ``DELETE /v1/jobs/{id}``
asked for it. It never raises: the pool only learns that the job is over.

Kinds and payloads (made by app/api/routes/probes.py and app/api/routes/heads.py)::

    probe  {"task": "sentence_classification", "dataset_id", "views", "poolings", "head",
            "cv", "seed", "control_task", "learning_curve", "train_sizes"}
           -> layerbank.app.probes.sweep.run_probe's result + "recommendation" (layerbank.app.probes.advice) + "dataset"
    probe  {"task": "token_classification", "train_id", "valid_id" | None, "valid_fraction",
            "views", "seed", "control_task", "word_mode", "span_f1" | None}
           -> layerbank.app.probes.token_probe.run_token_probe's result + "model", "datasets", "split", ...
    head   {"head_id", "dataset_id", "head", "view", "pooling", "seed"}
           -> {"head_id", "n_bytes", "classes", ...}; files under heads/<head_id>/

The lease, its heartbeat and the outcome are the one job runner's
(``layerbank.cache.runner``, shared with the extraction worker): a heartbeat
thread renews the job's lease every ``heartbeat_s`` and writes the latest
progress ({done, total, stage, eta_seconds}); a renewal refused (cancelled,
or the lease went elsewhere) stops the job at its next progress tick. If the
server that started this process dies, the process exits: the job is handed
to the next server by its lease (cache/jobs.py). Kinds are the ``RUNNERS``
map below.

Example (what the pool calls)::

    run_job("layerbank-data", "3f2a...", "host:123:probes", lease_s=30, heartbeat_s=5)
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from layerbank.app.api.probe_jobs.heads_store import HeadStore
from layerbank.app.probes.advice import head_bytes
from layerbank.app.probes.common import JobInputError, model_summary, split_sentences
from layerbank.app.probes.heads import save_head
from layerbank.app.probes.inputs import check_labels
from layerbank.app.probes.options import ProbeOptions
from layerbank.app.probes.sentence_probe import probe_sentences
from layerbank.app.probes.spans import is_bio_tag
from layerbank.app.probes.sweep import fit_head
from layerbank.app.probes.token_probe import run_token_probe
from layerbank.app.probes.word_views import word_views
from layerbank.app.probes.wordsets import TaggedSentence
from layerbank.cache.datasets import Dataset, DatasetItems, DatasetStore
from layerbank.cache.jobs import Job, JobQueue
from layerbank.cache.keys import text_key
from layerbank.cache.runner import SHOWN_AS_IS, Lease, Stopped, run_claimed
from layerbank.cache.store import FeatureStore

__all__ = ["RUNNERS", "Stopped", "dataset_keys", "run_job", "tagged_sentences"]

log = logging.getLogger("layerbank.probes")
_PROGRESS_WRITE_S = 0.5
# errors whose message is for the user as it is: every InputError (ProbeInputError, ViewError,
# WordSetError, TagSchemeError, JobInputError) and LookupError (deleted meanwhile, not extracted)
_USER_ERRORS = (*SHOWN_AS_IS, LookupError)


def dataset_keys(ds: Dataset, texts: Sequence[str]) -> list[str]:
    return [text_key(str(ds.meta.get("fingerprint", "")), ds.config, t) for t in texts]


def tagged_sentences(items: DatasetItems) -> list[TaggedSentence]:
    if items.words is None or items.tags is None:
        raise JobInputError("this dataset has no words and tags; a token probe needs a word/tag dataset")
    return [TaggedSentence(tuple(w), tuple(t)) for w, t in zip(items.words, items.tags)]


# -- the job's progress and cancellation, on the runner's lease ------------------------
class _Control:
    """Stages and done/total progress (with an ETA) for a probe job's lease."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.doc: dict[str, Any] = {"done": 0, "total": None, "stage": "starting"}
        self._started = time.monotonic()
        lease.doc = dict(self.doc)  # every heartbeat writes it from the start

    def stage(self, text: str) -> None:
        self.doc["stage"] = text
        self.lease.doc = dict(self.doc)
        self.check()

    def progress(self, done: int, total: int) -> None:
        elapsed = time.monotonic() - self._started
        self.doc.update(done=int(done), total=int(total), elapsed_seconds=round(elapsed, 2),
                        eta_seconds=round(elapsed / done * (total - done), 2) if done else None)
        self.lease.report(dict(self.doc), force=done == total)
        self.check()

    def check(self) -> None:
        self.lease.check()


def _exit_without_parent(job_id: str, parent_pid: int | None) -> Callable[[], None]:
    def on_beat() -> None:
        if parent_pid is not None and os.getpid() != parent_pid and os.getppid() != parent_pid:
            log.warning("job %s: the server that started it is gone; exiting", job_id)
            os._exit(3)  # the job's lease expires and the next server runs it again
    return on_beat


# -- running out of memory (a cancelled job's process is ended by the server: service.py) --
class ProbeOutOfMemory(JobInputError):
    """The job outgrew its process's memory limit (settings.probe_memory_mb)."""


def _memory_message(e: MemoryError) -> str:
    limit = os.environ.get("LAYERBANK_PROBE_MEMORY_LIMIT_MB")
    within = f" of {limit} MB (probe_memory_mb plus the process's own)" if limit else ""
    return (f"the job ran out of memory: it needed more than its process's limit{within} ({e}); "
            "use fewer layers in a view, fewer classes or fewer texts, or raise probe_memory_mb")


# -- the entry point ------------------------------------------------------------------
def run_job(data_dir: str, job_id: str, owner: str, lease_s: float = 30.0, heartbeat_s: float = 5.0,
            parent_pid: int | None = None) -> str:
    """Run one claimed job to its end and record the outcome; returns the final state.

    A job cancelled while it computes stops at its next progress check, or sooner: the
    server ends the pool process that runs it (app/api/probe_jobs/service.py)."""
    store = FeatureStore(data_dir)
    queue = JobQueue(store.catalog)
    try:
        job = queue.get(job_id)
        if job is None or job.state != "running":
            return "gone"
        lease = Lease(queue, job, owner, lease_s=lease_s, heartbeat_s=heartbeat_s,
                      progress_interval_s=_PROGRESS_WRITE_S, on_beat=_exit_without_parent(job_id, parent_pid))
        ctl = _Control(lease)
        runner = RUNNERS.get(job.kind)

        def run() -> dict[str, Any]:
            if runner is None:
                raise JobInputError(f"no probe runner for jobs of kind {job.kind!r}")
            try:
                return runner(job, store, ctl)
            except MemoryError as e:  # the process's limit (app/api/probe_jobs/service.py), not the host's
                raise ProbeOutOfMemory(_memory_message(e)) from None

        return run_claimed(queue, job, owner, run, lease, shown=_USER_ERRORS)
    finally:
        store.close()


def _runtime() -> dict[str, Any]:
    """Where the job ran: its process and the BLAS threads it was allowed."""
    from threadpoolctl import threadpool_info

    threads = [int(p.get("num_threads", 0)) for p in threadpool_info() if p.get("user_api") == "blas"]
    return {"pid": os.getpid(), "blas_threads": max(threads) if threads else None}


def _dataset(store: FeatureStore, dataset_id: str) -> tuple[Dataset, DatasetItems, dict[str, Any]]:
    datasets = DatasetStore(store.catalog)
    ds = datasets.get(dataset_id)
    if ds is None:
        raise JobInputError(f"dataset {dataset_id} was deleted before the job ran")
    fp = str(ds.meta.get("fingerprint", ""))
    info = store.catalog.model_info(fp)
    if info is None:
        raise JobInputError(f"dataset {dataset_id} was extracted with a model this store does not know")
    return ds, datasets.items(dataset_id), info


def _read_states(store: FeatureStore, keys: list[str], pooling: str, what: str) -> np.ndarray:
    res = store.read_pooled(keys, pooling)
    lost = len(keys) - int(res.found.sum())
    if lost and (older := store.lookup([k for k, ok in zip(keys, res.found) if not ok])):
        raise JobInputError(f"{len(older)} of the {what}'s texts were stored before pooling {pooling!r} was "
                            "set; upload the dataset again to compute it for them")
    if lost:
        raise JobInputError(f"{lost} of the {what}'s {len(keys)} texts are no longer stored (a damaged "
                            "shard was quarantined); upload the dataset again to recompute them")
    return res.data


def _storage_dtype(info: dict[str, Any] | None) -> str:
    """The dtype the model's states were stored in (its catalog info): the heads' noise floor."""
    return str((info or {}).get("storage_dtype") or "float16")


def _run_probe(job: Job, store: FeatureStore, ctl: _Control) -> dict[str, Any]:
    p = job.payload
    if p.get("task") == "token_classification":
        return _run_token_probe(job, store, ctl)
    ds, items, info = _dataset(store, p["dataset_id"])
    model = model_summary(info, str(ds.meta.get("fingerprint", "")))
    keys = dataset_keys(ds, items.texts)

    def get_states(pooling: str) -> np.ndarray:
        ctl.stage(f"reading {pooling}-pooled hidden states")
        states = _read_states(store, keys, pooling, "dataset")
        ctl.stage("fitting")
        return states

    options = ProbeOptions.from_payload(p, threads=1, storage_dtype=_storage_dtype(info))
    result = probe_sentences(get_states, items.labels, options=options, model=model, progress=ctl.progress)
    result["dataset"] = {"id": ds.id, "name": ds.name, "n_items": ds.n_items}
    result["runtime"] = _runtime()
    return result


def _run_token_probe(job: Job, store: FeatureStore, ctl: _Control) -> dict[str, Any]:
    p = job.payload
    train_ds, train_items, info = _dataset(store, p["train_id"])
    fp = str(train_ds.meta.get("fingerprint", ""))
    train = tagged_sentences(train_items)
    split: dict[str, Any]
    if p.get("valid_id"):
        valid_ds, valid_items, _ = _dataset(store, p["valid_id"])
        if (str(valid_ds.meta.get("fingerprint", "")), valid_ds.config) != (fp, train_ds.config):
            raise JobInputError("the train and valid datasets were extracted with different models or "
                                "extraction configs; their word states cannot be compared")
        valid = tagged_sentences(valid_items)
        split = {"method": "datasets", "train": train_ds.id, "valid": valid_ds.id}
    else:
        tr, va = split_sentences(len(train), float(p["valid_fraction"]), int(p["seed"]))
        train, valid = [train[i] for i in tr], [train[i] for i in va]
        split = {"method": "seeded split of one dataset", "dataset": train_ds.id,
                 "valid_fraction": p["valid_fraction"], "seed": p["seed"]}
    span_f1 = p.get("span_f1")
    if span_f1 is None:  # BIO tags: entity F1; anything else (POS ...): word accuracy only
        span_f1 = all(is_bio_tag(t) for s in train + valid for t in s.tags)
    ctl.progress(0, 3)
    ctl.stage("reading word states (train)")
    # read view by view while the tagger runs (word_views): one view's matrix in memory, not every layer
    train_states = word_views(store, fp, train_ds.config, train, mode=p["word_mode"])
    ctl.progress(1, 3)
    ctl.stage("reading word states (valid)")
    valid_states = word_views(store, fp, train_ds.config, valid, mode=p["word_mode"])
    ctl.progress(2, 3)
    ctl.stage("fitting one tagger per view")
    # after the two reads, one step per fit (tagger, control head, MDL): the ETA covers the fitting,
    # which on a large set is most of the job
    # the ignore: WordStatesLike (app/probes/token_probe.py) names only the in-memory shape;
    # run_token_probe reads a LazyWordStates through its view_matrix (hasattr), view by view
    result = run_token_probe(train_states, valid_states,  # type: ignore[arg-type]  # lazy: see above
                             views=p["views"], seed=int(p["seed"]),
                             control_task=bool(p["control_task"]), span_f1=bool(span_f1),
                             mdl=bool(p.get("mdl", True)),  # jobs queued before MDL existed: on
                             progress=lambda done, total: ctl.progress(2 + done, 2 + total))
    best = next(r for r in result["rows"] if r["view"] == result["best"])
    metric = result["metric"]
    control = "" if best["control_accuracy"] is None else (
        f"; on control tags (a fixed random tag per word type) it scores {best['control_accuracy']:.3f}"
        f" word accuracy, selectivity {best['selectivity']:.3f}")
    result.update(task={"name": "token_classification"}, model=model_summary(info, fp), word_mode=p["word_mode"],
                  split=split, n_sentences={"train": len(train), "valid": len(valid)},
                  summary=f"Best view: {best['view']} with {metric.replace('_', ' ')} {best[metric]:.3f} "
                          f"(word accuracy {best['word_accuracy']:.3f}){control}.",
                  runtime=_runtime())
    return result


def _run_head(job: Job, store: FeatureStore, ctl: _Control) -> dict[str, Any]:
    p = job.payload
    heads = HeadStore(store.catalog, store.root)
    rec = heads.get(p["head_id"])
    if rec is None:
        raise JobInputError(f"head {p['head_id']} was deleted before it was fitted")
    ds, items, info = _dataset(store, p["dataset_id"])
    ctl.progress(0, 2)
    ctl.stage(f"reading {p['pooling']}-pooled hidden states")
    states = _read_states(store, dataset_keys(ds, items.texts), p["pooling"], "dataset")
    ctl.stage("fitting")
    labels = items.labels
    head = fit_head(states, labels, p["view"], head=p["head"], seed=int(p["seed"]), threads=1,
                    storage_dtype=_storage_dtype(info))
    ctl.progress(1, 2)
    # cancelled while fitting: write nothing. Ask the catalog now (a lease renewal is refused
    # once a cancel was asked for): the last heartbeat may be seconds old
    ctl.lease.write()
    ctl.check()
    # the classes as fit_head saw them (check_labels): the dataset's label type, so ints stay ints
    classes, counts = np.unique(check_labels(labels, cv=1), return_counts=True)
    model = model_summary(info, rec.fingerprint)
    meta = {"layerbank_head_id": rec.id, "name": rec.name, "view": p["view"], "pooling": p["pooling"],
            "model": model, "extraction_config": rec.config,
            "dataset": {"id": ds.id, "name": ds.name, "n_items": ds.n_items},
            "classes": [c.item() for c in classes], "label_type": ds.meta.get("label_type", "str"),
            "class_counts": {str(c): int(k) for c, k in zip(classes, counts)},
            "n_examples": len(labels), "seed": int(p["seed"]), "input_shape": _input_shape(p["view"], states),
            # the size the advice, the head's storage and the lab show (advice.head_bytes)
            "weight_bytes": head_bytes({a: getattr(head, a) for a in head._arrays}),
            "from_probe": p.get("from_probe")}
    tmp = heads.temp_directory(rec.id)
    save_head(head, tmp, meta)
    rec = heads.publish(rec.id, tmp, meta)
    ctl.progress(2, 2)
    return {"head_id": rec.id, "n_bytes": rec.n_bytes, "classes": meta["classes"],
            "n_examples": meta["n_examples"], "runtime": _runtime()}


def _input_shape(view: str, states: np.ndarray) -> list[int]:
    """Shape of one input row the head reads: [H, d] for a scalar mix, else [dim]."""
    if view == "scalar_mix":
        return list(states.shape[1:])
    from layerbank.cache.views import parse_view

    return [parse_view(view).output_dim(states.shape[1], states.shape[2])]


# kind -> what runs it (the pool in layerbank.app.api.probe_jobs.service claims jobs of these kinds)
RUNNERS: dict[str, Callable[[Job, FeatureStore, _Control], dict[str, Any]]] = {
    "probe": _run_probe, "head": _run_head}

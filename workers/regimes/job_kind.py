"""The ``regimes`` job kind: freeze or fine-tune, measured, run by the worker.

Payload (built and checked by ``app/api/routes/regimes.py``)::

    {"dataset_id": str, "regimes": [...], "seeds": int, "top_k": int | [int] | None,
     "xi": float | [float] | None,
     "train_sizes": [int] | None, "max_epochs": int, "patience": int, "split_seed": int}

The handler reads the dataset's texts and labels from the catalog, takes the
frozen features (mean-pooled ``[n, L + 1, d]``) from the store when every text
is there (otherwise ``run_regimes`` computes them), and calls
``layerbank.workers.regimes.run.run_regimes`` on the worker's model and device with the
worker's ``max_length``, so the trained regimes see the same tokens the store
was built from. With a memory limit (``WorkerOptions.job_memory_mb``, which
``layerbank worker`` sets from ``probe_memory_mb``) it runs in a process of its own
under that limit (``layerbank.workers.regimes.process``): an overrun is a failed job
saying so, and a cancel kills that process. Trained tensors (heads, biases, adapters, layers) go to
``<data dir>/regimes/<job id>/`` as safetensors, never into the model
directory; a cancelled job's directory is removed. Progress is reported as
``{"done", "total"}`` in epochs (one per frozen probe); cancellation is polled
before every training step through ``ctx.should_continue()``, which also runs
waiting ``encode`` jobs, so HTTP requests are served during a long fine-tune.

Example (what the worker does with a claimed job)::

    result = run_regimes_job(ctx)
    result["best"], result["cheapest_within_one_std"], result["artifacts_dir"]
"""

from __future__ import annotations

import shutil
from typing import Any

import numpy as np

from layerbank.cache.keys import text_key
from layerbank.workers.jobs_registry import JobContext, JobError, register_kind
from layerbank.workers.regimes.options import RegimesOptions
from layerbank.workers.regimes.resources import Cancelled

__all__ = ["frozen_features", "run_regimes_job"]


def frozen_features(ctx: JobContext, texts: list[str]) -> np.ndarray | None:
    """The store's mean-pooled states of ``texts``, or None when any is missing."""
    enc = ctx.encoder
    keys = [text_key(enc.fingerprint, enc.config, t) for t in texts]
    read = ctx.store.read_pooled(keys, "mean")
    if not read.found.all():  # evicted or never extracted: run_regimes encodes them itself
        return None
    return read.data


@register_kind("regimes")
def run_regimes_job(ctx: JobContext) -> dict[str, Any]:
    """Run every requested regime on a labelled dataset; the job's result is run_regimes'."""
    p = ctx.job.payload
    ds_id = p["dataset_id"]
    ds = ctx.datasets.get(ds_id)
    if ds is None:
        raise JobError(f"dataset {ds_id} was deleted before its regimes job ran")
    enc = ctx.encoder
    if ds.meta.get("fingerprint", enc.fingerprint) != enc.fingerprint:
        raise JobError(f"dataset {ds_id} was extracted with model {ds.model!r}; this worker serves "
                       f"{enc.info.get('name')!r} ({enc.fingerprint})")
    items = ctx.datasets.items(ds_id)
    if items.words is not None or any(label is None for label in items.labels):
        raise JobError(f"dataset {ds_id} needs a label for every text to compare regimes")
    eval_sets = {}
    for eval_id in p.get("eval_datasets") or []:  # checked by the route; gone since is a job error
        if ctx.datasets.get(eval_id) is None:
            raise JobError(f"evaluation dataset {eval_id} was deleted before the regimes job ran")
        eval_items = ctx.datasets.items(eval_id)
        eval_sets[eval_id] = (eval_items.texts, eval_items.labels)
    out_dir = ctx.store.root / "regimes" / ctx.job.id
    now = {"stage": "starting"}  # which regime and seed: shown with done/total in the job's progress
    try:
        options = RegimesOptions.from_payload(p, max_length=int(enc.config.max_length or 512),
                                              device=str(enc.device),
                                              storage_dtype=str(enc.config.storage_dtype))
        memory_mb = getattr(ctx.options, "job_memory_mb", None)
        if memory_mb:  # a process of its own under the memory limit (workers/regimes/process.py)
            from layerbank.workers.regimes.process import run_in_process

            result = run_in_process(
                ctx, items.texts, items.labels, options, model_path=enc.name,
                frozen_features=frozen_features(ctx, items.texts), out_dir=out_dir, eval_sets=eval_sets,
                memory_mb=int(memory_mb),
                on_progress=lambda done, total: ctx.progress({"done": done, "total": total, **now}),
                on_stage=lambda text: now.update(stage=text))
        else:  # in this process (in-process workers of the tests and Bank): no limit
            from layerbank.workers.regimes.run import run_regimes  # torch, peft: only when a regimes job runs

            result = run_regimes(
                items.texts, items.labels, options, model_path=enc.name,
                frozen_features=frozen_features(ctx, items.texts), out_dir=out_dir,
                progress=lambda done, total: ctx.progress({"done": done, "total": total, **now}),
                should_cancel=lambda: not ctx.should_continue(), stage=lambda text: now.update(stage=text),
                eval_sets=eval_sets)
    except Cancelled:
        shutil.rmtree(out_dir, ignore_errors=True)  # half a comparison is of no use to anyone
        raise
    except ValueError as e:  # run_regimes' input checks: the job cannot run as submitted
        raise JobError(f"dataset {ds_id}: {e}") from None
    result["dataset_id"] = ds_id
    result["artifacts_dir"] = f"regimes/{ctx.job.id}"  # relative to the data directory
    return result

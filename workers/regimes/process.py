"""A regimes job in a process of its own, under a memory limit, so one fine-tune cannot
take the host's memory (issue 25, row 3: probe processes had a limit, regimes jobs none).

The worker that claimed the job starts one spawned process per job and waits
for it, relaying what it says (progress, stage, the result) and serving
urgent ``encode`` jobs meanwhile (``ctx.should_continue()``), so HTTP misses
are answered during a long fine-tune. The child:

- on CPU: runs under an address-space limit (RLIMIT_AS) of what it holds
  after its imports plus ``memory_mb`` (``settings.probe_memory_mb``, the
  budget the request was costed against in app/api/routes/regimes.py) plus
  ``PROCESS_SLACK_MB``; glibc's per-thread malloc arenas are capped first
  (each reserves 64 MB of address space that the limit would count);
- on CUDA: RLIMIT_AS would break the driver, whose mappings are address
  space; the child's share of the GPU is capped instead
  (``torch.cuda.set_per_process_memory_fraction``).

An allocation past the limit (numpy's ``MemoryError``, torch's "can't
allocate memory", CUDA's out-of-memory) ends the job as failed with
``RegimesOutOfMemory``: what ran out, the limit and what to change. A child
killed from outside (the kernel's OOM killer) fails the job naming the signal.
Cancelling (or a worker that stops) kills the child, which gives its memory
back at once, and raises ``Cancelled``.

Example (what ``job_kind.run_regimes_job`` does when the worker has a limit)::

    result = run_in_process(ctx, texts, labels, options, model_path=path, frozen_features=feats,
                            out_dir=out, eval_sets={}, memory_mb=8192, on_progress=..., on_stage=...)
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import multiprocessing
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from layerbank.workers.jobs_registry import JobContext, JobError
from layerbank.workers.regimes.resources import Cancelled

__all__ = ["PROCESS_SLACK_MB", "RegimesOutOfMemory", "run_in_process"]

log = logging.getLogger("layerbank.worker")

# thread stacks, the allocator's slack and lazily imported modules on top of the job's budget
PROCESS_SLACK_MB = 512
# what the child runs, by import name: the one seam a test uses to put a memory hog in its place
TRAIN = "layerbank.workers.regimes.run:run_regimes"
_POLL_S = 0.2
_M_ARENA_MAX = -8  # glibc mallopt parameter


class RegimesOutOfMemory(JobError):
    """The regimes job outgrew its process's memory limit (settings.probe_memory_mb)."""


def _limit_memory(memory_mb: int, device: str) -> str:
    """Cap this process's memory; returns what was capped, for the failure's message."""
    budget = int(memory_mb) * 2**20
    if device.startswith("cuda"):
        import torch

        dev = torch.device(device)
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), dev)
        return f"{memory_mb} MB of GPU memory"
    import resource

    import psutil

    try:
        ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, 2)
    except (OSError, AttributeError):  # not glibc
        pass
    held = psutil.Process().memory_info().vms
    limit = held + budget + PROCESS_SLACK_MB * 2**20
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return f"{memory_mb} MB (plus {PROCESS_SLACK_MB} MB of slack over the {held / 2**20:.0f} MB its imports hold)"


def _out_of_memory(e: BaseException) -> bool:
    if isinstance(e, MemoryError):
        return True
    text = str(e)
    return type(e).__name__ == "OutOfMemoryError" or "can't allocate memory" in text or \
        "out of memory" in text.lower()


def _child(conn: Any, train: str, memory_mb: int, threads: int, kwargs: dict[str, Any]) -> None:
    """The spawned process: imports, caps its memory, trains, says how it went."""
    try:
        module, name = train.split(":")
        fn = getattr(importlib.import_module(module), name)
        from layerbank.workers.encoder import set_threads

        set_threads(threads)
        options = kwargs["options"]
        what = _limit_memory(memory_mb, str(getattr(options, "device", "cpu")))
        try:
            result = fn(kwargs.pop("texts"), kwargs.pop("labels"), **kwargs,
                        progress=lambda done, total: conn.send(("progress", int(done), int(total))),
                        stage=lambda text: conn.send(("stage", str(text))))
        except BaseException as e:  # noqa: BLE001  (every outcome goes to the parent)
            if _out_of_memory(e):
                conn.send(("memory", f"{type(e).__name__}: {e}", what))
            elif isinstance(e, ValueError):
                conn.send(("input", str(e)))
            else:
                conn.send(("error", f"{type(e).__name__}: {e}", traceback.format_exc()))
            return
        conn.send(("result", result))
    finally:
        conn.close()


def run_in_process(ctx: JobContext, texts: Sequence[str], labels: Sequence[Any], options: Any, *,
                   model_path: str, frozen_features: Any, out_dir: Any,
                   eval_sets: Mapping[str, Any], memory_mb: int,
                   on_progress: Callable[[int, int], None], on_stage: Callable[[str], None]) -> dict[str, Any]:
    """Run the regimes in a child process under ``memory_mb`` (module docstring).

    Raises ``RegimesOutOfMemory`` or ``JobError`` (a failed job, with the reason),
    ``ValueError`` for input ``run_regimes`` refused, ``Cancelled`` when the job is
    cancelled or the worker stops (the child killed)."""
    import torch  # the parent's thread count: the child runs with the same

    mp = multiprocessing.get_context("spawn")
    parent_end, child_end = mp.Pipe(duplex=False)
    kwargs = {"texts": list(texts), "labels": list(labels), "options": options, "model_path": model_path,
              "frozen_features": frozen_features, "out_dir": str(out_dir), "eval_sets": dict(eval_sets)}
    proc = mp.Process(target=_child, args=(child_end, TRAIN, int(memory_mb), torch.get_num_threads(), kwargs),
                      name=f"regimes-{ctx.job.id}", daemon=True)
    proc.start()
    child_end.close()  # the parent's copy: EOF once the child's end is closed
    log.info("job %s: regimes process %d started (memory limit %d MB)", ctx.job.id, proc.pid, memory_mb)
    try:
        while True:
            if parent_end.poll(_POLL_S):
                try:
                    msg = parent_end.recv()
                except EOFError:  # the child is gone without a word
                    break
                kind = msg[0]
                if kind == "progress":
                    on_progress(msg[1], msg[2])
                elif kind == "stage":
                    on_stage(msg[1])
                elif kind == "result":
                    return dict(msg[1])
                elif kind == "memory":
                    raise RegimesOutOfMemory(
                        f"the regimes job ran out of memory: it needed more than its process's limit of "
                        f"{msg[2]} ({msg[1]}); use fewer texts, regimes or seeds, a smaller batch_size, or "
                        "raise probe_memory_mb (LAYERBANK_PROBE_MEMORY_MB)")
                elif kind == "input":
                    raise ValueError(msg[1])
                else:
                    log.error("job %s: the regimes process failed:\n%s", ctx.job.id, msg[2])
                    raise RuntimeError(msg[1])
            elif not proc.is_alive() and not parent_end.poll(0):
                break
            if not ctx.should_continue():
                raise Cancelled("regimes job cancelled")
        proc.join(5)
        code = proc.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with status {code}"
        hint = " (signal 9: probably the kernel's out-of-memory killer)" if code == -9 else ""
        raise JobError(f"the regimes process {how}{hint} before it reported a result")
    finally:
        parent_end.close()
        if proc.is_alive():  # cancelled, failed, or the worker stops: its memory back now
            proc.kill()
        proc.join(10)

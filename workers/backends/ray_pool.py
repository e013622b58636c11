"""A pool of long-lived encoder actors on Ray, kept warm across jobs.

Starting an actor process and loading the model in it costs seconds (about
19 s per job on the 2-core development machine when every job started its
own). ``EncoderPool`` starts ``size`` ``ShardEncoder`` actors once (a
server's worker does it at start-up) and hands them part after part, job
after job. A job on a warm pool starts encoding as soon as it has planned
its parts.

Failures: an actor that died (killed, OOM, its node gone) is noticed when
its next part fails with ``RayActorError``, or when its start fails; it is
replaced by a new actor and the part goes back on the queue, so a part runs
at least once and its shard (named by job and part) is rewritten, never
duplicated. More than ``MAX_CONSECUTIVE_DEATHS`` deaths in a row without
a part done (a model that cannot load anywhere) fail the job.

Parts go only to actors that answered their first call (ready), so a
replacement that waits for a resource (its GPU went with its node) holds no
work; up to ``IN_FLIGHT`` parts wait on each actor so it never idles
between parts while the driver commits.

Example::

    pool = EncoderPool(spec, store.storage, size=2, gpus_per_actor=0, threads=1)
    pool.start()
    for meta in pool.run(parts, want_tokens=False, tick_s=1.0):
        ...   # None on each tick without a finished part
    pool.close()
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from layerbank.cache.storage import ShardStorage

log = logging.getLogger("layerbank.ray")

__all__ = ["EncoderPool", "MAX_CONSECUTIVE_DEATHS", "PoolError"]

MAX_CONSECUTIVE_DEATHS = 3  # as Ray Data allowed before: a node going away, not a broken model
IN_FLIGHT = 2  # parts queued on one actor: it starts the next while the driver commits the last


class PoolError(RuntimeError):
    """The pool cannot do the work (actors keep dying, or the encoder raised)."""


@dataclass
class _Slot:
    actor: Any
    ready_ref: Any  # the actor's pid, once it has loaded the model
    pid: int | None = None
    inflight: int = 0


@dataclass
class EncoderPool:
    """``size`` encoder actors for one encoder ``spec`` (model, precision, config).

    ``gpus_per_actor``: None = 1 when the cluster has GPUs, else 0 (then one
    CPU each). ``threads``: torch threads per actor. ``fault``: tests only
    (see ``ShardEncoder``).
    """

    spec: dict[str, Any]
    storage: ShardStorage  # where the actors' shards go (the driver's store's)
    size: int = 1
    gpus_per_actor: float | None = None
    threads: int | None = None
    max_tokens: int | None = None
    fault: dict[str, str] | None = None
    slots: list[_Slot] = field(default_factory=list, init=False)
    # parts a stopped run left running: close() lets them finish, so no half-written file stays
    unfinished: list[Any] = field(default_factory=list, init=False)

    def start(self) -> None:
        """Create the actors; returns at once (they load the model in the background)."""
        import ray

        if self.gpus_per_actor is None:
            self.gpus_per_actor = 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0
        while len(self.slots) < self.size:
            self.slots.append(self._new_slot())

    def _new_slot(self) -> _Slot:
        import ray

        from .ray_actor import ShardEncoder

        gpus = self.gpus_per_actor or 0.0
        # a GPU actor reserves no CPU, so a node's CPUs stay free for other work;
        # max_restarts=0: this pool replaces a dead actor itself and re-queues its parts
        cls = ray.remote(ShardEncoder).options(num_gpus=gpus, num_cpus=0 if gpus else 1,
                                               max_restarts=0)
        actor = cls.remote(self.spec, self.storage, self.max_tokens, self.threads,
                           self.fault)
        return _Slot(actor, actor.pid.remote())  # type: ignore[attr-defined]  # ray adds .remote at runtime

    def pids(self, timeout_s: float = 120.0) -> list[int]:
        """The actors' process ids, waiting for those still loading the model."""
        import ray

        self.start()
        return [int(p) for p in ray.get([s.ready_ref for s in self.slots], timeout=timeout_s)]

    def run(self, parts: list[dict[str, Any]], want_tokens: bool,
            tick_s: float) -> Generator[dict[str, Any] | None, None, None]:
        """Yield each part's metadata as its shard lands; None every ``tick_s`` without one.

        ``parts``: dicts with ``name``, ``keys`` and ``texts``. Leaving the
        loop early (the caller stopped) cancels the parts not yet started.
        """
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        self.start()
        todo = collections.deque(parts)
        running: dict[Any, tuple[_Slot, dict[str, Any]]] = {}
        deaths = 0
        try:
            while todo or running:
                for slot in self.slots:
                    while slot.pid is not None and slot.inflight < IN_FLIGHT and todo:
                        part = todo.popleft()
                        ref = slot.actor.encode.remote(part["name"], part["keys"], part["texts"],
                                                       want_tokens)
                        running[ref] = (slot, part)
                        slot.inflight += 1
                starting = {s.ready_ref: s for s in self.slots if s.pid is None}
                ready, _ = ray.wait([*running, *starting], num_returns=1, timeout=tick_s)
                if not ready:
                    yield None
                    continue
                ref = ready[0]
                if ref in starting:
                    slot = starting[ref]
                    try:
                        slot.pid = int(ray.get(ref))
                        log.info("Ray encoder actor ready: pid %d", slot.pid)
                    except RayActorError as e:  # died while loading the model
                        deaths = self._replace(slot, deaths, e)
                    continue
                slot, part = running.pop(ref)
                slot.inflight -= 1
                try:
                    meta = ray.get(ref)
                except RayActorError as e:
                    todo.appendleft(part)  # at least once: the shard name is the part's
                    deaths = self._replace(slot, deaths, e)
                    continue
                except (RayTaskError, GetTimeoutError) as e:
                    raise PoolError(str(e)) from e
                deaths = 0
                yield meta
        finally:
            for ref in running:  # parts not started yet: leave the warm actors free
                try:
                    ray.cancel(ref)
                except Exception:  # noqa: BLE001  (already running or done: it finishes harmlessly)
                    pass
            for slot, _ in running.values():
                slot.inflight = 0
            self.unfinished = list(running)

    def _replace(self, slot: _Slot, deaths: int, error: BaseException) -> int:
        if slot in self.slots:  # its other parts in flight fail too: one death, one replacement
            import ray

            deaths += 1

            log.warning("Ray encoder actor (pid %s) died; starting a new one: %s", slot.pid,
                        str(error).splitlines()[0] if str(error) else type(error).__name__)
            try:
                ray.kill(slot.actor)
            except Exception:  # noqa: BLE001  (it is gone already)
                pass
            self.slots[self.slots.index(slot)] = self._new_slot()
        if deaths > MAX_CONSECUTIVE_DEATHS:
            raise PoolError(f"{deaths} encoder actors died in a row: {error}") from error
        return deaths

    def close(self) -> None:
        """Stop the actors (their processes exit; GPUs and CPUs are freed)."""
        import ray

        if self.unfinished:
            try:
                ray.wait(self.unfinished, num_returns=len(self.unfinished), timeout=60)
            except Exception:  # noqa: BLE001  (Ray already shut down)
                pass
            self.unfinished = []
        for slot in self.slots:
            try:
                ray.kill(slot.actor)
            except Exception:  # noqa: BLE001  (Ray already shut down, or the actor is gone)
                pass
        self.slots = []

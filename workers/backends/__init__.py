"""Where extraction runs: one small interface, two backends (this process, or Ray actors).

One of the two axes of ``workers/``: this package says *where* the encoder runs;
``workers/engines/`` says *what* runs its forward pass (torch or ONNX Runtime).
The Ray backend is the three ``ray_*`` modules here (driver, pool, actor).

``ExtractionBackend.run(texts, job_id, want_tokens, progress, should_continue)``
encodes the texts not yet stored and commits their shards to the store's
catalog, returning an ``ExtractSummary``. Both backends plan a job the same
way (the job's unique texts in length order, cut into parts; part ``p`` is
shard ``{job_id}-{p:05d}``), so they store the same shards with the same
numbers, and a job re-run on either skips parts the other committed.

- ``EmbeddedBackend``: this process's encoder (``layerbank.workers.extract.extract``);
  the default, no extra services.
- ``RayBackend``: a warm pool of encoder actors on a Ray cluster
  (``layerbank.workers.backends.ray_backend``); needs ``pip install 'layerbank[ray]'``. The
  catalog stays here: actors hand their rows to the store's shard storage
  (the shared shard directory by default) and only this process commits them.

``progress`` receives a ``layerbank.workers.extract.Progress`` (done, total, tokens,
tokens per second, ETA). ``should_continue`` is asked between units of work
(batches; for Ray, at least once a second); when it returns False the run
raises ``layerbank.workers.extract.Stopped`` and committed parts stay valid.

Example::

    backend = make_backend("ray", store, encoder, ray_address="local", ray_actors=2)
    try:
        summary = backend.run(texts, "job-1", progress=print)
    finally:
        backend.close()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from layerbank.cache.store import FeatureStore

from ..encoder import Encoder
from ..extract import ExtractSummary, Progress, extract

if TYPE_CHECKING:
    from .ray_pool import EncoderPool

__all__ = ["BACKENDS", "EmbeddedBackend", "ExtractionBackend", "RayBackend", "make_backend"]

BACKENDS = ("embedded", "ray")

ProgressFn = Callable[[Progress], None]
ContinueFn = Callable[[], bool]


@runtime_checkable
class ExtractionBackend(Protocol):
    """Encode what is missing, commit shards, say what was done."""

    name: str

    def run(self, texts: Sequence[str], job_id: str, want_tokens: bool = False,
            progress: ProgressFn | None = None, should_continue: ContinueFn | None = None,
            encoder: Encoder | None = None) -> ExtractSummary:
        """``encoder``: the backend's own at another precision (None: its own)."""

    def close(self) -> None: ...


class EmbeddedBackend:
    """The encoder in this process (one device), batches under a token budget."""

    name = "embedded"

    def __init__(self, store: FeatureStore, encoder: Encoder, *, part_size: int = 2048,
                 max_tokens: int | None = None) -> None:
        self.store = store
        self.encoder = encoder
        self.part_size = part_size
        self.max_tokens = max_tokens

    def run(self, texts: Sequence[str], job_id: str, want_tokens: bool = False,
            progress: ProgressFn | None = None, should_continue: ContinueFn | None = None,
            encoder: Encoder | None = None) -> ExtractSummary:
        return extract(texts, self.store, encoder or self.encoder, job_id=job_id, want_tokens=want_tokens,
                       part_size=self.part_size, max_tokens=self.max_tokens, progress=progress,
                       should_continue=should_continue)

    def close(self) -> None:
        pass


class RayBackend:
    """A warm pool of encoder actors on a Ray cluster; shards land in the store's storage (shared).

    ``encoder`` is the driver's copy: it makes the keys, and tells the actors
    which model and config to load (they refuse to work if theirs differ).
    ``address``: ``local``, ``auto``, ``host:port``, ``ray://host:10001`` or
    None (Ray's own default). ``start()`` connects and starts the pool
    (a server's worker calls it at start-up, so the actors load the model
    before the first job); otherwise the first run does. The actors are
    reused by every job until ``close()``; a job at another precision gets a
    new pool (its actors load that precision). ``actors``: pool size (one GPU
    each when the cluster has GPUs). ``threads``: torch threads per actor
    (None: all cores). ``last_first_batch_s``: seconds from the last job's
    start to its first encoded batch (what a warm pool saves).
    """

    name = "ray"

    def __init__(self, store: FeatureStore, encoder: Encoder, *, address: str | None = None,
                 actors: int = 1, gpus_per_actor: float | None = None, threads: int | None = None,
                 part_size: int = 2048, max_tokens: int | None = None) -> None:
        from . import ray_backend

        ray_backend.require_ray()  # fail now, with the install hint, rather than at the first job
        self.store = store
        self.encoder = encoder
        self.address = address
        self.actors = actors
        self.gpus_per_actor = gpus_per_actor
        self.threads = threads
        self.part_size = part_size
        self.max_tokens = max_tokens
        self.pool: EncoderPool | None = None
        self.last_first_batch_s: float | None = None
        self._connected_here = False

    def start(self, encoder: Encoder | None = None) -> EncoderPool:
        """Connect to Ray and start the pool for ``encoder`` (default: the backend's own)."""
        from .ray_backend import connect, encoder_spec
        from .ray_pool import EncoderPool

        self._connected_here = connect(self.address) or self._connected_here
        spec = encoder_spec(encoder or self.encoder)
        if self.pool is not None and self.pool.spec != spec:
            self.pool.close()  # another precision or fingerprint (changed weights): these actors hold the wrong ones
            self.pool = None
        if self.pool is None:
            self.pool = EncoderPool(spec, self.store.storage, size=self.actors,
                                    gpus_per_actor=self.gpus_per_actor, threads=self.threads,
                                    max_tokens=self.max_tokens)
        self.pool.start()
        return self.pool

    def actor_pids(self) -> list[int]:
        """The pool's actor processes (waits for actors still loading the model)."""
        return self.start().pids()

    def run(self, texts: Sequence[str], job_id: str, want_tokens: bool = False,
            progress: ProgressFn | None = None, should_continue: ContinueFn | None = None,
            encoder: Encoder | None = None) -> ExtractSummary:
        from .ray_backend import extract_with_ray

        pool = self.start(encoder)
        timing: dict[str, float] = {}
        summary = extract_with_ray(texts, self.store, encoder or self.encoder, job_id=job_id,
                                   want_tokens=want_tokens, part_size=self.part_size,
                                   max_tokens=self.max_tokens, progress=progress,
                                   should_continue=should_continue, pool=pool, timing=timing)
        self.last_first_batch_s = timing.get("first_batch_s")
        return summary

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self._connected_here:
            from .ray_backend import require_ray

            require_ray().shutdown()
            self._connected_here = False


def make_backend(kind: str, store: FeatureStore, encoder: Encoder, *, part_size: int = 2048,
                 max_tokens: int | None = None, ray_address: str | None = None, ray_actors: int = 1,
                 threads: int | None = None) -> ExtractionBackend:
    """The backend named ``kind`` (``embedded`` or ``ray``), from plain settings values."""
    if kind == "embedded":
        return EmbeddedBackend(store, encoder, part_size=part_size, max_tokens=max_tokens)
    if kind == "ray":
        return RayBackend(store, encoder, address=ray_address, actors=ray_actors, threads=threads,
                          part_size=part_size, max_tokens=max_tokens)
    raise ValueError(f"unknown backend {kind!r}; choose one of {', '.join(BACKENDS)}")

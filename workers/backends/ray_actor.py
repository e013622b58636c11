"""The Ray actor of the encoder pool: loads the model once, turns parts into shard rows
that the store's storage writes.

Used by ``layerbank.workers.backends.ray_pool`` (which starts, feeds and replaces
these actors) and re-exported by ``layerbank.workers.backends.ray_backend``. Ray
imports this module in each actor process.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from layerbank.cache.keys import text_key
from layerbank.cache.shard import ShardContents
from layerbank.cache.storage import ShardStorage

from ..encoder import Encoder
from ..extract import Progress, _encode_part

__all__ = ["ShardEncoder"]


class ShardEncoder:
    """A Ray actor: loads the encoder once, then turns part after part into shards.

    ``encode(name, keys, texts, want_tokens)`` checks the texts against
    their keys, hands the part's rows to ``storage`` (the driver's store's,
    cache/storage.py), which writes shard ``{name}.h5``, and returns its
    metadata for the driver to commit (``FeatureStore.commit``). The write
    takes a temp name private to this attempt (``private_temp``), so a writer
    that outlives its retry (a partitioned node) can never interleave bytes
    with it. ``pid()`` answers once the model is loaded (the pool's readiness
    check).

    ``fault`` is for tests only (users never pass it):
    ``{"die_once": marker_path}`` makes the first actor that finds no marker
    write its pid there and ``os._exit`` in the middle of its part, after the
    shard file is on disk but before returning; ``{"announce_dir": d,
    "pause_s": "0.5"}`` makes every part first touch ``d/<part>@<node id>``
    and then sleep, so a test can remove a node while it is mid-part.
    """

    def __init__(self, spec: dict[str, Any], storage: ShardStorage, max_tokens: int | None,
                 threads: int | None = None, fault: dict[str, str] | None = None) -> None:
        from ..encoder import set_threads

        set_threads(threads)
        self.encoder = Encoder.load(spec["model"], device="auto", precision=spec["precision"],
                                    max_length=spec["max_length"],
                                    storage_dtype=spec["storage_dtype"],
                                    truncation_side=spec["truncation_side"],
                                    poolings=spec["poolings"])
        got = (self.encoder.fingerprint, self.encoder.config.canonical())
        if got != (spec["fingerprint"], spec["config"]):
            # keys were made on the driver: other weights here would store wrong numbers
            raise RuntimeError(f"this node loaded {got}, the driver expects "
                               f"{(spec['fingerprint'], spec['config'])}; install the same model "
                               "on every node")
        self.storage = storage
        self.max_tokens = max_tokens
        self.fault = fault or {}

    def pid(self) -> int:
        return os.getpid()

    def encode(self, name: str, keys: list[str], texts: list[str], want_tokens: bool) -> dict[str, Any]:
        import ray

        node = ray.get_runtime_context().get_node_id()
        cfg = self.encoder.config
        canonical = cfg.canonical()
        t0 = time.perf_counter()
        self._maybe_pause(name, node)
        # the driver made the keys: check that these are the texts they were made from
        if [text_key(self.encoder.fingerprint, canonical, t) for t in texts] != keys:
            raise RuntimeError(f"part {name}: texts changed on their way to the actor")
        first_batch_at: list[float] = []

        def on_batch(_: Progress) -> None:
            if not first_batch_at:
                first_batch_at.append(time.time())  # wall clock: the driver compares it with its own

        enc = _encode_part(self.encoder, texts, want_tokens, self.max_tokens,
                           Progress(0, len(texts), 0, 0.0), t0, on_batch, None)
        contents = ShardContents(keys, enc.n_tokens, enc.truncated, enc.pooled, enc.tokens,
                                 attrs={"model_fingerprint": self.encoder.fingerprint,
                                        "extraction_config": canonical})
        # published (durably) before the driver commits it
        n_bytes = self.storage.write(f"{name}.h5", contents, cfg.storage_dtype, private_temp=True)
        self._maybe_die()
        return {"name": name, "keys": keys, "n_tokens": enc.n_tokens.tolist(),
                "truncated": enc.truncated.tolist(), "n_bytes": n_bytes, "poolings": list(enc.pooled),
                "fingerprint": self.encoder.fingerprint, "config": canonical,
                "node": node, "pid": os.getpid(), "seconds": time.perf_counter() - t0,
                "first_batch_at": first_batch_at[0] if first_batch_at else time.time()}

    def _maybe_pause(self, name: str, node: str) -> None:
        if "announce_dir" in self.fault:
            Path(self.fault["announce_dir"], f"{name}@{node}").touch()
        time.sleep(float(self.fault.get("pause_s", 0)))

    def _maybe_die(self) -> None:
        marker = self.fault.get("die_once")
        if marker is None:
            return
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # first actor only
        except FileExistsError:
            return
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        os._exit(1)

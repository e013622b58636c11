"""In-process extraction for the command line and notebooks: one encoder, one
store, the data directory held for the duration.

The rows of texts ("read the store, encode the misses, read them back") are
not asked here but of layerbank.app.features_service (``features_for``, with
this extractor's ``extract`` as the encoder), the one path that HTTP, the
command line and ``Bank`` share; workers/ may not import app/.

Example::

    with LocalExtractor.open("layerbank-data") as ex:
        summary = ex.extract(texts, job_id="nb-1")
        X = ex.store.read_view(summary.keys, parse_view("layer:-2"), "mean",
                               ex.encoder.info["n_hidden_states"]).data
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from layerbank.cache.lock import DataDirLock, hold_data_dir
from layerbank.cache.poolings import DEFAULT_POOLINGS
from layerbank.cache.store import FeatureStore

from .encoder import Encoder, ModelLoadError, set_threads
from .extract import ExtractSummary, Progress, extract

__all__ = ["LocalExtractor", "ModelLoadError"]


class LocalExtractor:
    def __init__(self, store: FeatureStore, encoder: Encoder, lock: DataDirLock) -> None:
        self.store = store
        self.encoder = encoder
        self._lock = lock

    @classmethod
    def open(cls, data_dir: Any, *, model: str | None = None, device: str = "auto",
             precision: str = "default", max_length: int | None = None,
             storage_dtype: str = "float16", threads: int | None = None,
             poolings: str = DEFAULT_POOLINGS, engine: str = "auto") -> LocalExtractor:
        lock = hold_data_dir(data_dir)
        try:
            set_threads(threads)
            encoder = Encoder.load(model, device=device, precision=precision, max_length=max_length,
                                   storage_dtype=storage_dtype, poolings=poolings, engine=engine,
                                   data_dir=data_dir)
            return cls.attach(FeatureStore(data_dir, clean=True), encoder, lock)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def attach(cls, store: FeatureStore, encoder: Encoder, lock: DataDirLock) -> LocalExtractor:
        """An extractor over a store whose directory ``lock`` already holds
        (layerbank.app.bank loads the encoder only once something is missing);
        registers the model so that readers can make its keys without torch."""
        store.catalog.register_model(encoder.fingerprint, encoder.name,
                                     {**encoder.info, "config": encoder.config.canonical()})
        return cls(store, encoder, lock)

    @property
    def model_name(self) -> str:
        return str(self.encoder.info.get("name", self.encoder.name))

    def extract(self, texts: Sequence[str], *, job_id: str, want_tokens: bool = False,
                progress_bar: bool = False, max_tokens: int | None = None, part_size: int = 2048,
                backend: str = "embedded", ray_address: str | None = None,
                ray_actors: int = 1) -> ExtractSummary:
        bar = _Bar() if progress_bar else None
        try:
            if backend == "ray":
                from .backends.ray_backend import extract_with_ray  # optional extra

                return extract_with_ray(texts, self.store, self.encoder, job_id=job_id,
                                        want_tokens=want_tokens, address=ray_address,
                                        part_size=part_size, max_tokens=max_tokens,
                                        actors=ray_actors, progress=bar.update if bar else None)
            return extract(texts, self.store, self.encoder, job_id=job_id, want_tokens=want_tokens,
                           part_size=part_size, max_tokens=max_tokens,
                           progress=bar.update if bar else None)
        finally:
            if bar:
                bar.close()

    def close(self) -> None:
        self.store.close()
        self._lock.release()

    def __enter__(self) -> LocalExtractor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Bar:
    """A tqdm bar showing texts, tokens per second and ETA (on stderr)."""

    def __init__(self) -> None:
        from tqdm import tqdm

        self._tqdm = tqdm
        self.bar: Any = None

    def update(self, p: Progress) -> None:
        if self.bar is None:
            self.bar = self._tqdm(total=p.total, unit="text", file=sys.stderr, dynamic_ncols=True)
        self.bar.n = p.done
        self.bar.set_postfix_str(f"{p.tokens_per_second:,.0f} tok/s", refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

"""Answer a command from the store before loading the encoder.

``extract``, ``features`` and ``probe`` used to import torch and load the
weights (11.5 s + 8.9 s on 2 loaded cores) before looking at the catalog,
which then answered in 0.07 s. Now they:

1. locate the model without torch (``layerbank.workers.model_source``: a
   model that cannot be had fails here, in one line, in milliseconds);
2. open the data directory and ask the catalog whether it knows the model
   and the config these settings give (``layerbank.workers.known_model``);
3. look every text's key up; when all are stored, answer from the shards.

Only a miss, or a model not registered yet, loads the encoder
(``layerbank.workers.local.LocalExtractor``), which registers the model so
the next run takes the short path. The layer count is known before either
path runs (from the catalog, or from the model's config.json), so a view
the model cannot give is refused before anything loads.

Example::

    source = locate(settings)
    with StoreFirst.open(settings, source) as sf:
        summary = sf.all_stored(texts)        # None: something must be encoded
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from layerbank.app.cli.common import fail, through_a_server
from layerbank.cache.lock import hold_data_dir
from layerbank.cache.store import FeatureStore, ReadResult
from layerbank.cache.views import View
from layerbank.settings import Settings
from layerbank.workers.extract import ExtractSummary
from layerbank.workers.known_model import ModelRef, known_model
from layerbank.workers.model_source import ModelLoadError, ModelSource, locate_model

__all__ = ["StoreFirst", "locate"]


def locate(settings: Settings) -> ModelSource:
    """The model's source, or exit with the one-line reason it cannot be had."""
    try:
        return locate_model(settings.model)
    except ModelLoadError as e:
        fail(str(e))
        raise


class StoreFirst:
    """The data directory, held, with the model as the catalog knows it (``model``
    is None when the catalog cannot make this run's keys without the encoder)."""

    def __init__(self, store: FeatureStore, lock: Any, source: ModelSource,
                 model: ModelRef | None, poolings: Sequence[str] = ()) -> None:
        self.store = store
        self.source = source
        self.model = model
        self.poolings = tuple(poolings)  # a row whose shard lacks one of them is a miss
        self._lock = lock

    @classmethod
    def open(cls, settings: Settings, source: ModelSource, *, url_flag: bool = False) -> StoreFirst:
        """``url_flag``: the command takes ``--url``, and its refusal of a held directory says so."""
        try:
            lock = hold_data_dir(settings.data_dir)
        except RuntimeError as e:  # a server holds it: the words LocalExtractor and Bank use
            fail(through_a_server(str(e), settings.data_dir) if url_flag else str(e))
            raise
        try:
            store = FeatureStore(settings.data_dir, clean=True)
            opts = settings.extraction_options()
            model = known_model(store.catalog, source.name, source.fingerprint,
                                device=str(opts["device"]), precision=str(opts["precision"]),
                                max_length=settings.max_length, storage_dtype=settings.storage_dtype)
        except BaseException:
            lock.release()
            raise
        return cls(store, lock, source, model, settings.pooling_names)

    @property
    def n_hidden_states(self) -> int | None:
        """Layers + 1, from the catalog or the model's config.json; None when unknown."""
        return self.model.n_hidden_states if self.model else self.source.n_hidden_states()

    @property
    def model_name(self) -> str:
        return str(self.model.info.get("name", self.source.display_name)) if self.model \
            else self.source.display_name

    def keys(self, texts: Sequence[str]) -> list[str]:
        assert self.model is not None
        return [self.store.key(self.model.fingerprint, self.model.config, t) for t in texts]

    def all_stored(self, texts: Sequence[str], *, want_tokens: bool = False) -> ExtractSummary | None:
        """The summary of an extraction that finds every text stored, or None."""
        if self.model is None:
            return None
        t0 = time.perf_counter()
        keys = self.keys(texts)
        unique = list(dict.fromkeys(keys))
        hits = self.store.lookup(unique, need_tokens=want_tokens, poolings=self.poolings)
        if len(hits) < len(unique):
            return None
        return ExtractSummary(texts=len(texts), unique_texts=len(unique), cache_hits=len(hits),
                              truncated=sum(1 for e in hits.values() if e.truncated),
                              seconds=time.perf_counter() - t0, keys=keys)

    def read_view(self, texts: Sequence[str], view: View, pooling: str) -> ReadResult | None:
        """The view's rows when every text is stored (and readable), else None."""
        if self.model is None:
            return None
        res = self.store.read_view(self.keys(texts), view, pooling, self.model.n_hidden_states)
        return res if bool(res.found.all()) else None

    def close(self) -> None:
        self.store.close()
        self._lock.release()

    def __enter__(self) -> StoreFirst:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

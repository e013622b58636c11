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
(``extractor()``: layerbank.workers.local.LocalExtractor over the directory
already held), which registers the model so the next run takes the short
path. ``text_source`` hands both to layerbank.app.features_service, the one
"read, encode the misses, read again" path the HTTP routes and Bank take too. The layer count is known before either
path runs (from the catalog, or from the model's config.json), so a view
the model cannot give is refused before anything loads.

Example::

    source = locate(settings)
    with StoreFirst.open(settings, source) as sf:
        summary = sf.all_stored(texts)        # None: something must be encoded
        got = features_for(texts, sf.text_source(lambda keys: [sf.store.read_pooled(keys, "mean")]))
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from layerbank.app.cli.common import fail, through_a_server
from layerbank.app.features_service import TextSource
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
                 model: ModelRef | None, poolings: Sequence[str] = (),
                 settings: Settings | None = None) -> None:
        self.store = store
        self.source = source
        self.model = model
        self.poolings = tuple(poolings)  # a row whose shard lacks one of them is a miss
        self.settings = settings
        self.loaded: Any = None  # the LocalExtractor, once extractor() loaded the encoder
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
        return cls(store, lock, source, model, settings.pooling_names, settings)

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

    def extractor(self) -> Any:
        """The in-process extractor over this held directory: torch and the weights load on
        the first call (a model that cannot load exits with its reason); the model's keys
        are then known (``model``), registered for the next run's short path."""
        if self.loaded is None:
            from layerbank.workers.encoder import Encoder, ModelLoadError, set_threads  # torch: only now
            from layerbank.workers.local import LocalExtractor

            s = self.settings
            assert s is not None, "StoreFirst.open(settings, ...) gives the settings to load with"
            try:
                set_threads(s.threads)
                encoder = Encoder.load(s.model, **s.extraction_options(), data_dir=s.data_dir)
            except ModelLoadError as e:
                fail(str(e))
            self.loaded = LocalExtractor.attach(self.store, encoder, self._lock)
            self.model = ModelRef(encoder.name, encoder.fingerprint, encoder.config,
                                  {**encoder.info, "config": encoder.config.canonical()})
        return self.loaded

    def text_source(self, read: Callable[[list[str]], list[ReadResult]], *, progress: bool = True,
                    want_tokens: bool = False) -> TextSource[list[ReadResult], int]:
        """This directory as layerbank.app.features_service's source: keys from the catalog's
        model (None until the encoder loads when it does not know it), ``read(keys)``, and
        the misses extracted in-process, their cost said first when large (app/cli/cost.py)."""
        def keys(texts: list[str]) -> list[str] | None:
            return None if self.model is None else self.keys(texts)

        def encode(texts: list[str], keys: list[str] | None) -> int:
            from layerbank.app.cli.cost import announce

            ex, s = self.extractor(), self.settings
            assert s is not None
            announce(ex, texts, want_tokens=want_tokens)  # a large run says what it will cost first
            return int(ex.extract(texts, job_id="cli-" + uuid.uuid4().hex[:10], want_tokens=want_tokens,
                                  progress_bar=progress, max_tokens=s.max_tokens_per_batch,
                                  part_size=s.part_size).texts_encoded)

        return TextSource(keys=keys, read=read, encode=encode)

    def close(self) -> None:
        self.store.close()
        self._lock.release()

    def __enter__(self) -> StoreFirst:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""``layerbank.Bank``: the store's features and probes in a notebook, no server.

A Bank holds one data directory for its lifetime, as ``layerbank features``
does while it runs: the same format and, by default, the same directory
(``LAYERBANK_DATA_DIR``, else ``./layerbank-data``; every other setting has
its ``LAYERBANK_*`` twin too, read by layerbank.settings.Settings).
It answers from the store and loads the encoder only when a text is missing:
the model is located and its keys made without torch, as the command line
does (layerbank.workers.model_source, layerbank.workers.known_model), so a
request whose texts are all stored needs neither torch nor the weights.

A directory held by a running ``layerbank serve`` is refused with the
command line's message (layerbank.cache.lock.hold_data_dir); ``url=`` reads
through that server with layerbank.Client instead (see docs/notebook.md for
why this is not automatic).

Example::

    with Bank() as bank:                          # ./layerbank-data, embedded model
        X = bank.features(texts, view="layer:-2", pooling="mean")   # [n, 384] float32
        result = bank.probe(texts, labels)        # the dict `layerbank probe --json` writes
        bank.stats                                # {"encoded": 300, "cached": 300}
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from layerbank.app.features_service import TextsLost, TextSource, features_for
from layerbank.cache.keys import text_key
from layerbank.cache.lock import hold_data_dir
from layerbank.cache.poolings import parse_poolings
from layerbank.cache.store import FeatureStore, ReadResult
from layerbank.cache.views import parse_view
from layerbank.settings import Settings
from layerbank.workers.known_model import ModelRef, known_model  # both torch-free
from layerbank.workers.model_source import ModelSource, locate_model

__all__ = ["Bank", "as_texts"]

# open Banks of this process by (pid, data dir, model, url): LayerFeatures and
# a user's own Bank share one, since a second lock on the directory would be refused
_open: dict[tuple[Any, ...], Bank] = {}


class Bank:
    """Features and probes from a local data directory (or, with ``url``, a server).

    ``features(texts, view, pooling)`` -> float32 ``[n, dim]`` in input order;
    ``probe(texts, labels, ...)`` -> the result dict of ``layerbank probe``;
    ``stats`` -> ``{"encoded": n, "cached": m}``: texts this Bank had the
    encoder run on, and texts it read from the store (unique texts per call).
    ``close()`` (or leaving ``with``) releases the data directory.
    """

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, model: str | None = None, *,
                 url: str | None = None, api_key: str | None = None, device: str | None = None,
                 precision: str | None = None, max_length: int | None = None,
                 storage_dtype: str | None = None, poolings: str | None = None,
                 threads: int | None = None) -> None:
        # Any: each value goes to its own Settings field, checked there; Settings.model_validate
        # would skip BaseSettings.__init__ and with it the environment's defaults.
        given: dict[str, Any] = {"data_dir": data_dir, "model": model, "device": device, "precision": precision,
                 "max_length": max_length, "storage_dtype": storage_dtype, "poolings": poolings,
                 "threads": threads, "api_key": api_key}
        self.settings = Settings(**{k: v for k, v in given.items() if v is not None})
        self.url = url
        self.stats = {"encoded": 0, "cached": 0}
        self._client: Any = None
        self._store: FeatureStore | None = None
        self._extractor: Any = None  # layerbank.workers.local.LocalExtractor, once a text is missing
        self._model: ModelRef | None = None
        self._source: ModelSource | None = None
        if url is not None:
            from layerbank.app.client import Client

            self._client = Client(url, api_key=self.settings.api_key)
        else:
            self._source = locate_model(self.settings.model)  # ModelLoadError at once, in one line
            self._lock = _hold(self.settings.data_dir)
            try:
                self._store = FeatureStore(self.settings.data_dir, clean=True)
            except BaseException:
                self._lock.release()
                raise
        self._registry_key = _registry_key(self.settings.data_dir, self.settings.model, url)
        _open.setdefault(self._registry_key, self)

    @classmethod
    def shared(cls, data_dir: str | os.PathLike[str] | None = None, model: str | None = None,
               url: str | None = None) -> Bank:
        """This process's open Bank for (data_dir, model, url), opened on first use."""
        given: dict[str, Any] = {k: v for k, v in (("data_dir", data_dir), ("model", model))
                                 if v is not None}
        settings = Settings(**given)  # so that the environment's defaults name the same directory
        found = _open.get(_registry_key(settings.data_dir, settings.model, url))
        return found if found is not None else cls(data_dir, model, url=url)

    # -- features -------------------------------------------------------------
    def features(self, texts: Any, view: str = "layer:-2", pooling: str = "mean", *,
                 text_column: str | None = None) -> np.ndarray:
        """The view's float32 matrix of ``texts`` in input order (``[n, H, d]`` for
        all_layers). ``texts``: a list, array or Series of str, or a table
        (DataFrame, Arrow table, ``datasets.Dataset``) with ``text_column``."""
        texts, _ = _inputs(texts, None, text_column, None)
        v = parse_view(view)  # ViewError (a ValueError) before anything runs
        if self._client is not None:  # the server checks the pooling against what it stores
            x, out = self._client.features(texts, view, pooling, return_info=True)
            cached = sum(1 for item in out["data"] if item.get("cached"))
            self.stats["cached"] += cached
            self.stats["encoded"] += len(texts) - cached
            return np.asarray(x, dtype=np.float32)
        self._check_pooling(pooling)
        h = self._n_hidden_states()
        v.needed_layers(h)  # a layer this model lacks fails before any encoding
        [data] = self._read(texts, lambda store, keys: [store.read_view(keys, v, pooling, h)])
        return np.asarray(data, dtype=np.float32)

    def dimension(self, view: str, pooling: str = "mean") -> int:
        """Width of ``features(..., view, pooling)``'s rows for this Bank's model
        (flattened for all_layers); ValueError for a view or pooling it lacks."""
        v = parse_view(view)
        if self._client is not None:
            info = self._client.info()["model"]
        else:
            self._check_pooling(pooling)
            info = self._known_model().info
        return int(v.output_dim(int(info["n_hidden_states"]), int(info["hidden_size"])))

    # -- probes ---------------------------------------------------------------
    def probe(self, texts: Any, labels: Sequence[Any] | None = None, options: Any = None, *,
              text_column: str | None = None, label_column: str | None = None,
              progress: Callable[[int, int], None] | None = None, **fields: Any) -> dict[str, Any]:
        """Cross-validated probes of every (view, pooling) on the stored states,
        extracting missing texts first: the result ``layerbank probe --json``
        writes (run_probe's dict with ``recommendation``).

        What to sweep is a layerbank.app.probes.options.ProbeOptions, or its
        fields as keywords: ``views`` (default: the CLI's), ``poolings``,
        ``head``, ``cv``, ``seed``, ``control_task``, ``learning_curve``,
        ``mdl``, ``train_sizes``. ``texts`` may be a table with
        ``text_column`` and ``label_column``. Through a server (``url=``) it
        uploads a dataset and runs ``/v1/probes`` with the same options.
        """
        from dataclasses import asdict, replace

        from layerbank.app.probes.common import DEFAULT_VIEWS, model_summary
        from layerbank.app.probes.inputs import check_labels, check_options
        from layerbank.app.probes.options import ProbeOptions
        from layerbank.app.probes.sentence_probe import probe_sentences

        texts, labels = _inputs(texts, labels, text_column, label_column)
        if labels is None:
            raise ValueError("give labels (one per text), or a table and its label_column")
        opts = replace(options or ProbeOptions(views=list(DEFAULT_VIEWS)), **fields)  # TypeError: unknown
        check_options(cv=opts.cv, head=opts.head, views=opts.views, poolings=opts.poolings)  # before loading
        check_labels(labels, opts.cv)
        if len(labels) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
        if self._client is not None:
            ds = self._client.upload_dataset("layerbank.Bank", texts, labels=list(labels))
            asked = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(opts).items()
                     if k not in ("threads", "n_jobs", "storage_dtype")}  # the server's to know
            result: dict[str, Any] = self._client.probe(ds, progress=False, **asked)
            return result
        poolings = list(opts.poolings)
        for p in poolings:
            self._check_pooling(p)
        states = dict(zip(poolings, self._read(
            texts, lambda store, keys: [store.read_pooled(keys, p) for p in poolings])))
        m = self._known_model()
        # the model's storage dtype is the heads' noise floor (layerbank.linear_probe.standardize)
        return probe_sentences(states.__getitem__, labels, model=model_summary(m.info, m.fingerprint),
                               options=replace(opts, storage_dtype=m.config.storage_dtype), progress=progress)

    # -- the store, and the encoder only for misses ---------------------------
    def _read(self, texts: list[str],
              read: Callable[[FeatureStore, list[str]], list[ReadResult]]) -> list[np.ndarray]:
        """``read(store, keys)`` for ``texts``, the missing ones encoded first (the one
        features service, layerbank.app.features_service, with the in-process extractor
        as its encoder; a row stored without a pooling read is missing); counts each
        unique text once per call, as encoded or as cached."""
        store = self._open_store()
        source: TextSource[list[ReadResult], int] = TextSource(
            keys=self._keys, read=lambda keys: read(store, keys), encode=self._encode)
        try:
            got = features_for(texts, source)
        except TextsLost as e:
            raise RuntimeError(f"{e.lost} texts could not be read back from the store") from None
        self.stats["encoded"] += got.encoded
        self.stats["cached"] += len(set(got.keys)) - got.encoded
        return [r.data for r in got.results]

    def _keys(self, texts: list[str]) -> list[str] | None:
        """The texts' keys, None while neither the catalog nor a loaded encoder knows the model."""
        m = self._model or self._model_from_catalog()
        return None if m is None else [text_key(m.fingerprint, m.config, t) for t in texts]

    def _encode(self, texts: list[str], keys: list[str] | None) -> int:
        """Store the texts' rows (torch loads on the first call); how many the encoder ran on."""
        return int(self._encoder().extract(texts, job_id=f"bank-{uuid.uuid4().hex[:10]}").texts_encoded)

    def _check_pooling(self, pooling: str) -> None:
        """A ValueError unless ``pooling`` is one this data directory stores (the
        ``poolings`` setting): another could be read but never computed here."""
        parse_poolings([pooling])  # unknown pooling 'x'; known: ...
        if pooling not in self.settings.pooling_names:
            raise ValueError(f"pooling {pooling!r} is not among the poolings stored "
                             f"({self.settings.poolings}); open the Bank with "
                             f"poolings={self.settings.poolings + ',' + pooling!r}")

    def _open_store(self) -> FeatureStore:
        if self._store is None:
            raise RuntimeError("this Bank is closed")
        return self._store

    def _n_hidden_states(self) -> int:
        if self._model is None and self._source is not None:
            self._model = self._model_from_catalog()
            if self._model is None and (h := self._source.n_hidden_states()) is not None:
                return h  # from config.json: a bad layer is refused before torch loads
        return self._known_model().n_hidden_states

    def _known_model(self) -> ModelRef:
        if self._model is None:
            self._model = self._model_from_catalog()
        if self._model is None:
            self._encoder()
        assert self._model is not None
        return self._model

    def _model_from_catalog(self) -> ModelRef | None:
        """The keys' model without torch, when the catalog's row can tell (known_model)."""
        s, source = self.settings, self._source
        assert source is not None
        return known_model(self._open_store().catalog, source.name, source.fingerprint, device=s.device,
                           precision=s.precision, max_length=s.max_length, storage_dtype=s.storage_dtype)

    def _encoder(self) -> Any:
        if self._extractor is None:
            from layerbank.workers.encoder import Encoder, set_threads  # torch: only now
            from layerbank.workers.local import LocalExtractor

            s = self.settings
            set_threads(s.threads)
            encoder = Encoder.load(s.model, **s.extraction_options(),
                                   data_dir=s.data_dir)
            self._extractor = LocalExtractor.attach(self._open_store(), encoder, self._lock)
            self._model = ModelRef(encoder.name, encoder.fingerprint, encoder.config,
                                   {**encoder.info, "config": encoder.config.canonical()})
        return self._extractor

    # -- life cycle -----------------------------------------------------------
    def close(self) -> None:
        """Release the data directory (or the HTTP connection); idempotent."""
        if _open.get(self._registry_key) is self:
            del _open[self._registry_key]
        if self._client is not None:
            self._client.close()
            self._client = None
            return
        if self._store is not None:
            self._store.close()
            self._store = None
            self._lock.release()
        self._extractor = None

    def __enter__(self) -> Bank:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.url or str(self.settings.data_dir)
        return f"Bank({where!r}, model={self.settings.model!r}, stats={self.stats})"


def as_texts(texts: Any) -> list[str]:
    """A list of str from a list, tuple, 1-D array or pandas Series of texts
    (or an ``[n, 1]`` array, as a ColumnTransformer passes one column)."""
    if isinstance(texts, (str, bytes)):
        raise TypeError("expected a list of texts, got one string; wrap it in a list")
    arr = np.asarray(texts, dtype=object)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise ValueError(f"expected a 1-D list of texts, got an array of shape {arr.shape}")
    bad = next((i for i, t in enumerate(arr) if not isinstance(t, str)), None)
    if bad is not None:
        raise TypeError(f"text {bad} is {type(arr[bad]).__name__}, not str: {arr[bad]!r:.60}")
    return [str(t) for t in arr]


def _inputs(texts: Any, labels: Any, text_column: str | None,
            label_column: str | None) -> tuple[list[str], Any]:
    """Texts (and labels) from a list or a table (layerbank.app.tables)."""
    from layerbank.app.tables import is_table, table_texts  # pandas & co. only for a table

    if not is_table(texts):
        return as_texts(texts), labels
    table = table_texts(texts, text_column=text_column, label_column=label_column)
    if table.skipped_empty:  # rows must stay aligned with the caller's table
        raise ValueError(f"{len(table.skipped_empty)} empty texts (rows {table.skipped_empty[:5]}); "
                         "drop or fill them first: features are returned row for row")
    return table.texts, table.labels if labels is None else labels


def _hold(data_dir: Path) -> Any:
    """The directory's lock; the CLI's refusal, plus the server's URL when it wrote one."""
    where = str(Path(data_dir).resolve())
    mine = next((b for k, b in _open.items() if k[:2] == (os.getpid(), where)), None)
    if mine is not None:  # the lock would say "in use by pid <this one>": say which Bank instead
        raise RuntimeError(f"data directory {data_dir} is already open in this process: {mine!r}; "
                           "get that one with layerbank.Bank.shared(data_dir, model), or close() it first")
    try:
        return hold_data_dir(data_dir)
    except RuntimeError as e:
        try:
            url = json.loads((Path(data_dir) / "server.json").read_text())["url"]
        except (OSError, ValueError, KeyError, TypeError):
            raise e from None
        raise RuntimeError(f"{e}; to read through that server: Bank(url={url!r})") from None


def _registry_key(data_dir: Path, model: str | None, url: str | None) -> tuple[Any, ...]:
    # the pid: a forked child must open its own handles, never reuse the parent's
    return (os.getpid(), None if url else str(Path(data_dir).resolve()), model, url)

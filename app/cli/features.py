"""``layerbank features FILE --view V --pooling P --out X.npy [--url URL]``.

In-process by default (the data directory held while it runs); with ``--url``
(``LAYERBANK_URL``) the matrix comes from a running server's ``/v1/features``
(layerbank.Client), as ``Bank(url=...)`` reads it: the way to use a data
directory that server holds.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from layerbank.app.cli.common import (
    add_common_flags,
    add_flag,
    add_input_flags,
    add_poolings_flag,
    add_url_flag,
    fail,
    load_table,
    settings_from,
)
from layerbank.app.cli.store_first import StoreFirst, locate
from layerbank.app.feature_files import OutPathError, check_out_path, write_features
from layerbank.app.features_service import TextsLost, features_for
from layerbank.cache.poolings import POOLING_NAMES
from layerbank.cache.store import ReadResult
from layerbank.cache.views import VIEW_GRAMMAR, View, ViewError, parse_view


def register(sub: Any) -> None:
    p = sub.add_parser("features", help="write a file's feature matrix (extracting misses)")
    add_input_flags(p)
    add_common_flags(p)
    add_poolings_flag(p)
    add_flag(p, "--view", default="layer:-2", help=VIEW_GRAMMAR)
    add_flag(p, "--pooling", default="mean", choices=POOLING_NAMES, help="pooling (one of --poolings)")
    add_flag(p, "--out", required=False, help="output file: .npy, .parquet or .h5 "
             "(the suffix says the format)")
    add_url_flag(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # every mistake in the flags is refused before the file is read or anything loads
    if not args.out:
        fail("--out is required: X.npy, X.parquet or X.h5")
    try:
        out = check_out_path(args.out)
        view = parse_view(args.view)
    except (OutPathError, ViewError) as e:
        fail(str(e))
        raise
    settings = settings_from(args)
    if args.url:
        return _through(args, settings, out, view)
    if args.pooling not in settings.pooling_names:
        fail(f"--pooling {args.pooling} is not among the poolings stored ({settings.poolings}); "
             f"add it: --poolings {settings.poolings},{args.pooling}")
    table = load_table(args)
    source = locate(settings)
    with StoreFirst.open(settings, source, url_flag=True) as sf:
        if (h := sf.n_hidden_states) is not None:
            _check_view(view, h)
        x = _matrix(sf, table.texts, view, args.pooling, progress=not args.no_progress)
        model_name = sf.loaded.model_name if sf.loaded is not None else sf.model_name
    return _write(out, x, table.texts, view, args.pooling, model_name)


def _matrix(sf: StoreFirst, texts: list[str], view: View, pooling: str, *, progress: bool) -> np.ndarray:
    """The view's rows of ``texts`` (layerbank.app.features_service: stored rows as they are,
    the misses extracted in-process with a bar and its ETA; all stored: nothing loads)."""
    def read(keys: list[str]) -> list[ReadResult]:
        assert sf.model is not None  # keys are asked for only once the model is known
        try:
            return [sf.store.read_view(keys, view, pooling, sf.model.n_hidden_states)]
        except ViewError as e:
            fail(str(e))

    store_and_extractor = sf.text_source(read, progress=progress)

    def encode(texts: list[str], keys: list[str] | None) -> int:
        _check_view(view, int(sf.extractor().encoder.info["n_hidden_states"]))  # before anything is encoded
        return store_and_extractor.encode(texts, keys)

    try:
        got = features_for(texts, replace(store_and_extractor, encode=encode))
    except TextsLost as e:
        fail(f"{e.lost} texts could not be read back from the store; run again")
    return got.results[0].data


def _through(args: argparse.Namespace, settings: Any, out: Path, view: View) -> int:
    """The matrix from the server at ``--url``: its store, its model (``--model`` names one it serves)."""
    from layerbank.app.client import ApiError, Client

    table = load_table(args)
    try:
        with Client(args.url, api_key=settings.api_key) as client:
            x, info = client.features(table.texts, view.spec, args.pooling, model=args.model,
                                      precision=args.precision, return_info=True)
    except ApiError as e:
        fail(f"{args.url}: {e}")
        raise
    return _write(out, np.asarray(x, dtype=np.float32), table.texts, view, args.pooling, info["model"])


def _check_view(view: View, n_hidden_states: int) -> None:
    try:
        view.needed_layers(n_hidden_states)
    except ViewError as e:
        fail(str(e))


def _write(out: Path, x: np.ndarray, texts: list[str], view: View, pooling: str, model: str) -> int:
    write_features(out, x, texts=texts, view=view.spec, pooling=pooling, model=model)
    print(f"wrote {out}: {x.shape[0]} texts x {' x '.join(map(str, x.shape[1:]))} "
          f"({view.spec}, {pooling}, float32)", file=sys.stderr)
    return 0

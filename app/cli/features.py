"""``layerbank features FILE --view V --pooling P --out X.npy``."""

from __future__ import annotations

import argparse
import sys
import uuid
from typing import Any

import numpy as np

from layerbank.app.cli.common import add_common_flags, add_flag, fail, settings_from
from layerbank.app.cli.extract import add_input_flags, load_table
from layerbank.cache.views import ViewError, parse_view


def register(sub: Any) -> None:
    p = sub.add_parser("features", help="write a file's feature matrix (extracting misses)")
    add_input_flags(p)
    add_common_flags(p)
    add_flag(p, "--view", default="layer:-2", help="layer:K, layers:I,J, concat_last_4, "
             "sum_last_4, mean_all, weighted:W0,..., all_layers")
    add_flag(p, "--pooling", default="mean", choices=["mean", "cls", "max"], help="pooling")
    add_flag(p, "--out", required=False, help="output .npy path")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not args.out:
        fail("--out X.npy is required")
    settings = settings_from(args)
    try:
        view = parse_view(args.view)
    except ViewError as e:
        fail(str(e))
        raise
    table = load_table(args)
    from layerbank.workers.local import LocalExtractor, ModelLoadError

    try:
        ex = LocalExtractor.open(settings.data_dir, model=settings.model,
                                 **settings.extraction_options(), threads=settings.threads)
    except (ModelLoadError, RuntimeError) as e:
        fail(str(e))
        raise
    with ex:
        try:
            x = ex.features(table.texts, view, args.pooling, job_id="cli-" + uuid.uuid4().hex[:10])
        except ViewError as e:
            fail(str(e))
            raise
    np.save(args.out, x)
    print(f"wrote {args.out}: {x.shape[0]} texts x {' x '.join(map(str, x.shape[1:]))} "
          f"({view.spec}, {args.pooling}, float32)", file=sys.stderr)
    return 0

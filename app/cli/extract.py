"""``layerbank extract FILE``: run the encoder once over a file, store every layer."""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from typing import Any

from layerbank.app.cli.common import (
    add_common_flags,
    add_flag,
    add_input_flags,
    add_poolings_flag,
    add_setting_flags,
    fail,
    load_table,
    settings_from,
)
from layerbank.app.cli.store_first import StoreFirst, locate
from layerbank.app.inputs import TextTable
from layerbank.workers.extract import ExtractSummary


def register(sub: Any) -> None:
    p = sub.add_parser("extract", help="encode a file once and store every layer")
    add_input_flags(p)
    add_common_flags(p)
    add_poolings_flag(p)
    add_flag(p, "--tokens", action="store_true", help="also store token-level states of every layer")
    add_setting_flags(p, "backend", "ray_address")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    table = load_table(args)
    source = locate(settings)  # a model that cannot be had fails here, before torch
    t0 = time.perf_counter()
    with StoreFirst.open(settings, source) as sf:
        cached = sf.all_stored(table.texts, want_tokens=args.tokens)
        if cached is not None:  # nothing to encode: torch and the weights stay unloaded
            _report(sf.model_name, cached, table, time.perf_counter() - t0)
            return 0
    from layerbank.workers.backends.ray_backend import RayExtractionError, RayUnavailable
    from layerbank.workers.local import LocalExtractor, ModelLoadError  # imports torch: only when run

    try:
        ex = LocalExtractor.open(settings.data_dir, model=settings.model,
                                 **settings.extraction_options(), threads=settings.threads)
    except ModelLoadError as e:
        fail(str(e))
        raise
    except RuntimeError as e:  # the data directory is held by a server
        fail(str(e))
        raise
    with ex:
        from layerbank.app.cli.cost import announce
        from layerbank.workers.engines.choice import choices_line

        print(f"layerbank: {choices_line(ex.encoder.info)}", file=sys.stderr)  # what auto measured

        announce(ex, table.texts, want_tokens=args.tokens)  # a large run says what it will cost first
        try:
            summary = ex.extract(table.texts, job_id="cli-" + uuid.uuid4().hex[:10],
                                 want_tokens=args.tokens, progress_bar=not args.no_progress,
                                 max_tokens=settings.max_tokens_per_batch,
                                 part_size=settings.part_size,
                                 backend=args.backend or settings.backend,
                                 ray_address=args.ray_address or settings.ray_address,
                                 ray_actors=settings.ray_actors)
        except (RayUnavailable, RayExtractionError) as e:  # parts committed so far stay stored
            fail(str(e))
            raise
    _report(ex.model_name, summary, table, time.perf_counter() - t0)
    return 0


def _report(model_name: str, s: ExtractSummary, table: TextTable, seconds: float) -> None:
    rate = s.tokens_encoded / s.seconds if s.seconds > 0 and s.tokens_encoded else 0.0
    print(f"model      {model_name}")
    print(f"texts      {s.texts} ({s.unique_texts} unique, {len(table.skipped_empty)} empty skipped)")
    print(f"cache hits {s.cache_hits}")
    print(f"encoded    {s.texts_encoded} texts, {s.tokens_encoded} tokens ({rate:,.0f} tokens/s)")
    print(f"truncated  {s.truncated}")
    print(f"written    {s.bytes_written:,} bytes in {s.shards_written} shards")
    print(f"seconds    {seconds:.2f}")

"""``layerbank repair``: rebuild a damaged catalog from the shards.

    layerbank repair --data-dir layerbank-data            check, and rebuild if damaged
    layerbank repair --data-dir layerbank-data --force    rebuild even if it looks sound
    layerbank repair --data-dir /shared --catalog-url postgresql://...   re-index a PostgreSQL catalog

The key index is rebuilt from what every shard carries (keys, model
fingerprint, extraction config); datasets, jobs, heads and models are copied
where their rows can still be read, and the command says what was lost. The
damaged file is kept beside the new one. It takes the data directory's lock,
so it refuses to run beside a server. Exit status: 0 sound or repaired, 2 if
it could not run.

With a PostgreSQL catalog (``--catalog-url`` or ``LAYERBANK_CATALOG_URL``)
there is no file to rebuild: the key index is made to match the shard files
(``cache/repair.py`` ``reindex_catalog``). Stop every replica first. Without
it, a directory marked as a PostgreSQL catalog's (``catalog.postgresql``,
written by the replicas) is refused, naming ``--catalog-url``: no
``catalog.sqlite`` is written beside running replicas, ``--force`` or not.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from layerbank.app.cli.common import add_setting_flags, fail, settings_from

__all__ = ["register", "run"]


def register(sub: Any) -> None:
    p = sub.add_parser("repair", help="rebuild a damaged catalog from the shards")
    add_setting_flags(p, "data_dir")
    p.add_argument("--force", action="store_true", help="rebuild even if the catalog passes its check")
    add_setting_flags(p, "catalog_url", help={"catalog_url": "a PostgreSQL catalog: re-index it from the "
                                              "shard files (stop every replica first)"})
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from layerbank.cache.lock import DataDirBusy, DataDirLock
    from layerbank.cache.repair import (
        PostgresDirectory,
        check_catalog,
        refuse_postgres_directory,
        repair_catalog,
    )
    from layerbank.cache.storage_local import LocalShardStorage

    settings = settings_from(args)
    data_dir, url = settings.data_dir, settings.catalog_url
    if url:
        return _reindex(data_dir, url)
    try:  # a replicas' directory (its PostgreSQL marker): name --catalog-url, write nothing
        refuse_postgres_directory(data_dir)
    except PostgresDirectory as e:
        fail(str(e))
    if not LocalShardStorage(data_dir, create=False).exists() and not (data_dir / "catalog.sqlite").exists():
        fail(f"{data_dir} is not a layerbank data directory (no catalog.sqlite, no shards/)")
    lock = DataDirLock(data_dir)
    try:
        lock.acquire()
    except DataDirBusy as e:
        fail(str(e))
    try:
        problem = check_catalog(data_dir / "catalog.sqlite")
        if problem is None and not args.force:
            print(f"layerbank: the catalog in {data_dir} passes its check; nothing to repair "
                  "(--force rebuilds it anyway)", file=sys.stderr)
            return 0
        if problem is not None:
            print(f"layerbank: the catalog is damaged: {problem}", file=sys.stderr)
        report = repair_catalog(data_dir)
    finally:
        lock.release()
    for line in report.lines():
        print(f"layerbank: {line}", file=sys.stderr)
    return 0


def _reindex(data_dir: Path, url: str) -> int:
    from layerbank.cache.catalog import redacted
    from layerbank.cache.repair import reindex_catalog
    from layerbank.cache.storage_local import LocalShardStorage

    if not LocalShardStorage(data_dir, create=False).exists():
        fail(f"{data_dir} holds no shards/ directory")
    try:
        report = reindex_catalog(data_dir, url)
    except Exception as e:  # noqa: BLE001  (psycopg's errors: refused, auth, no such database)
        fail(f"cannot use the catalog at {redacted(url)}: {str(e).strip().splitlines()[0]}")
    for line in report.lines():
        print(f"layerbank: {line}", file=sys.stderr)
    return 0

"""``layerbank``: the command line.

    layerbank extract FILE --text-column sentence     encode once, store every layer
    layerbank features FILE --view layer:-2 --out X.npy
    layerbank serve                                   HTTP API + its worker
    layerbank probe FILE --label-column label         which layer, which pooling?
    layerbank --version                               layerbank 0.2.0

Each subcommand lives in its own module under ``app/cli``. Importing this
module does not import torch: commands that run the encoder import it when run.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from layerbank import __version__
from layerbank.app.cli.common import add_progress_flag, quiet_progress

__all__ = ["main"]

# module names under layerbank.app.cli, in the order `layerbank --help` lists them
COMMANDS = ["extract", "features", "serve", "worker", "probe", "regimes", "repair"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="layerbank", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"layerbank {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"layerbank.app.cli.{name}").register(sub)
    for command in sub.choices.values():  # every subcommand gets --no-progress from here, once
        add_progress_flag(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.no_progress:
        quiet_progress()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from layerbank.cache.store import CatalogMismatch

    try:
        return int(args.run(args) or 0)
    except CatalogMismatch as e:  # one line, not a traceback: the fix is a flag
        print(f"layerbank: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

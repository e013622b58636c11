"""Shared pieces of the command line: flags with environment twins, turning
parsed flags into Settings, and what more than one command does (read the
input file, open the extractor, draw a progress bar).

Every flag ``--some-flag`` has the twin ``LAYERBANK_SOME_FLAG``; flags that
are Settings fields are validated by Settings itself. A command module imports
its helpers from here (or cost.py, store_first.py, worker_process.py), never
from another command (tests/unit/test_import_rules.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from layerbank.app.api.settings import Settings
from layerbank.cache.keys import PRECISION_CHOICES
from layerbank.cache.poolings import POOLING_NAMES

if TYPE_CHECKING:
    from layerbank.app.inputs import TextTable

__all__ = [
    "URL_HINT",
    "ProgressBar",
    "add_backend_flags",
    "add_common_flags",
    "add_flag",
    "add_input_flags",
    "add_poolings_flag",
    "add_progress_flag",
    "add_url_flag",
    "fail",
    "load_table",
    "open_extractor",
    "quiet_progress",
    "settings_from",
    "through_a_server",
]

# what `features` and `probe` add to the refusal of a data directory a server holds
URL_HINT = "--url URL (env LAYERBANK_URL)"


def _env(flag: str) -> str:
    return "LAYERBANK_" + flag.lstrip("-").replace("-", "_").upper()


def add_flag(parser: argparse.ArgumentParser, flag: str, **kw: Any) -> None:
    """Add ``flag``; its default comes from the environment twin when set."""
    env = _env(flag)
    raw = os.environ.get(env)
    if raw is not None and raw != "":
        if kw.get("action") == "store_true":
            kw["default"] = raw.lower() in ("1", "true", "yes", "on")
        else:
            kw["default"] = raw
    help_ = kw.pop("help", "")
    parser.add_argument(flag, help=f"{help_} [env {env}]".strip(), **kw)


def add_common_flags(p: argparse.ArgumentParser, *, several_models: bool = False) -> None:
    """Flags that are Settings fields. Defaults stay None so Settings decides.

    ``several_models``: ``--model`` may be given more than once (``serve``, ``worker``)."""
    p.add_argument("--data-dir", help="data directory [env LAYERBANK_DATA_DIR]")
    if several_models:
        p.add_argument("--model", action="append", help="model name or path; give it again to serve "
                       "several (the first is the default, 'embedded' names the bundled "
                       "all-MiniLM-L6-v2) [env LAYERBANK_MODEL, LAYERBANK_MODELS=a,b]")
    else:
        p.add_argument("--model", help="model name or path (default: embedded all-MiniLM-L6-v2) "
                       "[env LAYERBANK_MODEL]")
    p.add_argument("--device", help="cpu, cuda, cuda:N or auto [env LAYERBANK_DEVICE]")
    p.add_argument("--precision", choices=PRECISION_CHOICES,
                   help="compute precision; auto: fp32 or bf16, whichever measured faster here "
                   "(stored in the data directory) [env LAYERBANK_PRECISION]")
    p.add_argument("--engine", choices=["auto", "torch", "onnx"],
                   help="what runs the model on a CPU at fp32: torch, ONNX Runtime, or auto (the faster, "
                   "timed once per machine; same numbers within 1e-4) [env LAYERBANK_ENGINE]")
    p.add_argument("--max-length", type=int, help="truncate texts at this many tokens "
                   "[env LAYERBANK_MAX_LENGTH]")
    p.add_argument("--storage-dtype", choices=["float16", "float32", "int8"],
                   help="dtype of stored vectors (int8: a float32 scale per row per layer, half "
                   "float16's bytes; docs/storage.md) [env LAYERBANK_STORAGE_DTYPE]")
    p.add_argument("--threads", type=int, help="torch CPU threads [env LAYERBANK_THREADS]")


def add_poolings_flag(p: argparse.ArgumentParser) -> None:
    """``--poolings``, the Settings field (serve, worker, extract, features; ``probe``'s
    own ``--poolings`` says which to probe)."""
    p.add_argument("--poolings", help="poolings stored per text, comma-separated, from: "
                   f"{', '.join(POOLING_NAMES)} (default: mean,cls,max) [env LAYERBANK_POOLINGS]")


def add_url_flag(p: argparse.ArgumentParser) -> None:
    """``--url`` (twin LAYERBANK_URL): read through a running server, as ``Bank(url=...)`` does.

    A server holds its data directory; without this flag the command is refused there."""
    add_flag(p, "--url", help="read through the layerbank server at this address (e.g. "
             "http://127.0.0.1:8000; its API key from LAYERBANK_API_KEY) instead of the data directory: "
             "nothing is loaded here")


def through_a_server(message: str, data_dir: Any) -> str:
    """A refusal of a held data directory, plus how ``--url`` reads through its server
    (the address from the server.json the server wrote, when it wrote one)."""
    import json
    from pathlib import Path

    try:
        url = json.loads((Path(data_dir) / "server.json").read_text())["url"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{message}; to read through a server: {URL_HINT}"
    return f"{message}; to read through that server: --url {url}"


def add_progress_flag(p: argparse.ArgumentParser) -> None:
    """``--no-progress`` (twin LAYERBANK_NO_PROGRESS), unless ``p`` has it already.

    main.py adds it to every subcommand, so a script can pass it to any."""
    if any("--no-progress" in a.option_strings for a in p._actions):
        return
    add_flag(p, "--no-progress", action="store_true", help="no progress bars (layerbank's and the model "
             "loader's); the cost line before a long run stays")


def quiet_progress() -> None:
    """Turn every progress bar off, in this process and the processes it starts.

    tqdm (ours) reads TQDM_DISABLE; Hugging Face's loaders read
    HF_HUB_DISABLE_PROGRESS_BARS when imported, or are told directly when
    they already are."""
    os.environ["TQDM_DISABLE"] = "1"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def settings_from(args: argparse.Namespace) -> Settings:
    """Settings from the environment, overridden by the flags that were given."""
    given = {k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None}
    try:
        return Settings(**given)
    except Exception as e:  # pydantic ValidationError: show it as a usage error
        fail(f"invalid setting: {e}")
        raise


def fail(message: str, code: int = 2) -> None:
    print(f"layerbank: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def add_input_flags(p: argparse.ArgumentParser) -> None:
    """FILE and how to read it (``extract``, ``features``)."""
    from layerbank.app.inputs import FORMATS

    p.add_argument("file", help="a .txt, .jsonl, .csv, .tsv or .parquet file of texts, or a "
                   "Hugging Face dataset directory (save_to_disk)")
    add_flag(p, "--text-column", help="column (or JSON field) holding the text")
    add_flag(p, "--format", choices=FORMATS, help="file format (default: from the suffix)")
    add_flag(p, "--no-header", action="store_true", help="the CSV/TSV file has no header row; "
             "columns are then named 0, 1, ...")


def add_backend_flags(p: argparse.ArgumentParser) -> None:
    """Where dataset extraction runs (docs/operations.md): ``serve`` and ``worker``."""
    add_flag(p, "--backend", choices=["embedded", "ray"],
             help="run dataset extraction here (embedded) or on a Ray cluster (ray)")
    add_flag(p, "--ray-address", help="Ray cluster address: auto, host:port, or local")
    add_flag(p, "--ray-actors", help="encoder actors on Ray (one GPU each)")


def load_table(args: argparse.Namespace, label_column: str | None = None) -> TextTable:
    """``args.file`` read with the command's column and format flags; a bad file exits
    with its one-line reason, and skipped empty texts are named on stderr."""
    from layerbank.app.inputs import InputError, read_texts

    try:
        table = read_texts(args.file, text_column=args.text_column, label_column=label_column,
                           header=not args.no_header, fmt=args.format)
    except InputError as e:
        fail(str(e))
        raise
    if table.skipped_empty:
        shown = ", ".join(map(str, table.skipped_empty[:10]))
        more = "" if len(table.skipped_empty) <= 10 else f" and {len(table.skipped_empty) - 10} more"
        print(f"skipped {len(table.skipped_empty)} empty texts (lines {shown}{more})", file=sys.stderr)
    return table


def open_extractor(settings: Settings) -> Any:
    """The in-process extractor (``probe``, ``regimes``): loads torch and the weights, or
    exits with the reason (a held data directory names ``--url``)."""
    from layerbank.workers.local import LocalExtractor, ModelLoadError  # imports torch: only when run

    try:
        return LocalExtractor.open(settings.data_dir, model=settings.model,
                                   **settings.extraction_options(), threads=settings.threads)
    except ModelLoadError as e:
        fail(str(e))
        raise
    except RuntimeError as e:  # a server holds the data directory
        fail(through_a_server(str(e), settings.data_dir))
        raise


class ProgressBar:
    """A tqdm bar on stderr fed ``(done, total)``; tqdm shows the rate and the ETA."""

    def __init__(self, enabled: bool, unit: str, desc: str | None = None) -> None:
        self.enabled, self.unit, self.desc = enabled, unit, desc
        self.bar: Any = None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit=self.unit, desc=self.desc, file=sys.stderr, dynamic_ncols=True)
        self.bar.n = done
        self.bar.refresh()

    def stage(self, text: str) -> None:
        """Name what the bar is counting now (e.g. which regime and seed)."""
        self.desc = text
        if self.bar is not None:
            self.bar.set_description(text, refresh=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

"""Shared pieces of the command line: flags with environment twins, turning
parsed flags into Settings, and what more than one command does (read the
input file, open the extractor, draw a progress bar).

Every flag ``--some-flag`` has the twin ``LAYERBANK_SOME_FLAG``. A flag that
is a setting is generated from its declaration in ``layerbank/settings.py``
(``add_setting_flags``: name, choices, help, twin), and validated by Settings;
a command names the settings it takes. Options that are not settings
(``--text-column``) are declared with ``add_flag``. A command module imports
its helpers from here (or cost.py, store_first.py, worker_process.py), never
from another command (tests/unit/test_import_rules.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, NoReturn, get_args, get_origin

from layerbank.settings import Settings, env_name, environment_value

if TYPE_CHECKING:
    from layerbank.app.inputs import TextTable

__all__ = [
    "COMMON_SETTINGS",
    "URL_HINT",
    "ProgressBar",
    "add_backend_flags",
    "add_common_flags",
    "add_flag",
    "add_input_flags",
    "add_poolings_flag",
    "add_progress_flag",
    "add_setting_flags",
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

# the settings every command that runs the encoder takes: which model, and what changes its numbers
COMMON_SETTINGS = ("data_dir", "model", "device", "precision", "engine", "max_length", "storage_dtype",
                   "threads")

# `--model` given more than once (serve, worker): the one flag whose shape depends on the command
_SEVERAL_MODELS = ("model name or path; give it again to serve several (the first is the default, "
                   "'embedded' names the bundled all-MiniLM-L6-v2)")


def add_flag(parser: argparse.ArgumentParser, flag: str, **kw: Any) -> None:
    """Add ``flag``, an option that is not a setting; its default comes from the
    environment twin when set."""
    raw = environment_value(flag)
    if raw is not None:
        if kw.get("action") == "store_true":
            kw["default"] = raw.lower() in ("1", "true", "yes", "on")
        else:
            kw["default"] = raw
    help_ = kw.pop("help", "")
    parser.add_argument(flag, help=f"{help_} [env {env_name(flag)}]".strip(), **kw)


def add_setting_flags(p: argparse.ArgumentParser, *names: str, several_models: bool = False,
                      help: Mapping[str, str] | None = None) -> None:
    """One flag per named Settings field, generated from its declaration: ``--some-name``,
    choices from a ``Literal`` type, the field's description as help, and its twin.

    Defaults stay None so that Settings decides (the twin, else the declared default);
    values arrive as strings and Settings validates them. ``several_models``: ``--model``
    may be given more than once. ``help``: a command's own words for a field where the
    flag means something narrower there (``repair --catalog-url`` re-indexes it)."""
    for name in names:
        field = Settings.model_fields[name]
        kw: dict[str, Any] = {}
        text = (help or {}).get(name) or field.description or ""
        twins = env_name(name)
        if name == "model" and several_models:
            kw["action"] = "append"
            text, twins = _SEVERAL_MODELS, f"{twins}, {env_name('models')}=a,b"
        elif field.annotation is bool:
            kw.update(action="store_true", default=None)
        elif get_origin(field.annotation) is Literal:
            kw["choices"] = list(get_args(field.annotation))
        p.add_argument("--" + name.replace("_", "-"), help=f"{text} [env {twins}]", **kw)


def add_common_flags(p: argparse.ArgumentParser, *, several_models: bool = False) -> None:
    """The ``COMMON_SETTINGS`` flags."""
    add_setting_flags(p, *COMMON_SETTINGS, several_models=several_models)


def add_poolings_flag(p: argparse.ArgumentParser) -> None:
    """``--poolings``, the setting (serve, worker, extract, features; ``probe``'s own
    ``--poolings`` says which to probe)."""
    add_setting_flags(p, "poolings")


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
    """``--no-progress`` (twin LAYERBANK_NO_PROGRESS): main.py adds it to every
    subcommand, once, so a script can pass it to any."""
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


def fail(message: str, code: int = 2) -> NoReturn:
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
    add_setting_flags(p, "backend", "ray_address", "ray_actors")


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

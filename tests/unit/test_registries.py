"""Each list in one place: the API's schemas, the settings, the CLI's choices
and help texts, and the docs say what the registry says.

Registries: poolings (layerbank.cache.poolings, functions in
layerbank.workers.pooling), precision modes (layerbank.cache.keys).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from layerbank.app.api.schemas import EmbeddingsRequest, FeaturesRequest
from layerbank.app.api.settings import Settings
from layerbank.app.cli.main import build_parser
from layerbank.cache.keys import PRECISION_CHOICES, PRECISIONS
from layerbank.cache.poolings import POOLING_NAMES

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _subcommand(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    return next(a for a in parser._actions if flag in a.option_strings)


def _enum(model: type, field: str) -> list[str]:
    prop = model.model_json_schema()["properties"][field]  # type: ignore[attr-defined]
    return next(x["enum"] for x in prop.get("anyOf", [prop]) if "enum" in x)


# -- poolings ----------------------------------------------------------------
def test_pooling_schemas_and_settings_list_the_registry() -> None:
    assert _enum(FeaturesRequest, "pooling") == list(POOLING_NAMES)
    assert _enum(EmbeddingsRequest, "pooling") == list(POOLING_NAMES)
    assert _enum(Settings, "default_pooling") == list(POOLING_NAMES)
    from layerbank.app.probes.requests import ProbeCreate

    items = ProbeCreate.model_json_schema()["properties"]["poolings"]
    assert items["items"]["enum"] == list(POOLING_NAMES) and items["maxItems"] == len(POOLING_NAMES)


def test_pooling_cli_choices_and_help_list_the_registry() -> None:
    assert list(_option(_subcommand("features"), "--pooling").choices) == list(POOLING_NAMES)  # type: ignore[arg-type]
    for command in ("serve", "worker", "extract", "features"):
        help_ = _option(_subcommand(command), "--poolings").help or ""
        assert all(name in help_ for name in POOLING_NAMES), (command, help_)
    assert all(name in (_option(_subcommand("probe"), "--poolings").help or "") for name in POOLING_NAMES)


def test_the_poolings_setting_is_checked_against_the_registry() -> None:
    assert Settings(poolings=" max, mean").pooling_names == ("max", "mean")
    assert Settings(poolings="max,mean").extraction_options()["poolings"] == "max,mean"
    with pytest.raises(ValueError, match="unknown pooling 'avg'; known: " + ", ".join(POOLING_NAMES)):
        Settings(poolings="mean,avg")
    with pytest.raises(ValueError, match="default_pooling 'mean' is not among the poolings stored"):
        Settings(poolings="cls,max")


def test_the_storage_doc_has_a_row_for_every_pooling() -> None:
    text = (DOCS / "storage.md").read_text()
    section = text.split("## Poolings", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \|", section, re.M)
    assert rows == list(POOLING_NAMES)


# -- precision modes ---------------------------------------------------------
def test_precision_schemas_settings_and_cli_list_the_registry() -> None:
    assert _enum(FeaturesRequest, "precision") == list(PRECISION_CHOICES)
    assert _enum(EmbeddingsRequest, "precision") == list(PRECISION_CHOICES)
    assert _enum(Settings, "precision") == list(PRECISION_CHOICES)
    for command in ("serve", "extract", "features", "probe"):
        assert list(_option(_subcommand(command), "--precision").choices) == list(PRECISION_CHOICES)  # type: ignore[arg-type]
    assert PRECISION_CHOICES[2:] == PRECISIONS


def test_the_worker_table_and_the_precision_doc_cover_every_mode() -> None:
    from layerbank.workers.precision import PRECISION_CHOICES as WORKER_CHOICES
    from layerbank.workers.precision import precision_table

    assert WORKER_CHOICES is PRECISION_CHOICES
    assert list(precision_table("cpu", cpu_flags=set())) == list(PRECISION_CHOICES)
    doc = (DOCS / "precision.md").read_text()
    assert all(f"`{mode}`" in doc for mode in PRECISION_CHOICES), [m for m in PRECISION_CHOICES if f"`{m}`" not in doc]

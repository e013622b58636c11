"""Each list in one place: the API's schemas, the settings, the CLI's choices
and help texts, and the docs say what the registry says.

Registries: poolings (layerbank.cache.poolings, functions in
layerbank.workers.pooling), precision modes (layerbank.cache.keys), views
(layerbank.cache.views.VIEW_FORMS), heads (layerbank.app.probes.head_names).
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
    from layerbank.app.api.probe_jobs.requests import ProbeCreate

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
    assert list(precision_table("cpu")) == list(PRECISION_CHOICES)
    doc = (DOCS / "precision.md").read_text()
    assert all(f"`{mode}`" in doc for mode in PRECISION_CHOICES), [m for m in PRECISION_CHOICES if f"`{m}`" not in doc]


# -- views -------------------------------------------------------------------
def test_views_named_in_the_grammar_parse_and_the_schema_pattern_takes_them() -> None:
    from layerbank.app.api.schemas import view_pattern
    from layerbank.cache.views import NAMED_VIEWS, VIEW_FORMS, parse_view

    assert NAMED_VIEWS == ("concat_last_4", "sum_last_4", "mean_all", "all_layers")
    for name in NAMED_VIEWS:
        assert parse_view(name).spec == name
        assert re.fullmatch(view_pattern(7), name), name
    # a 3-state model has no last 4 layers: its pattern leaves those views out
    assert [v for v in NAMED_VIEWS if re.fullmatch(view_pattern(3), v)] == ["mean_all", "all_layers"]
    for form, example in zip(VIEW_FORMS, ("layer:-2", "layers:0,2", None, None, None, "weighted:1,0,0", None)):
        if example is not None:
            assert parse_view(example).spec == example and re.fullmatch(view_pattern(3), example), form


def test_view_descriptions_help_info_and_docs_list_every_form() -> None:
    from layerbank.cache.views import VIEW_FORMS, VIEW_GRAMMAR, ViewError, parse_view

    description = FeaturesRequest.model_json_schema()["properties"]["view"]["description"]
    help_ = _option(_subcommand("features"), "--view").help or ""
    api_doc = (DOCS / "api.md").read_text()
    for form in VIEW_FORMS:
        assert form in description and form in help_ and f"`{form}`" in api_doc, form
    with pytest.raises(ViewError) as e:
        parse_view("layer-3")
    assert str(e.value) == f"unknown view 'layer-3'; expected {VIEW_GRAMMAR}"


def test_info_lists_the_view_forms_and_the_stored_poolings(tiny_api_factory) -> None:  # type: ignore[no-untyped-def]
    from layerbank.cache.views import VIEW_FORMS

    body = tiny_api_factory(worker=False, poolings="max,mean").client.get("/info").json()
    assert body["views"] == list(VIEW_FORMS)
    assert body["poolings"] == ["max", "mean"]


# -- heads -------------------------------------------------------------------
def test_every_head_name_builds_a_head_and_nothing_else_does() -> None:
    from layerbank.app.probes.head_names import HEAD_NAMES, PROBE_HEADS
    from layerbank.app.probes.heads import _HEAD_CLASSES, ProbeInputError, make_head

    assert tuple(_HEAD_CLASSES) + ("scalar_mix",) == HEAD_NAMES
    assert PROBE_HEADS == tuple(h for h in HEAD_NAMES if h != "scalar_mix")
    for name in HEAD_NAMES:
        assert make_head(name, seed=0).get_params() is not None
    with pytest.raises(ProbeInputError, match="choose one of " + ", ".join(HEAD_NAMES)):
        make_head("forest")


def test_head_descriptions_help_and_docs_list_every_head() -> None:
    from layerbank.app.api.probe_jobs.requests import ProbeCreate
    from layerbank.app.api.routes.heads import HeadCreate
    from layerbank.app.probes.head_names import HEAD_NAMES, PROBE_HEADS

    heads_field = HeadCreate.model_json_schema()["properties"]["head"]["description"]
    probe_field = ProbeCreate.model_json_schema()["properties"]["head"]["description"]
    help_ = _option(_subcommand("probe"), "--head").help or ""
    doc = (DOCS / "probes.md").read_text()
    for name in HEAD_NAMES:
        assert name in heads_field and f"`{name}`" in doc, name
    for name in PROBE_HEADS:
        assert name in probe_field and name in help_, name
    assert "scalar_mix" not in probe_field and "scalar_mix" not in help_

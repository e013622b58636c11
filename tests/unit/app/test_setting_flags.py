"""The command line's setting flags are generated from the one declaration
(layerbank/settings.py): a flag's help is its field's description, its choices
the field's Literal, its twin ``LAYERBANK_<NAME>``; and a twin reaches the value
whether the flag was given or not (the flag wins)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal, get_args, get_origin

import pytest

from layerbank.app.cli.common import settings_from
from layerbank.app.cli.main import build_parser
from layerbank.settings import Settings, env_name, setting


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _setting_actions() -> list[tuple[str, str, argparse.Action]]:
    return [(cmd, a.dest, a) for cmd, p in _subparsers().items() for a in p._actions
            if a.dest in Settings.model_fields and a.option_strings]


def test_every_setting_has_its_help_in_the_declaration() -> None:
    missing = [name for name, f in Settings.model_fields.items() if not f.description]
    assert missing == []


def test_each_setting_flag_is_generated_from_its_field() -> None:
    actions = _setting_actions()
    assert len(actions) > 50  # serve alone takes ~30
    for cmd, name, a in actions:
        field = Settings.model_fields[name]
        assert a.option_strings == ["--" + name.replace("_", "-")], (cmd, name)
        assert a.default is None, (cmd, name)  # Settings decides: the twin, else the declared default
        assert env_name(name) in a.help, (cmd, name)
        several = cmd in ("serve", "worker") and name == "model"
        if not several and not (cmd == "repair" and name == "catalog_url"):
            assert a.help == f"{field.description} [env {env_name(name)}]", (cmd, name)
        if get_origin(field.annotation) is Literal:
            assert list(a.choices) == list(get_args(field.annotation)), (cmd, name)


def test_serve_keeps_its_flags_and_their_twins() -> None:
    serve = {s for a in _subparsers()["serve"]._actions for s in a.option_strings}
    assert {"--port", "--host", "--api-key", "--insecure", "--catalog-url", "--max-body-bytes",
            "--log-level", "--ray-actors", "--model", "--poolings", "--no-progress"} <= serve


def test_a_twin_sets_the_value_and_the_flag_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAYERBANK_PART_SIZE", "99")
    monkeypatch.setenv("LAYERBANK_INSECURE", "1")
    parser = build_parser()
    s = settings_from(parser.parse_args(["serve"]))
    assert (s.part_size, s.insecure) == (99, True)
    s = settings_from(parser.parse_args(["serve", "--part-size", "7"]))
    assert (s.part_size, s.insecure) == (7, True)
    monkeypatch.setenv("LAYERBANK_TEXT_COLUMN", "sentence")  # an option's twin, not a setting
    assert build_parser().parse_args(["extract", "f.tsv"]).text_column == "sentence"


def test_a_bad_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        settings_from(build_parser().parse_args(["serve", "--port", "70000"]))
    assert e.value.code == 2
    assert "invalid setting" in capsys.readouterr().err


def test_one_setting_read_alone_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    assert setting("catalog_statement_timeout_s") == 120.0
    monkeypatch.setenv("LAYERBANK_CATALOG_STATEMENT_TIMEOUT_S", "2.5")
    assert setting("catalog_statement_timeout_s") == 2.5
    monkeypatch.setenv("LAYERBANK_CATALOG_STATEMENT_TIMEOUT_S", "-1")
    with pytest.raises(ValueError):
        setting("catalog_statement_timeout_s")


def test_the_catalog_url_comes_through_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from layerbank.cache.catalog import catalog_url

    monkeypatch.setenv("LAYERBANK_CATALOG_URL", "postgresql://u@h/db")
    assert catalog_url() == "postgresql://u@h/db"
    assert catalog_url("") is None  # the data directory's SQLite file, whatever is configured
    monkeypatch.setenv("LAYERBANK_CATALOG_URL", "")
    assert catalog_url() is None


def test_the_catalog_statement_timeout_comes_through_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("psycopg")
    from layerbank.cache.postgres import _bounds

    assert _bounds("postgresql://u@h/db", 5.0)["options"] == "-c statement_timeout=120000"
    monkeypatch.setenv("LAYERBANK_CATALOG_STATEMENT_TIMEOUT_S", "2.5")
    assert _bounds("postgresql://u@h/db", 5.0)["options"] == "-c statement_timeout=2500"
    monkeypatch.setenv("LAYERBANK_CATALOG_STATEMENT_TIMEOUT_S", "0")  # 0: no limit
    assert "options" not in _bounds("postgresql://u@h/db", 5.0)


def test_the_open_shard_budget_is_a_setting_the_server_and_worker_take(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from layerbank.app.api.deps import AppState

    parser = build_parser()
    assert Settings().reader_memory_mb == 32  # 53 shard files at ~0.6 MB each (cache/reader_budget.py)
    monkeypatch.setenv("LAYERBANK_READER_MEMORY_MB", "12")
    assert settings_from(parser.parse_args(["worker"])).reader_memory_mb == 12
    s = settings_from(parser.parse_args(["serve", "--reader-memory-mb", "120", "--data-dir", str(tmp_path)]))
    assert s.reader_memory_mb == 120
    state = AppState(s)
    try:
        assert state.store.max_open_readers == 200  # 120 MB at 0.6 MB a file
    finally:
        state.store.close()
    monkeypatch.setenv("LAYERBANK_READER_MEMORY_MB", "0")
    with pytest.raises(SystemExit):
        settings_from(parser.parse_args(["serve"]))

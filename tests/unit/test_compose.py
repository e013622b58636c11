"""docker-compose.yml and the Dockerfile against the project (Docker cannot run here).

Every command a service runs (its ``command`` and its health check, shell
scripts split into simple commands) must parse: ``layerbank ...`` with the
real ``layerbank.app.cli.main.build_parser()``, ``ray ...`` with Ray's own click commands,
``python -c CODE`` must compile. Every ``LAYERBANK_*`` name in the file must be
a Settings field or the twin of a command-line flag. The layout a user
relies on is checked too: one data volume at the data directory on every
node that touches shards, NVIDIA reservations on GPU services, /ready checks.
"""

from __future__ import annotations

import argparse
import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import yaml as yaml

from layerbank.app.cli.main import build_parser
from layerbank.app.api.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
_SHELL_WORDS = {"if", "then", "else", "elif", "fi", ";", "&&", "||"}
_SHELL_BUILTINS = {"[", "exit", "exec", "test", "true"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def commands_of(service: dict[str, Any]) -> Iterator[list[str]]:
    """Simple commands (argv lists) a service runs: its command and health check."""
    sources = []
    if "command" in service:
        sources.append(service["command"])
    test = service.get("healthcheck", {}).get("test")
    if test:
        if test[0] == "CMD-SHELL":
            sources.append(["sh", "-c", test[1]])
        else:
            assert test[0] == "CMD", test
            sources.append(test[1:])
    for argv in sources:
        argv = shlex.split(argv) if isinstance(argv, str) else [str(a) for a in argv]
        if argv[:2] == ["sh", "-c"]:
            yield from split_script(argv[2].replace("$$", "$"))
        else:
            yield argv


def split_script(script: str) -> Iterator[list[str]]:
    lex = shlex.shlex(script, posix=True, punctuation_chars=";&|")
    lex.whitespace_split = True
    cur: list[str] = []
    for tok in list(lex) + [";"]:
        if tok in _SHELL_WORDS:
            if cur:
                yield cur[1:] if cur[0] == "exec" else cur
            cur = []
        else:
            cur.append(tok)


def flag_twins(parser: argparse.ArgumentParser) -> set[str]:
    """LAYERBANK_* twins of every long flag of every subcommand."""
    out = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= flag_twins(sub)
        for opt in action.option_strings:
            if opt.startswith("--") and opt != "--help":
                out.add("LAYERBANK_" + opt[2:].replace("-", "_").upper())
    return out


def test_expected_services_and_profiles(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"api", "gpu-worker", "ray-head", "ray-worker"}
    assert "profiles" not in services["api"]  # `docker compose up` starts the API
    assert services["gpu-worker"]["profiles"] == ["gpu"]
    assert services["ray-head"]["profiles"] == services["ray-worker"]["profiles"] == ["ray"]


def test_layerbank_commands_parse(compose: dict[str, Any]) -> None:
    parser = build_parser()
    seen = {}
    for name, service in compose["services"].items():
        for argv in commands_of(service):
            if argv[0] != "layerbank":
                continue
            try:
                args = parser.parse_args(argv[1:])
            except SystemExit:
                pytest.fail(f"{name}: `{' '.join(argv)}` does not parse with layerbank's CLI")
            seen[name] = args.command
    assert seen == {"api": "serve", "gpu-worker": "worker"}


def test_ray_commands_parse(compose: dict[str, Any]) -> None:
    import ray  # noqa: F401
    import click
    from ray.scripts.scripts import cli

    used = set()
    for name, service in compose["services"].items():
        for argv in commands_of(service):
            if argv[0] != "ray":
                continue
            cmd = cli.commands.get(argv[1])
            assert cmd is not None, f"{name}: no `ray {argv[1]}` command"
            try:
                cmd.make_context(f"ray {argv[1]}", argv[2:])  # parses and type-checks, runs nothing
            except click.ClickException as e:  # a bad flag or value
                pytest.fail(f"{name}: `{' '.join(argv)}`: {e}")
            used.add((name, argv[1]))
    assert {("api", "start"), ("ray-head", "start"), ("ray-head", "status"),
            ("ray-worker", "start")} <= used


def test_other_commands_are_shell_builtins_or_python(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for argv in commands_of(service):
            if argv[0] in ("layerbank", "ray"):
                continue
            if argv[0] == "python":
                assert argv[1] == "-c", argv
                compile(argv[2], f"<{name} healthcheck>", "exec")  # a SyntaxError fails the test
            else:
                assert argv[0] in _SHELL_BUILTINS, f"{name}: unexpected program {argv[0]!r}"


def test_every_layerbank_variable_is_a_setting_or_a_flag_twin() -> None:
    names = set(re.findall(r"LAYERBANK_[A-Z0-9_]+", COMPOSE.read_text()))
    known = {"LAYERBANK_" + f.upper() for f in Settings.model_fields} | flag_twins(build_parser())
    assert names, "the compose file sets no LAYERBANK_* variable"
    assert names - known == set()


def test_data_volume_and_gpu_reservations(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert "layerbank-data" in compose["volumes"]
    for name in ("api", "gpu-worker", "ray-head", "ray-worker"):
        s = services[name]
        data_dir = s["environment"]["LAYERBANK_DATA_DIR"]
        # shards are written by actors on Ray nodes and committed by the API: same path everywhere
        assert f"layerbank-data:{data_dir}" in s["volumes"], name
    for name in ("gpu-worker", "ray-worker"):
        (dev,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert dev["driver"] == "nvidia" and "gpu" in dev["capabilities"], name
    for name in ("api", "gpu-worker"):
        assert "/ready" in " ".join(services[name]["healthcheck"]["test"]), name
    api_env = services["api"]["environment"]
    assert api_env["HDF5_USE_FILE_LOCKING"] == "FALSE"
    assert api_env["LAYERBANK_RAY_ADDRESS"] == "auto"


def test_dockerfile_pins_torch_before_installing_the_project() -> None:
    lines = [ln.strip() for ln in (ROOT / "Dockerfile").read_text().splitlines()]
    runs = [ln for ln in lines if ln.startswith("RUN ")]
    torch_at = next(i for i, ln in enumerate(runs) if '"torch==2.13.0"' in ln)
    project_at = next(i for i, ln in enumerate(runs) if 'pip install ".[' in ln)
    assert torch_at < project_at
    extras = re.search(r'pip install "\.\[([^\]]+)\]"', runs[project_at]).group(1).split(",")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras) <= set(declared)
    assert "torch==2.13.0" in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    # what the image copies exists (a missing path fails `docker build`)
    for ln in lines:
        if ln.startswith("COPY "):
            for src in ln.split()[1:-1]:
                assert (ROOT / src).exists(), f"Dockerfile copies {src}, which is not in the project"

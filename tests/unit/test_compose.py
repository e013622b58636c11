"""docker-compose.yml and the Dockerfile against the project (Docker cannot run here).

Every command a service runs (its ``command`` and its health check, shell
scripts split into simple commands) must parse: ``layerbank ...`` with the
real ``layerbank.app.cli.main.build_parser()``, ``ray ...`` with Ray's own click commands,
``python -c CODE`` must compile. Every ``LAYERBANK_*`` name in the file must be
a Settings field or the twin of a command-line flag. The layout a user
relies on is checked too: one data volume at the data directory on every
node that touches shards, NVIDIA reservations on GPU services, /ready checks,
and the ``replicas`` profile: two API replicas and a worker on one PostgreSQL
catalog (the ``postgres`` service, healthy before they start) and one volume.
"""

from __future__ import annotations

import argparse
import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml as yaml

from layerbank.app.api.settings import Settings
from layerbank.app.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
_SHELL_WORDS = {"if", "then", "else", "elif", "fi", ";", "&&", "||"}
_SHELL_BUILTINS = {"[", "exit", "exec", "test", "true"}
_OTHER_PROGRAMS = {"postgres": {"postgres", "pg_isready"}}  # the postgres:15 image's own
REPLICAS = {"api-1", "api-2", "worker", "postgres"}


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
    assert set(services) == {"api", "gpu-worker", "ray-head", "ray-worker"} | REPLICAS
    assert "profiles" not in services["api"]  # `docker compose up` starts the API
    assert services["gpu-worker"]["profiles"] == ["gpu"]
    assert services["ray-head"]["profiles"] == services["ray-worker"]["profiles"] == ["ray"]
    assert {n for n, s in services.items() if "replicas" in s.get("profiles", [])} == REPLICAS


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
    assert seen == {"api": "serve", "gpu-worker": "worker", "api-1": "serve", "api-2": "serve",
                    "worker": "worker"}


def test_ray_commands_parse(compose: dict[str, Any]) -> None:
    import click
    import ray  # noqa: F401
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
                allowed = _SHELL_BUILTINS | _OTHER_PROGRAMS.get(name, set())
                assert argv[0] in allowed, f"{name}: unexpected program {argv[0]!r}"


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


def _catalog_url(service: dict[str, Any]) -> str | None:
    """The catalog URL a layerbank service runs with: its --catalog-url, else its environment's."""
    parser = build_parser()
    for argv in commands_of(service):
        if argv[0] == "layerbank":
            url = getattr(parser.parse_args(argv[1:]), "catalog_url", None)
            if url:
                return str(url)
    return service.get("environment", {}).get("LAYERBANK_CATALOG_URL")


def test_replicas_profile_two_apis_and_a_worker_on_one_postgres_catalog(compose: dict[str, Any]) -> None:
    services = compose["services"]
    layerbank = {n: s for n, s in services.items() if n in REPLICAS - {"postgres"}}
    apis = [n for n, s in layerbank.items() if next(commands_of(s))[1] == "serve"]
    assert sorted(apis) == ["api-1", "api-2"]
    assert next(commands_of(services["worker"]))[1:] == ["worker"]

    # one catalog: the postgres service's database, as its own user; the password reaches
    # libpq as PGPASSWORD, from the same variable the postgres image initialises with
    pg = services["postgres"]
    assert pg["image"] == "postgres:15"
    urls = {n: _catalog_url(s) for n, s in layerbank.items()}
    assert len(set(urls.values())) == 1, urls
    url = urlparse(urls["api-1"])  # type: ignore[type-var]
    assert url.scheme == "postgresql" and url.hostname == "postgres" and url.password is None
    assert url.path == "/" + pg["environment"]["POSTGRES_DB"]
    assert url.username == pg["environment"]["POSTGRES_USER"]
    password = pg["environment"]["POSTGRES_PASSWORD"]
    assert password.startswith("${POSTGRES_PASSWORD")
    for name, s in layerbank.items():
        assert s["environment"]["PGPASSWORD"] == password, name

    # one shard volume at the data directory of all three, not the default api's: a SQLite
    # `serve` removes at start every shard its catalog.sqlite does not list
    mounts = set()
    for s in layerbank.values():
        (mount,) = [v for v in s["volumes"] if v.endswith(":" + s["environment"]["LAYERBANK_DATA_DIR"])]
        mounts.add(mount.split(":")[0])
    assert len(mounts) == 1 and mounts <= set(compose["volumes"]), mounts
    assert mounts.isdisjoint(v.split(":")[0] for v in services["api"]["volumes"])
    assert any(v.startswith("layerbank-postgres:") for v in pg["volumes"])

    # the replicas and the worker start once postgres answers, and it says when it does
    for name in layerbank:
        assert layerbank[name]["depends_on"]["postgres"]["condition"] == "service_healthy", name
    assert pg["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    for name in apis:
        assert "/ready" in " ".join(services[name]["healthcheck"]["test"]), name
    host_ports = [p.split(":")[0] for n in ["api", *apis] for p in services[n]["ports"]]
    assert len(set(host_ports)) == len(host_ports) == 3, host_ports

    # the image carries psycopg (the postgres extra)
    install = next(ln for ln in (ROOT / "Dockerfile").read_text().splitlines() if 'pip install ".[' in ln)
    assert "postgres" in re.search(r'"\.\[([^\]]+)\]"', install).group(1).split(",")  # type: ignore[union-attr]


def test_required_variables_are_the_default_services_own(compose: dict[str, Any]) -> None:
    """Compose interpolates every service before it picks profiles, so a ``${X:?}`` that
    only a profile's service needs would stop a plain ``docker compose up``."""
    required = set(re.findall(r"\$\{([A-Z0-9_]+):?\?", COMPOSE.read_text()))
    default = " ".join(str(s) for s in compose["services"].values() if "profiles" not in s)
    assert required == {"LAYERBANK_API_KEY"}
    for name in required:
        assert "${" + name in default, name


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

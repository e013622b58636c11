"""The built wheel installs one top-level package, ``layerbank``, and nothing that
shadows a user's own ``app``, ``cache`` or ``workers``: built from a copy of the
source (so the shared work tree gets no build/ folder), installed with
``--no-deps`` into a FRESH venv (not the dev venv), and imported from another
directory."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import layerbank

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "layerbank", "app", "workers", "cache")


def _run(*cmd: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_the_wheel_in_a_fresh_venv_holds_only_layerbank(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, src / name)
    # the dev venv's setuptools builds it, called as pip calls it (no build isolation: no
    # download, same backend), so that its warnings can be read: none about package data
    built = _run(sys.executable, "-c", "import sys, setuptools.build_meta as b; b.build_wheel(sys.argv[1])",
                 tmp_path / "dist", cwd=src)
    assert built.returncode == 0, built.stderr
    for warned in ("Package would be ignored", "is absent from the `packages` configuration",
                   "SetuptoolsDeprecationWarning"):
        assert warned not in built.stderr, built.stderr
    wheel = next((tmp_path / "dist").glob("layerbank-*.whl"))
    assert wheel.name.startswith(f"layerbank-{layerbank.__version__}-")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        tops = {n.split("/")[0] for n in names}
    # the data files the API docs and the lab serve
    for data in ("app/api/docs_assets/VENDORED.md", "app/api/docs_assets/redoc/redoc.standalone.js",
                 "app/api/docs_assets/swagger-ui/swagger-ui-bundle.js", "app/api/lab/static/index.html"):
        assert f"layerbank/{data}" in names, data
    assert tops == {"layerbank", f"layerbank-{layerbank.__version__}.dist-info"}

    venv = tmp_path / "fresh"
    made = _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    py = venv / "bin" / "python"
    installed = _run(sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "-q", wheel,
                     cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr
    site = Path(_run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                     cwd=tmp_path).stdout.strip())
    assert sorted(p.name for p in site.iterdir() if p.name != "__pycache__") == [
        "layerbank", f"layerbank-{layerbank.__version__}.dist-info"]

    elsewhere = tmp_path / "elsewhere"  # not the repository: its folders must not be found by cwd
    elsewhere.mkdir()
    for name in ("app", "cache", "workers"):
        r = _run(py, "-c", f"import {name}", cwd=elsewhere)
        assert r.returncode == 1 and f"No module named '{name}'" in r.stderr, (name, r.stderr)
    r = _run(py, "-c", "import layerbank; print(layerbank.__version__, layerbank.__file__)", cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    version, where = r.stdout.split()
    assert version == layerbank.__version__ and Path(where).is_relative_to(site)
    # the packages are there under the namespace (the app's own modules, not just the top)
    r = _run(py, "-c", "import importlib.util as u; print(all(u.find_spec(m) for m in "
             "('layerbank.app.client', 'layerbank.app.api.routes', 'layerbank.cache.shard', "
             "'layerbank.workers.regimes')))", cwd=elsewhere)
    assert r.stdout.strip() == "True", r.stderr

"""The one ``layerbank`` namespace, as the dev install sees it: pyproject's package
list covers every package folder, ``import layerbank`` stays cheap, and
``layerbank --version`` answers. (The wheel in a fresh venv: tests/integration/test_wheel.py.)
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import layerbank

ROOT = Path(__file__).resolve().parents[2]


def _pyproject() -> dict:  # type: ignore[type-arg]
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_package_list_names_every_folder_with_an_init_under_its_mapped_name() -> None:
    setuptools = _pyproject()["tool"]["setuptools"]
    mapping: dict[str, str] = setuptools["package-dir"]
    found = set()
    for package, folder in mapping.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            if "__pycache__" in rel.parts:
                continue
            found.add(".".join((package, *rel.parts)))
    # folders of data files inside a package (no __init__.py) are listed too, as setuptools
    # wants ("Package would be ignored" otherwise); a name with a dash is no package name,
    # its files belong to the folder above
    data = set()
    for package in list(found):
        folder = ROOT / mapping[package] if package in mapping else None
        if folder is None:
            top = next(p for p in mapping if package.startswith(p + "."))
            folder = ROOT / mapping[top] / package[len(top) + 1:].replace(".", "/")
        for sub in folder.rglob("*"):
            rel = sub.relative_to(folder)
            if (sub.is_dir() and not (sub / "__init__.py").exists() and "__pycache__" not in rel.parts
                    and all(part.isidentifier() for part in rel.parts)):
                data.add(".".join((package, *rel.parts)))
    assert data == {"layerbank.app.api.docs_assets", "layerbank.app.api.docs_assets.redoc",
                    "layerbank.app.api.lab.static"}
    assert sorted(setuptools["packages"]) == sorted(found | data)
    # each data folder says which of its files the wheel carries
    assert data <= set(setuptools["package-data"])
    # one namespace: every installed package is layerbank or below it
    assert all(p == "layerbank" or p.startswith("layerbank.") for p in setuptools["packages"])


def test_import_layerbank_and_its_client_load_no_torch_transformers_sklearn_or_tables() -> None:
    code = ("import sys, layerbank\n"
            "layerbank.Client, layerbank.ApiError\n"
            "heavy = ['torch', 'transformers', 'sklearn', 'pandas', 'pyarrow', 'datasets']\n"
            "print(sorted(m for m in heavy if m in sys.modules))\n"
            "print('httpx' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split("\n")
    assert out[0] == "[]"
    assert out[1] == "True"  # the client itself did load (the lazy attribute worked)


def test_layerbank_version_prints_the_package_version() -> None:
    r = subprocess.run([sys.executable, "-m", "layerbank.app.cli.main", "--version"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"layerbank {layerbank.__version__}\n"
    assert layerbank.__version__ == "0.2.0"

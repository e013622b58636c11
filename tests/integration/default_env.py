"""What README's first command installs, as a ``sys.path`` a child Python can run in.

README's first command (scripts/install.sh) installs layerbank with its default
``dependencies`` and nothing else; the test venv adds the extras (pandas came
from ``test`` for a long time, so README's DataFrame example passed here and
failed for a newcomer). Building that venv in the test costs ~2 minutes of
pip per session (README's own figure); instead this module mirrors it from the
installed venv:

1. the closure of pyproject.toml's ``[project].dependencies`` (read from the
   file, the source of truth, not from the installed metadata, which is as
   old as the last ``pip install -e .``), walked through the installed
   distributions' ``Requires-Dist`` with the extras each requirement names
   and environment markers evaluated; plus pip and setuptools, which ``python
   -m venv`` puts in every venv, and layerbank itself;
2. a directory of symlinks to exactly those distributions' files (from their
   RECORD): a whole top-level folder when every distribution owning it is in
   the closure, file by file when one outside it shares the folder;
3. ``python -S -P`` with ``site.addsitedir(that directory)``: no site-packages
   of the venv, no working directory, but the closure's ``.pth`` files (the
   editable install's finder among them) processed, so an import of anything
   outside the closure fails exactly as in a fresh install
   (``ModuleNotFoundError``), and ``importlib.metadata`` sees only the closure.

What it cannot catch: a dependency whose files a closure member's RECORD
claims although another distribution installed them.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import sys
import sysconfig
import tomllib
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
ALWAYS = ("pip", "setuptools", "layerbank")  # what `python -m venv` seeds, and the package itself


def _site() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _installed() -> dict[str, md.Distribution]:
    return {canonicalize_name(d.metadata["Name"]): d for d in md.distributions(path=[str(_site())])}


def default_requirements() -> list[str]:
    """pyproject.toml's ``[project].dependencies``: what README's first command installs."""
    with open(ROOT / "pyproject.toml", "rb") as fh:
        return list(tomllib.load(fh)["project"]["dependencies"])


def closure(roots: Iterable[str], installed: dict[str, md.Distribution]) -> set[str]:
    """Canonical names of the distributions ``roots`` need, transitively (AssertionError
    naming one that is not installed)."""
    seen: set[tuple[str, str]] = set()
    todo = [(Requirement(r), "") for r in roots]
    names: set[str] = set()
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        dist = installed.get(name)
        assert dist is not None, f"{req} is required but not installed in {_site()}"
        names.add(name)
        for want in ("", *sorted(req.extras)):
            if (name, want) in seen:
                continue
            seen.add((name, want))
            todo += [(Requirement(r), want) for r in dist.requires or []]
    return names


def build_site(target: Path) -> Path:
    """A directory holding (as symlinks) only the default install's distributions."""
    installed = _installed()
    allowed = closure(default_requirements(), installed) | {n for n in ALWAYS if n in installed}
    site = _site()
    owners: dict[str, set[str]] = {}  # top-level entry of site-packages -> distributions with files in it
    files: dict[str, list[Path]] = {}
    for name, dist in installed.items():
        for f in dist.files or []:
            parts = Path(f).parts
            if not parts or parts[0] == "..":  # scripts in bin/: not on sys.path
                continue
            owners.setdefault(parts[0], set()).add(name)
            if name in allowed:
                files.setdefault(parts[0], []).append(Path(f))
    target.mkdir(parents=True, exist_ok=True)
    for top, paths in files.items():
        if not (site / top).exists():
            continue
        if owners[top] <= allowed:
            os.symlink(site / top, target / top)
            continue
        for rel in paths:  # a folder shared with a distribution outside the closure
            if (site / rel).is_file():
                (target / rel).parent.mkdir(parents=True, exist_ok=True)
                if not (target / rel).exists():
                    os.symlink(site / rel, target / rel)
    return target


def python_command(site_dir: Path, code: str) -> list[str]:
    """``python -S -P -c`` running ``code`` with only ``site_dir``'s distributions importable."""
    boot = f"import site, sys; site.addsitedir({str(site_dir)!r})\n"
    return [sys.executable, "-S", "-P", "-c", boot + code]

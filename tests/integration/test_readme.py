"""Every ```python block of README.md runs, as written, against a real server,
in the environment README's first command builds.

Each block runs on its own, in a child Python (a fresh namespace: it must
define every name it uses), from the repository root (README's paths are
relative to it), with the one address README uses, ``http://127.0.0.1:8000``,
replaced by the session server's. The other blocks (bash) are not run here.

The child sees only what README's first command installs: pyproject.toml's
default ``dependencies`` and their closure, not the test extras this venv
also holds (tests/integration/default_env.py mirrors that install with
symlinks in a second instead of running pip for ~2 minutes, and says how).
So a block importing a package that only an extra brings fails here with the
``ModuleNotFoundError`` a newcomer would see (README's DataFrame example did,
for pandas). The server is the session's, run from the full test venv.

A block that cannot run against a server (the in-process ``layerbank.Bank``
path) is run by another test instead, named by the marker on the line right
before its fence (invisible on the rendered page)::

    <!-- readme-test: skip REASON naming tests/.../test_x.py -->

Such a block is not collected here (no skip counted), and
``test_marked_blocks_name_the_test_that_runs_them`` checks that the named
test file exists and reads README's blocks.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.integration.conftest import ServerProcess
from tests.integration.default_env import build_site, python_command

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_URL = "http://127.0.0.1:8000"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
_SKIP = re.compile(r"<!--\s*readme-test:\s*skip\b\s*(.*?)\s*-->\s*$")


def python_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """(line of the fence, code, skip reason or None) for each ```python block."""
    blocks = []
    for m in _BLOCK.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = _SKIP.search(before)
        blocks.append((line, m.group(1), (skip.group(1) or "marked") if skip else None))
    return blocks


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def test_the_block_finder_reads_fences_and_markers() -> None:
    text = "x\n```python\na = 1\n```\n<!-- readme-test: skip needs Bank -->\n```python\nb\n```\n```bash\nc\n```\n"
    assert python_blocks(text) == [(2, "a = 1\n", None), (6, "b\n", "needs Bank")]
    assert sum(reason is None for _, _, reason in BLOCKS) >= 2  # README's client examples are here


SERVED = [b for b in BLOCKS if b[2] is None]


def test_marked_blocks_name_the_test_that_runs_them() -> None:
    for line, _, reason in BLOCKS:
        if reason is None:
            continue
        named = re.search(r"tests/\S+\.py", reason)
        assert named, f"README.md:{line}: the marker must name the test that runs the block"
        runner = ROOT / named.group(0)
        assert runner.is_file(), f"README.md:{line}: {runner} does not exist"
        assert "README" in runner.read_text(encoding="utf-8"), f"{runner} does not read README.md"


@pytest.fixture(scope="module")
def default_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """site-packages as README's first command fills it (tests/integration/default_env.py)."""
    return build_site(tmp_path_factory.mktemp("default-install") / "site-packages")


def _run(site: Path, code: str, name: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing beside the install
    child = f"exec(compile({code!r}, {name!r}, 'exec'), {{'__name__': '__readme__'}})"
    return subprocess.run(python_command(site, child), cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def test_the_default_install_lacks_the_test_extras(default_site: Path) -> None:
    # the children below would pass in the test venv itself: this is what makes them differ
    probe = ("import importlib\n"
             "for name in ('pytest', 'datasets', 'playwright', 'pandas', 'pyarrow', 'layerbank'):\n"
             "    try:\n        importlib.import_module(name); print(name, 'ok')\n"
             "    except ModuleNotFoundError as e: print(name, e)\n")
    r = _run(default_site, probe, "probe")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"{n} No module named '{n}'" for n in ("pytest", "datasets", "playwright")] \
        + ["pandas ok", "pyarrow ok", "layerbank ok"]


@pytest.mark.parametrize(("line", "code", "skip"), SERVED, ids=[f"README.md:{b[0]}" for b in SERVED])
def test_readme_python_block_runs(line: int, code: str, skip: str | None,
                                  layerbank_server: ServerProcess, default_site: Path) -> None:
    r = _run(default_site, code.replace(README_URL, layerbank_server.url), f"README.md:{line}")
    assert r.returncode == 0, f"README.md:{line} failed in the default install:\n{r.stderr[-4000:]}"

"""Every ```python block of README.md runs, as written, against a real server.

Each block runs on its own (a fresh namespace: it must define every name it
uses), from the repository root (README's paths, like ``../shared/data``, are
relative to it), with the one address README uses, ``http://127.0.0.1:8000``,
replaced by the session server's. The other blocks (bash) are not run here.

A block that cannot run against a server (the in-process ``layerbank.Bank``
path) is run by another test instead, named by the marker on the line right
before its fence (invisible on the rendered page)::

    <!-- readme-test: skip REASON naming tests/.../test_x.py -->

Such a block is not collected here (no skip counted), and
``test_marked_blocks_name_the_test_that_runs_them`` checks that the named
test file exists and reads README's blocks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.conftest import ServerProcess

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


@pytest.mark.parametrize(("line", "code", "skip"), SERVED, ids=[f"README.md:{b[0]}" for b in SERVED])
def test_readme_python_block_runs(line: int, code: str, skip: str | None,
                                  layerbank_server: ServerProcess,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    source = code.replace(README_URL, layerbank_server.url)
    exec(compile(source, f"README.md:{line}", "exec"), {"__name__": "__readme__"})

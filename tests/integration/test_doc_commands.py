"""Every shell block in README.md and docs/*.md runs, as written, against a real
``layerbank serve``: a documented command cannot drift from the server again
(the cross-site rule once refused every documented ``curl -F`` upload).

The convention:

- A shell block is a fenced block tagged ``bash`` (or ``sh``/``shell``). A block of
  commands must be tagged so: an untagged block whose first line is a command
  fails :func:`test_every_block_of_commands_is_tagged`.
- A block that must not run here carries the line
  ``<!-- doc-test: skip (why) -->`` right above its fence (Markdown shows
  nothing). The skipped blocks are listed in ``SKIPPED`` below, by file and first
  line, and :func:`test_the_skipped_blocks_are_these` asserts the list: adding a
  skip means adding it there too, with its reason.
- The blocks of one file run in one ``bash`` session, in order (a later block may
  use a variable an earlier one set, as a reader following the page would), with
  ``set -euo pipefail`` and ``curl`` as ``curl --fail-with-body --show-error``, so
  an HTTP error fails the block. The only rewrite is the base URL
  (``http://127.0.0.1:8000``, ``localhost:8000`` -> the test server's URL).
- They run from a scratch directory holding links to the repository's
  ``.venv``, ``examples`` and ``tests`` (the files the docs upload ship there),
  with ``.venv/bin`` first on PATH (``layerbank`` and ``.venv/bin/layerbank``
  alike); command-line runs keep their ``./layerbank-data`` there. The server is
  this module's own (the docs create datasets, probes and heads).

Only in the SQLite pass: the docs' commands do not depend on the catalog backend,
and they take minutes (5 min 33 s on the 2-core machine at load 9-10: the probes
and token probes of README.md and docs/probes.md, over HTTP and on the command
line, are most of it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from .conftest import ROOT, ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.sqlite_only, pytest.mark.timeout(900)]

DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell"}
SKIP = re.compile(r"<!-- doc-test: skip \((.+)\) -->\s*$")
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
# the first line of a block that is a command (and so must be tagged bash)
_COMMAND = re.compile(r"^(curl |layerbank |\.venv/|export |docker |pip |bash |python3? |[A-Z_]+=\S* )")

# file -> first line of each block that does not run here (with the reason the marker gives)
SKIPPED = {
    ("README.md", "# 1. install, and run the main job on the embedded default model (all-MiniLM-L6-v2)"):
        "the install and test commands themselves",
    ("README.md", ".venv/bin/layerbank serve                    # API on 127.0.0.1:8000 + its extraction worker"):
        "the test's server is this command",
    ("README.md", (".venv/bin/layerbank regimes examples/sst2_sample.tsv --text-column sentence "
                   "--label-column label --seeds 3")): "fine-tunes for 10-30 minutes",
    ("docs/api.md", "layerbank serve                                  # 127.0.0.1:8000, data in ./layerbank-data"):
        "the test's server is this command",
    ("docs/operations.md", ("layerbank extract texts.tsv --backend ray --ray-address local      "
                            "# a private local Ray")): "needs a Ray cluster",
    ("docs/operations.md", ("layerbank serve --model embedded --model /models/my-bert      "
                            "# or LAYERBANK_MODELS=embedded,/models/my-bert")): "needs a second model on disk",
    ("docs/operations.md", "pip install 'layerbank[postgres]'                     # psycopg 3 and its pool"):
        "needs a PostgreSQL server and shared storage",
    ("docs/operations.md", "export LAYERBANK_API_KEY=$(openssl rand -hex 16)"): "needs Docker",
    ("docs/regimes.md", "layerbank regimes train.tsv --text-column sentence --label-column label \\"):
        "fine-tunes for 10-30 minutes",
    ("docs/reliability.md", ("MUTATION_KEEP=/tmp/m bench/mutation.sh cache/store.py        "
                             "# keep the copy and the results")): "a mutation run takes hours",
    ("docs/reliability.md", ".venv/bin/python bench/load.py                 # bundled all-MiniLM-L6-v2, 60 s"):
        "a 60 s load benchmark",
}


def _blocks(doc: str) -> list[tuple[str, str, int, str | None]]:
    """(language, body, line, skip reason) of every fenced block in ``doc``."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    out = []
    for m in _FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.match(before.strip())
        out.append((m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1, skip.group(1) if skip else None))
    return out


def _first_line(body: str) -> str:
    return next(line for line in body.splitlines() if line.strip())


def _shell_blocks(doc: str) -> list[tuple[str, int, str | None]]:
    return [(body, line, skip) for lang, body, line, skip in _blocks(doc) if lang in SHELL]


RUN = [doc for doc in DOCS if any(skip is None for _, _, skip in _shell_blocks(doc))]


def test_the_skipped_blocks_are_these() -> None:
    found = {(doc, _first_line(body)): skip for doc in DOCS for body, _, skip in _shell_blocks(doc) if skip}
    assert found == SKIPPED
    # and what runs is most of it
    runs = sum(1 for doc in DOCS for _, _, skip in _shell_blocks(doc) if skip is None)
    assert runs >= 8, runs


def test_every_block_of_commands_is_tagged() -> None:
    untagged = [f"{doc}:{line}: {_first_line(body)}" for doc in DOCS for lang, body, line, _ in _blocks(doc)
                if not lang and body.strip() and _COMMAND.match(_first_line(body))]
    assert untagged == [], "tag these ```bash (and mark them if they must not run):\n" + "\n".join(untagged)


@pytest.fixture(scope="module")
def doc_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # default limits (the docs upload files over the shared server's small body limit)
    server = ServerProcess(tmp_path_factory.mktemp("doc-server") / "data")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("doc-commands")
    for name in (".venv", "examples", "tests"):
        (work / name).symlink_to(ROOT / name)
    return work


def _rewrite(body: str, url: str) -> str:
    for base in ("http://127.0.0.1:8000", "http://localhost:8000", "127.0.0.1:8000", "localhost:8000"):
        body = body.replace(base, url)
    return body


def _script(doc: str, url: str) -> str:
    parts = ["set -euo pipefail",
             "curl() { command curl --fail-with-body --show-error \"$@\"; }"]
    for body, line, skip in _shell_blocks(doc):
        if skip is None:
            parts += [f"echo '### {doc}:{line}' >&2", _rewrite(body, url)]
    return "\n".join(parts) + "\n"


@pytest.mark.parametrize("doc", RUN)
def test_the_documented_commands_run(doc: str, doc_server: ServerProcess, workdir: Path) -> None:
    assert shutil.which("curl"), "these tests need curl (scripts/test.sh installs it with apt)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYERBANK_")}
    env.update(PATH=f"{ROOT / '.venv' / 'bin'}:{env.get('PATH', '')}", LAYERBANK_THREADS="1",
               LAYERBANK_ENGINE="torch")
    r = subprocess.run(["bash", "-c", _script(doc, doc_server.url)], cwd=workdir, env=env,
                       capture_output=True, text=True, timeout=800, check=False)
    last = [line for line in r.stderr.splitlines() if line.startswith("### ")][-1:]
    assert r.returncode == 0, (f"{last} exited {r.returncode}\nstdout:\n{r.stdout[-3000:]}\n"
                               f"stderr:\n{r.stderr[-3000:]}")
    # what the commands say they make, made
    if doc == "README.md":
        assert np.load(workdir / "X.npy").shape == (300, 384)
        assert (workdir / "all.parquet").stat().st_size > 0
        assert any((workdir / "plots").glob("*.png"))
    if doc == "docs/probes.md":
        for png in ("probe.png", "curve.png"):
            assert (workdir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
        assert (workdir / "result.json").stat().st_size > 0

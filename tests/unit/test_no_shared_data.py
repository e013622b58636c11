"""No test reads ``../shared``: a user's clone has nothing beside it (issue 23).

The development machines keep the full data sets in ``../shared/data``; a
test that reads them passes there and fails (or errors at collection) on
every clone. Tests read tests/data/ (tests/data_paths.py) instead. This check
reads every Python file under tests/ as source (AST), so words such as
"shared server" or ``Bank.shared()`` and prose in docstrings and comments are
not flagged, nor is a folder of that name a test makes (``tmp_path /
"shared"``); what is flagged is a path that climbs out of the repository to it:

- ``"shared"`` joined (``/``, ``os.path.join``, ``joinpath``) onto a path that
  climbs: a ``.parent``, a ``.parents[i]`` or a ``".."`` before it
  (``ROOT.parent / "shared" / "data"``, ``os.path.join(root, "..", "shared")``);
- a string, other than a docstring, holding such a path
  (``"../shared/data/sst2/dev.tsv"``, ``"/work/shared/data"``).

tests/data/cut.py is the one exception: it cuts tests/data from the full
sets, is run by hand, and no test imports it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
EXEMPT = {TESTS / "data" / "cut.py"}
FOLDER = "shared"
_INTO_SHARED = re.compile(rf"(\.\./|/work/){FOLDER}/\S")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _climbs(node: ast.AST) -> bool:
    """Whether the expression goes up a folder: ``.parent``, ``.parents[i]`` or ``".."``."""
    return any((isinstance(n, ast.Attribute) and n.attr in ("parent", "parents"))
               or (isinstance(n, ast.Constant) and isinstance(n.value, str)
                   and (n.value == ".." or n.value.startswith("../") or n.value.endswith("/..")))
               for n in ast.walk(node))


def shared_paths(source: str) -> list[int]:
    """Line numbers where ``source`` builds a path to ``../shared``."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    hits: set[int] = set()

    def is_shared(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and node.value == FOLDER

    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            if is_shared(node.right) and _climbs(node.left):
                hits.add(node.right.lineno)
        elif isinstance(node, ast.Call):
            for i, a in enumerate(node.args):  # os.path.join(root, "..", "shared"), p.parent.joinpath("shared")
                if is_shared(a) and (_climbs(node.func) or any(_climbs(b) for b in node.args[:i])):
                    hits.add(a.lineno)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
              and _INTO_SHARED.search(node.value)):
            hits.add(node.lineno)
    return sorted(hits)


def test_the_detector_flags_paths_to_shared_and_nothing_else() -> None:
    flagged = [
        'DATA = ROOT.parent / "shared" / "data"',
        'p = Path(__file__).resolve().parents[3] / "shared" / "data" / "sst2" / "dev.tsv"',
        'p = os.path.join(ROOT, "..", "shared", "data")',
        'p = ROOT.parent.joinpath("shared", "data")',
        'p = ROOT / ".." / "shared" / "data"',
        'open("../@/data/sst2/test.tsv")',
        'SST2 = Path("/work/@/data/sst2")',
        'x = f"{ROOT}/../@/data/{name}"',
    ]
    # "@" stands for the folder's name, so that this file holds no path to it itself
    for code in (c.replace("@", FOLDER) for c in flagged):
        assert shared_paths(code) == [1], code
    fine = [
        '"""Reads ../@/data? No: tests/data/ (the docstring may say so)."""',
        'def f():\n    """One server shared by the tests; README\'s paths like ../@/data."""',
        'bank = Bank.shared(tmp_path / "data")  # the shared server',
        'texts = [f"t{i}", "shared"]; b.encode([*texts, "shared"])',
        'assert "../shared" not in command',
        'assert not (tmp_path / "shared-server").exists()',
        'd = tmp_path / "shared"; (d / "shards").mkdir(parents=True)',
        'p = os.path.join(tmp, "shared"); q = Path("shared")',
        'x = f"{tmp_path}/@/shards"',
        'DATA = ROOT / "tests" / "data"',
    ]
    for code in (c.replace("@", FOLDER) for c in fine):
        assert shared_paths(code) == [], code


def test_no_test_builds_a_path_to_shared() -> None:
    files = sorted(p for p in TESTS.rglob("*.py") if p not in EXEMPT)
    assert len(files) > 100 and Path(__file__).resolve() in files  # the walk found the suite
    found = {str(p.relative_to(TESTS.parent)): lines for p in files
             if (lines := shared_paths(p.read_text(encoding="utf-8")))}
    assert found == {}, f"tests read ../shared (use tests/data_paths.py, tests/data/): {found}"

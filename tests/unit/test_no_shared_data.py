"""No test reads ``../shared``: a user's clone has nothing beside it (issue 23).

The development machines keep the full data sets in ``../shared/data``; a
test that reads them passes there and fails (or errors at collection) on
every clone. Tests read tests/data/ (tests/data_paths.py) instead. This check
reads every Python file under tests/ as source (AST), so words such as
"shared server" or ``Bank.shared()`` and prose in docstrings and comments are
not flagged; what is flagged is a path built to the folder:

- ``"shared"`` as an operand of ``/`` (``ROOT.parent / "shared" / "data"``)
  or as an argument of a call (``os.path.join(root, "..", "shared")``,
  ``Path("shared")``);
- a string, other than a docstring, holding a path into it
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
_INTO_SHARED = re.compile(rf"(^|/){FOLDER}/\S")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def shared_paths(source: str) -> list[int]:
    """Line numbers where ``source`` builds a path to ``../shared``."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    hits: set[int] = set()

    def is_shared(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and node.value == FOLDER

    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            hits.update(n.lineno for n in (node.left, node.right) if is_shared(n))
        elif isinstance(node, ast.Call):
            hits.update(a.lineno for a in node.args if is_shared(a))
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

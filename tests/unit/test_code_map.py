"""README's code map is the one scripts/code_map.py draws from the tree today.

The map lists every module with its docstring's first sentence and the
package-level import arrows, read with ``ast`` (no module is imported, so
this takes well under a second). A moved, added or removed module, or a new
import between packages, fails here until ``scripts/code_map.py --write``
redraws README's block.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _code_map() -> ModuleType:
    spec = importlib.util.spec_from_file_location("code_map", ROOT / "scripts" / "code_map.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_code_map_is_the_generated_one() -> None:
    cm = _code_map()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert cm.readme_block(readme) == cm.block(), (
        "README's code map is out of date: run .venv/bin/python scripts/code_map.py --write")


def test_the_map_names_every_module_and_the_arrows_the_code_has() -> None:
    cm = _code_map()
    text = cm.block()
    every = [p.relative_to(ROOT).as_posix() for top in ("app", "cache", "workers", "layerbank")
             for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts]
    assert every and all(f"| `{p}` |" in text for p in every), [p for p in every if f"| `{p}` |" not in text]
    # workers/encoder.py imports layerbank.cache (keys, shard): that arrow is drawn;
    # cache imports nothing of workers (tests/unit/test_import_rules.py), so none is
    arrows = {line.split(" -> ")[0]: line.split(" -> ")[1] for line in text.splitlines() if " -> " in line}
    assert "`cache`" in arrows["- `workers`"]
    assert "workers" not in arrows["- `cache`"]

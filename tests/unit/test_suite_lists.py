"""The suite's module lists in tests/conftest.py name modules that exist: a renamed test
module would otherwise fall out of its list silently (and run on both backends again, or,
for a catalog_free module, lose the guard that proves it opens no catalog)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import CATALOG_FREE_MODULES, ONE_BACKEND_MODULES

TESTS = Path(__file__).parents[1]


@pytest.mark.parametrize("module", sorted(CATALOG_FREE_MODULES | set(ONE_BACKEND_MODULES)))
def test_every_listed_test_module_exists(module: str) -> None:
    assert (TESTS / module).is_file(), f"tests/conftest.py lists {module}, which is not a test module"


def test_no_module_is_in_both_lists() -> None:
    assert not CATALOG_FREE_MODULES & set(ONE_BACKEND_MODULES)

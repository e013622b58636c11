"""The suite's module lists in tests/conftest.py and tests/parallel.py name modules that exist: a renamed test
module would otherwise fall out of its list silently (and run on both backends again, or,
for a catalog_free module, lose the guard that proves it opens no catalog)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import CATALOG_FREE_MODULES, ONE_BACKEND_MODULES
from tests.parallel import ONE_PROCESS_MODULES, unit_of

TESTS = Path(__file__).parents[1]


@pytest.mark.parametrize("module", sorted(CATALOG_FREE_MODULES | set(ONE_BACKEND_MODULES)
                                          | ONE_PROCESS_MODULES))
def test_every_listed_test_module_exists(module: str) -> None:
    assert (TESTS / module).is_file(), f"tests/conftest.py or tests/parallel.py lists {module}, which is not a test module"


def test_no_module_is_in_both_lists() -> None:
    assert not CATALOG_FREE_MODULES & set(ONE_BACKEND_MODULES)


def test_a_module_is_one_unit_of_work_per_backend_and_the_ray_modules_share_one() -> None:
    # the lab's tests build on each other (upload, probe, save a head): one process, in order
    assert unit_of("tests/integration/test_lab.py::test_upload[sqlite]") == "sqlite:integration/test_lab.py"
    assert unit_of("tests/integration/test_lab.py::test_save_a_head[sqlite]") == "sqlite:integration/test_lab.py"
    assert unit_of("tests/integration/test_lab.py::test_upload[postgres]") == "postgres:integration/test_lab.py"
    # the backend is the first id, whatever the later ones say
    assert unit_of("tests/unit/test_urls.py::test_scheme[postgres-sqlite]") == "postgres:unit/test_urls.py"
    assert unit_of("tests/unit/test_plain.py::test_x") == "any:unit/test_plain.py"
    # two Ray clusters never start at once
    assert unit_of("tests/integration/test_doc_commands.py::test_the_documented_commands_run"
                   "[sqlite-docs/operations.md]") == "ray"
    assert unit_of("tests/integration/test_ray_cluster.py::test_two_nodes[postgres]") == "ray"

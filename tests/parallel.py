"""How README's test command splits the suite over two processes (pytest-xdist).

A work unit is one test module on one catalog backend: a module's tests run in
order in one process, so its wider-scoped servers start once per pass and the
modules whose tests build on each other (the lab's pages: upload, then probe,
then save a head) keep their order. The modules that start Ray share one unit:
two Ray clusters on a 2-core machine race for the ports they pick and share
/tmp/ray.

pytest-xdist's own ``--dist loadgroup`` cannot do this under pytest 9.2: it
renames each item's ``_nodeid``, which pytest no longer reads, so every test
became a unit of its own and the lab's tests ran in two processes. The
scheduler here groups by the node id itself (``_split_scope``), which both
versions keep.

Example::

    unit_of("tests/integration/test_lab.py::test_upload[postgres]")
    # -> "postgres:integration/test_lab.py"
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["ONE_PROCESS_MODULES", "unit_of", "make_scheduler"]

# modules that start a Ray cluster (a local one per test or per module)
ONE_PROCESS_MODULES = {
    "integration/test_doc_commands.py",  # docs/operations.md runs `--backend ray --ray-address local`
    "integration/test_ray_backend.py",
    "integration/test_ray_cluster.py",
    "integration/test_ray_server.py",
}

# the catalog_backend parameter is session-scoped and autouse, so its id comes first
_BACKEND = re.compile(r"\[(sqlite|postgres)[-\]]")


def unit_of(nodeid: str) -> str:
    """The work unit a test belongs to: its backend and module, or "ray"."""
    module = nodeid.split("::", 1)[0].removeprefix("tests/")
    if module in ONE_PROCESS_MODULES:
        return "ray"
    found = _BACKEND.search(nodeid)
    return f"{found.group(1) if found else 'any'}:{module}"


def make_scheduler(config: Any, log: Any) -> Any:
    """A load-scope scheduler whose scopes are ``unit_of``'s units (largest first, as
    pytest-xdist orders scopes by default)."""
    from xdist.scheduler import LoadScopeScheduling  # only when the suite runs under xdist

    class ByUnit(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return ByUnit(config, log)

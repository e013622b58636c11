"""The import graph of every layerbank module, read from the source (AST), not by importing.

Two properties a newcomer relies on when they read the folder names:

- no import cycles between layerbank modules: every import counts, also those
  inside functions and under ``if TYPE_CHECKING:`` (a cycle hidden behind a
  lazy import is still two modules that cannot be understood one at a time);
- the rules each package's ``__init__`` states: ``cache`` imports nothing of
  ``layerbank.app`` or ``layerbank.workers``; ``workers`` never imports
  ``layerbank.app``; ``app/api`` (the HTTP layer) never imports torch,
  transformers or ``layerbank.workers``; ``app/probes`` (the probe engine) imports nothing
  of ``app/api``;
- shards are reached only through the storage interface (cache/storage.py): nothing
  outside the shard format and the storage modules imports h5py, names the shard or
  quarantine directory, or lists it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# pyproject.toml's package-dir: folder -> package (tests/unit/test_packaging.py checks that list)
FOLDERS = {"layerbank": "layerbank", "app": "layerbank.app", "workers": "layerbank.workers",
           "cache": "layerbank.cache"}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[str]:
    """Every module ``name`` imports (absolute names; relative imports resolved)."""
    is_package = path.name == "__init__.py"
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:  # `from pkg import module` imports pkg.module
                sub = f"{target}.{a.name}"
                found.append(sub if sub in MODULES else target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _internal(target: str) -> str | None:
    """The layerbank module ``target`` names (a package's submodule import counts as it)."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def _cycles() -> list[list[str]]:
    edges = {m: sorted({t for t in map(_internal, GRAPH[m]) if t and t != m and not m.startswith(t + ".")})
             for m in MODULES}
    # a package's __init__ is imported by its submodules implicitly; only explicit edges count
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        seen[m] = 1
        for t in edges[m]:
            if seen.get(t) == 1:
                cycles.append(path[path.index(t):] + [t])
            elif t not in seen:
                visit(t, [*path, t])
        seen[m] = 2

    for m in sorted(MODULES):
        if m not in seen:
            visit(m, [m])
    return cycles


def test_the_walk_sees_the_whole_tree() -> None:
    # guards the test itself: a broken walk would find no cycle and no violation
    assert len(MODULES) > 80
    assert "layerbank.workers.worker" in MODULES and "layerbank.app.api.errors" in MODULES
    assert "layerbank.workers.jobs_registry" in GRAPH["layerbank.workers.worker"]
    assert "layerbank.cache.runner" in GRAPH["layerbank.workers.worker"]


def test_no_import_cycles_between_layerbank_modules() -> None:
    cycles = _cycles()
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return [f"{m} imports {t}" for m in sorted(MODULES) if m == package or m.startswith(package + ".")
            for t in GRAPH[m] if any(t == f or t.startswith(f + ".") for f in forbidden)]


def test_cache_imports_nothing_of_app_or_workers() -> None:
    assert _violations("layerbank.cache", ("layerbank.app", "layerbank.workers")) == []


def test_workers_never_import_app() -> None:
    assert _violations("layerbank.workers", ("layerbank.app",)) == []


def test_the_http_layer_never_imports_torch_or_workers() -> None:
    assert _violations("layerbank.app.api", ("torch", "transformers", "peft", "layerbank.workers")) == []


def test_the_probe_engine_imports_nothing_of_the_http_layer() -> None:
    # app/probes is a library (science and rendering); the job plumbing that serves it over
    # HTTP is app/api/probe_jobs, so `layerbank probe` and Bank never load FastAPI through it
    assert "layerbank.app.api.probe_jobs.requests" in MODULES and "layerbank.app.probes.heads" in MODULES
    assert _violations("layerbank.app.probes", ("layerbank.app.api",)) == []


def test_only_the_command_line_and_the_in_process_bank_run_the_encoder() -> None:
    # app/ is everything above the store; the encoder side is reached only where a
    # user runs it in their own process: the CLI and layerbank.Bank (a notebook)
    allowed = ("layerbank.app.cli", "layerbank.app.bank")
    found = [v for v in _violations("layerbank.app", ("layerbank.workers",))
             if not any(v.startswith(a + " ") or v.startswith(a + ".") for a in allowed)]
    assert found == []


def _cli_commands() -> set[str]:
    """The subcommand modules ``app/cli/main.py`` lists in ``COMMANDS`` (read from its AST)."""
    tree = ast.parse(MODULES["layerbank.app.cli.main"].read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "COMMANDS" for t in node.targets):
            return {f"layerbank.app.cli.{n}" for n in ast.literal_eval(node.value)}
    raise AssertionError("app/cli/main.py has no COMMANDS list")


def test_no_command_imports_another_command() -> None:
    # what two commands share lives in app/cli/common.py (or another helper module there:
    # cost, store_first, worker_process); only main.py, which registers them, imports commands
    commands = _cli_commands()
    assert {"layerbank.app.cli.probe", "layerbank.app.cli.serve", "layerbank.app.cli.worker"} <= commands
    found = [f"{m} imports {t}" for m in sorted(MODULES)
             if m.startswith("layerbank.app.cli.") and m != "layerbank.app.cli.main"
             for t in map(_internal, GRAPH[m]) if t in commands and t != m]
    assert found == []



def test_no_route_imports_another_route() -> None:
    # what two routes share lives in app/api/route_helpers.py (issue 26: eight routes imported
    # from routes/features.py, probes and regimes from routes/jobs.py); main.py mounts them all
    routes = {m for m in MODULES if m.startswith("layerbank.app.api.routes.")}
    assert {"layerbank.app.api.routes.features", "layerbank.app.api.routes.jobs"} <= routes
    found = [f"{m} imports {t}" for m in sorted(routes)
             for t in map(_internal, GRAPH[m]) if t in routes and t != m]
    assert found == []

# modules that touch os.environ for something that is not a layerbank setting, and why;
# every setting is read by layerbank/settings.py alone (declared once, CLI flags generated from it)
ENVIRON_ALLOWED = {
    "layerbank.settings": "the settings module: it reads them",
    "layerbank.app.cli.common": "quiet_progress writes TQDM_DISABLE and HF_HUB_DISABLE_PROGRESS_BARS "
                                "(tqdm's and Hugging Face's switches, for this process and its children)",
    "layerbank.app.cli.serve": "writes LAYERBANK_CATALOG_URL for the probe processes the API spawns "
                               "(they read it back through layerbank.settings)",
    "layerbank.app.api.probe_jobs.service": "a probe process's initializer writes BLAS thread counts and "
                                            "its own memory limit before numpy loads",
    "layerbank.app.api.probe_jobs.jobs": "reads back the memory limit its own process's initializer "
                                         "wrote, to name it in a job's error (a note, not a setting)",
    "layerbank.workers": "sets OpenMP's and oneDNN's variables before torch loads (theirs, not settings)",
}


_ENVIRON_NAMES = ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv")


def _environ_uses(path: Path) -> list[int]:
    """Lines that touch the environment: ``os.environ``, ``os.getenv``/``putenv``/``unsetenv``,
    or those names imported from ``os``."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        attribute = (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                     and node.value.id == "os" and node.attr in _ENVIRON_NAMES)
        imported = (isinstance(node, ast.ImportFrom) and node.module == "os"
                    and any(a.name in _ENVIRON_NAMES for a in node.names))
        if attribute or imported:
            lines.append(node.lineno)
    return lines


def test_only_the_settings_module_reads_the_environment() -> None:
    found = {m: lines for m, path in MODULES.items() if (lines := _environ_uses(path))}
    assert "layerbank.settings" in found  # the scan sees the one reader
    assert sorted(set(found) - set(ENVIRON_ALLOWED)) == [], \
        {m: found[m] for m in set(found) - set(ENVIRON_ALLOWED)}
    # an allowance nothing needs any more goes too
    assert sorted(set(ENVIRON_ALLOWED) - set(found)) == []


# the shard format (HDF5), the storage interface and its backends (cache/storage_<name>.py, so a
# new backend needs no change here): the only modules that touch shard files
STORAGE_MODULES = ("layerbank.cache.shard", "layerbank.cache.storage")
STORAGE_BACKENDS = "layerbank.cache.storage_"
# modules outside them that open an HDF5 file of their own, and why it is not a shard
H5PY_ALLOWED = {
    "layerbank.app.feature_files": "writes the user's own --out features.h5 (a matrix and its texts), "
                                   "never a shard nor anything in the data directory",
}
# FeatureStore keeps the local storage's two directories as properties, for tests and tools
# that look at the files; the store itself reads and writes through its storage
SHARD_DIR_ALLOWED = {"layerbank.cache.store": "shard_dir and quarantine_dir properties (local storage only)"}
_LISTING = {"iterdir", "glob", "rglob", "listdir", "scandir", "walk"}
_SHARD_DIRS = {"shards", "quarantine"}


def _shard_directory_uses(path: Path) -> list[str]:
    """Where a module reaches the shard directory itself: ``x / "shards"`` (or "quarantine"),
    a path string starting ``shards/``, the ``shard_dir``/``quarantine_dir`` attributes, or a
    listing (iterdir, glob, listdir, ...) of anything whose expression names a shard."""
    source = path.read_text(encoding="utf-8")
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant)
                and node.right.value in _SHARD_DIRS):
            found.append(f"{node.lineno}: / {node.right.value!r}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                node.value.split("/", 1)[0] in _SHARD_DIRS and "/" in node.value:
            found.append(f"{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Attribute) and node.attr in ("shard_dir", "quarantine_dir"):
            found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in _LISTING and "shard" in (ast.get_source_segment(source, node) or "").lower():
                found.append(f"{node.lineno}: {name}()")
    return found


def _is_storage(m: str) -> bool:
    return m in STORAGE_MODULES or m.startswith(STORAGE_BACKENDS)


def test_only_the_storage_modules_open_hdf5_files() -> None:
    found = sorted({m for m in MODULES if not _is_storage(m) and "h5py" in GRAPH[m]})
    assert "h5py" in GRAPH["layerbank.cache.shard"]  # the scan sees the format's own import
    assert found == sorted(H5PY_ALLOWED)  # an allowance nothing needs any more goes too


def test_only_the_storage_modules_reach_the_shard_directory() -> None:
    found = {m: uses for m, path in MODULES.items() if not _is_storage(m) and (uses := _shard_directory_uses(path))}
    assert _shard_directory_uses(MODULES["layerbank.cache.storage_local"])  # the scan sees the backend's own
    assert sorted(set(found) - set(SHARD_DIR_ALLOWED)) == [], {m: found[m] for m in set(found) - set(SHARD_DIR_ALLOWED)}
    assert sorted(set(SHARD_DIR_ALLOWED) - set(found)) == []

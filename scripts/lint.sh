#!/usr/bin/env bash
# The static checks CI runs before the tests: ruff over the tree, mypy over the installed
# namespace (layerbank, layerbank.app, layerbank.cache, layerbank.workers).
#
# Why a symlink tree for mypy: pyproject.toml maps app/, cache/ and workers/ to
# layerbank.app, layerbank.cache and layerbank.workers, and the editable install reaches
# them through an import hook that mypy cannot follow. A throw-away tree with the same
# layout (layerbank/app -> ../../app, ...) gives mypy the installed module names.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
"$PY" -m ruff check .
tree="$(mktemp -d)"
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/layerbank"
for f in layerbank/*.py; do ln -s "$PWD/$f" "$tree/layerbank/"; done
for d in layerbank/*/; do [ -f "$d/__init__.py" ] && ln -s "$PWD/${d%/}" "$tree/layerbank/"; done  # layerbank/linear_probe/
for d in app cache workers; do ln -s "$PWD/$d" "$tree/layerbank/$d"; done
(cd "$tree" && "$OLDPWD/$PY" -m mypy --config-file "$OLDPWD/pyproject.toml" -p layerbank)

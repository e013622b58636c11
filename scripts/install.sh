#!/usr/bin/env bash
# Install layerbank into ./.venv, with the extras named in $1 (e.g. "test,ray").
# torch is installed first, pinned to the CPU build (2.13.0) this machine keeps
# on disk: an unpinned torch pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
if [ -n "${1:-}" ]; then
  .venv/bin/python -m pip install -q -e ".[$1]"
else
  .venv/bin/python -m pip install -q -e .
fi

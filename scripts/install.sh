#!/usr/bin/env bash
# Install layerbank into ./.venv, with the extras named in $1 (e.g. "test,ray").
# torch is installed first, pinned to the CPU build (2.13.0) this machine keeps
# on disk: an unpinned torch pulls a multi-GB CUDA build.
# pip runs quietly and its own warnings (an index location that is missing, a
# newer pip, ...) go to .venv/install.log: printed only when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
log=.venv/install.log
: > "$log"
pip_quiet() {
  if ! .venv/bin/python -m pip install -q --disable-pip-version-check "$@" 2>>"$log"; then
    echo "scripts/install.sh: pip install $* failed; its messages ($log):" >&2
    cat "$log" >&2
    exit 1
  fi
}
pip_quiet --upgrade pip
pip_quiet "torch==2.13.0"
if [ -n "${1:-}" ]; then
  pip_quiet -e ".[$1]"
else
  pip_quiet -e .
fi

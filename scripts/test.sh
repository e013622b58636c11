#!/usr/bin/env bash
# Install (with the test and ray extras) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh "test,ray"
exec .venv/bin/python -m pytest tests "$@"

#!/usr/bin/env bash
# Install (with the test and ray extras) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh "test,ray"
# the lab's browser tests drive Debian's Chromium (Playwright cannot download browsers here)
if [ ! -x /usr/bin/chromium ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
exec .venv/bin/python -m pytest tests "$@"

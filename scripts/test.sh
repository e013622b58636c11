#!/usr/bin/env bash
# Install (with the test, ray and postgres extras) and run the whole test suite, once
# on each catalog backend: SQLite, and a real PostgreSQL server the tests start.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh "test,ray,postgres"
# the lab's browser tests drive Debian's Chromium (Playwright cannot download browsers here);
# the documented shell commands run with curl (tests/integration/test_doc_commands.py)
missing=""
[ -x /usr/bin/chromium ] || missing="$missing chromium"
command -v curl >/dev/null || missing="$missing curl"
if [ -n "$missing" ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi
# the PostgreSQL catalog's tests start Debian's server themselves (tests/postgres_server.py)
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
export LAYERBANK_TEST_CATALOGS="${LAYERBANK_TEST_CATALOGS:-sqlite,postgres}"
# two processes (pytest-xdist): one alone used 0.8 of the 2 cores (CI's user+sys over its
# wall time); a test module on one backend is one unit of work (tests/parallel.py).
# LAYERBANK_TEST_WORKERS=0 runs the suite in this process, one test after another.
exec .venv/bin/python -m pytest tests -n "${LAYERBANK_TEST_WORKERS:-2}" "$@"

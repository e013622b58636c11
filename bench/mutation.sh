#!/usr/bin/env bash
# Mutation testing (mutmut 2) of the code that decides what is stored, quarantined, or
# answered with which status. Slow, so not CI: a habit, run by hand after changing
# these paths; record the survival rate and the surviving mutants judged harmless in
# docs/reliability.md ("Mutation testing").
#
#   bench/mutation.sh                              every target below (hours on 2 cores)
#   bench/mutation.sh cache/space.py               one module, with its tests
#   MUTATION_MAX_S=900 bench/mutation.sh ...       stop after 15 minutes (what ran is reported)
#   MUTATION_KEEP=/tmp/m bench/mutation.sh ...     keep the copy and each module's mutmut cache
#                                                  there (rerun one mutant: cd /tmp/m && mutmut run ID)
#   MUTATION_FROM=/tmp/m bench/mutation.sh ...     after adding tests: start from /tmp/m's results,
#                                                  so only the mutants not yet killed run again
#
# It never touches the working tree: the committed tree is copied to a temporary
# directory (git archive HEAD), `layerbank.*` is pointed at that copy (symlinks, and the
# editable install's finder dropped), and mutmut mutates the copy.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY="$ROOT/.venv/bin/python"
"$PY" -c "import mutmut" 2>/dev/null || "$ROOT/.venv/bin/pip" install -q "mutmut>=2.4,<3"
MUTMUT="$ROOT/.venv/bin/mutmut"

# module -> the fast tests that guard it (each mutant runs them, so keep them under ~10 s;
# test_read_tokens_many.py loads torch, 25 s: left out)
declare -A TESTS=(
  [cache/shard.py]="tests/unit/cache/test_shard.py tests/unit/cache/test_shard_bytes.py tests/unit/cache/test_shard_damage.py tests/unit/cache/test_space.py"
  [cache/store.py]="tests/unit/cache/test_store.py tests/unit/cache/test_store_layout.py tests/unit/cache/test_shard_damage.py tests/unit/cache/test_compact.py tests/unit/cache/test_postgres.py"
  [cache/space.py]="tests/unit/cache/test_space.py tests/unit/cache/test_space_errors.py tests/unit/cache/test_disk_full_type.py"
  [cache/repair.py]="tests/unit/cache/test_repair.py tests/unit/cache/test_postgres.py"
  [cache/compact.py]="tests/unit/cache/test_compact.py tests/unit/cache/test_compact_batches.py tests/reliability/test_disk_full.py::test_compaction_on_a_full_disk_changes_nothing_and_runs_once_there_is_room tests/reliability/test_disk_full.py::test_compaction_whose_catalog_cannot_grow_leaves_no_shard_and_runs_once_there_is_room"
  [cache/errors.py]="tests/unit/cache/test_errors.py tests/unit/cache/test_disk_full_type.py"
  [app/api/errors.py]="tests/unit/app/test_error_handlers.py"
  [cache/leftovers.py]="tests/unit/cache/test_leftovers_order.py tests/unit/cache/test_leftovers.py::test_a_starting_worker_removes_crash_leftovers_only tests/unit/cache/test_leftovers.py::test_files_newer_than_the_worker_are_left_alone"
  [cache/views.py]="tests/unit/cache/test_views.py"
  [app/api/origin.py]="tests/unit/app/test_origin_guard_asgi.py tests/unit/app/test_origin_guard.py::test_loopback_names tests/unit/app/test_origin_guard.py::test_the_listen_host_is_allowed_unless_it_is_a_wildcard"
  [app/api/catalog_health.py]="tests/unit/app/test_catalog_health.py"
  # derived files and model identity (issue 25): measured.py's tests are torch-free (1.5 s), and
  # so is test_model_pool_rules.py (0.7 s), run first for the pool; the others load tiny models
  # and export them (10-20 s a mutant)
  [workers/measured.py]="tests/unit/workers/test_measured.py"
  [workers/model_pool.py]="tests/unit/workers/test_model_pool_rules.py tests/unit/workers/test_model_pool.py tests/reliability/test_model_identity.py"
  [workers/engines/onnx.py]="tests/unit/workers/test_onnx_record.py tests/unit/workers/test_onnx_engine.py tests/reliability/test_derived_files.py"
  [workers/engines/choice.py]="tests/unit/workers/test_precision_calibration.py tests/unit/workers/test_engine_choice.py tests/reliability/test_derived_files.py"
  # saved heads, costing and the probe job service (issue 25 item 7): bare catalogs and pure
  # functions, no app (under 2 s each); the route tests build the app with a tiny model
  [app/api/probe_jobs/heads_store.py]="tests/unit/app/test_heads_store.py"
  [app/api/probe_jobs/memory_cost.py]="tests/unit/app/test_memory_cost.py"
  [app/api/probe_jobs/service.py]="tests/unit/app/test_probe_service.py"
)
# modules with PostgreSQL-only code (issue 19) run their tests on both catalog backends
# (tests/conftest.py: test_postgres.py runs in the PostgreSQL pass, test_repair.py in SQLite's)
declare -A CATALOGS=([cache/repair.py]="sqlite,postgres" [cache/store.py]="sqlite,postgres")
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(cache/space.py cache/leftovers.py cache/repair.py app/api/origin.py
                                     cache/shard.py cache/store.py cache/views.py app/api/catalog_health.py)
MAX_S=${MUTATION_MAX_S:-0}

if [ -n "${MUTATION_KEEP:-}" ]; then
  [ "${MUTATION_FROM:-}" != "$MUTATION_KEEP" ] || { echo "MUTATION_FROM must differ from MUTATION_KEEP" >&2; exit 2; }
  WORK=$MUTATION_KEEP; rm -rf "$WORK"; mkdir -p "$WORK"
else
  WORK=$(mktemp -d /tmp/lb-mutation.XXXXXX)
  trap 'rm -rf "$WORK"' EXIT  # replaced below, once mutmut may be running
fi
git -C "$ROOT" archive HEAD | tar -x -C "$WORK"
# layerbank/{app,cache,workers} -> the copy's folders, as pyproject's package-dir maps them
for pkg in app cache workers; do ln -s "../$pkg" "$WORK/layerbank/$pkg"; done
mkdir -p "$WORK/.shim"
# the editable install's finder would send `layerbank.*` back to $ROOT: drop it
cat > "$WORK/.shim/sitecustomize.py" <<'PY'
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
PY
export PYTHONPATH="$WORK/.shim:$WORK" LAYERBANK_THREADS=1
cd "$WORK"
"$PY" -c "import layerbank.cache.store as s, sys; assert s.__file__.startswith('$WORK'), s.__file__"

# mutmut 2 runs the mutants in one spawned worker process; when that process dies (killed
# by anything: the machine is shared) mutmut waits for it forever, with the file it was
# testing left mutated (mutmut's backup beside it). So: watch the worker, put the file back,
# and resume (mutmut skips what its cache has). An interrupted script puts it back too.
kill_tree() { local c; for c in $(pgrep -P "$1"); do kill_tree "$c"; done; kill "$1" 2>/dev/null || true; }
restore() { [ -f "$1.bak" ] && mv -f "$1.bak" "$1"; return 0; }
CURRENT=""
trap '[ -n "$CURRENT" ] && restore "$CURRENT"; [ -n "${MUTATION_KEEP:-}" ] || rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM
mutmut_resumable() {  # target runner deadline (epoch seconds, 0 = none)
  local target=$1 runner=$2 deadline=$3 m idle attempt
  CURRENT=$target
  for attempt in $(seq 1 20); do
    restore "$target"
    "$MUTMUT" run --paths-to-mutate "$target" --runner "$runner" --tests-dir tests --no-progress \
      </dev/null >/dev/null 2>&1 &
    m=$!; idle=0
    while kill -0 "$m" 2>/dev/null; do
      sleep 5
      if [ "$deadline" -gt 0 ] && [ "$(date +%s)" -ge "$deadline" ]; then
        kill_tree "$m"; wait "$m" 2>/dev/null || true; restore "$target"
        echo "time is up: $target stopped part-way"; return 0
      fi
      # a zombie runtests counts as gone (its parent stopped reaping: seen stuck for 15 minutes)
      # mutmut's timeout kills the runner's shell, not its pytest: a hung mutant's pytest was
      # left spinning under init (ppid 1) for minutes, taking a core from the next mutants
      pkill -P 1 -f "pytest -x -q -p no:cacheprovider -p no:randomly" 2>/dev/null || true
      kids=$(pgrep -d, -P "$m" || true)
      if [ -n "$kids" ] && pgrep -r R,S,D -P "$m" -f "spawn_main|runtests" >/dev/null \
         && ! pgrep -r Z -P "$kids" -f runtests >/dev/null; then idle=0; else idle=$((idle + 5)); fi
      if [ "$idle" -ge 30 ]; then
        echo "mutmut's worker process is gone (attempt $attempt, at mutant $(sqlite3 .mutmut-cache \
          "select min(id) from Mutant where status='untested'" 2>/dev/null)): resuming"
        kill_tree "$m"; break
      fi
    done
    wait "$m" 2>/dev/null || true
    [ "$idle" -lt 30 ] && break
  done
  restore "$target"; CURRENT=""
}

start=$(date +%s)
for target in "${TARGETS[@]}"; do
  tests=${TESTS[$target]:?no tests listed for $target}
  echo "== $target (tests: $tests)"
  saved="${MUTATION_FROM:-/nonexistent}/.mutmut-cache.${target//\//_}"
  if [ -f "$saved" ]; then
    cp "$saved" .mutmut-cache  # a kept run's results: mutmut retests all but the killed ones
  else
    rm -f .mutmut-cache
  fi
  # schemathesis and hypothesis load at every pytest start (8-15 s on the shared machine);
  # these tests need neither, and each mutant starts pytest afresh.
  # mutmut 2 counts any exit code but 1 as "tests pass": a mutant that breaks the import
  # (pytest exits 2, collection error) would be a false survivor, so every failure is 1
  cat > .shim/runtests <<SH
#!/bin/sh
LAYERBANK_TEST_CATALOGS=${CATALOGS[$target]:-sqlite} "$PY" -m pytest -x -q -p no:cacheprovider -p no:randomly -p no:schemathesis -p no:hypothesispytest -p no:anyio $tests || exit 1
SH
  chmod +x .shim/runtests
  deadline=0
  if [ "$MAX_S" -gt 0 ]; then
    deadline=$(( start + MAX_S ))
    [ "$(date +%s)" -ge "$deadline" ] && { echo "time is up: $target not run"; continue; }
  fi
  mutmut_resumable "$target" "$WORK/.shim/runtests" "$deadline"
  "$MUTMUT" results 2>/dev/null | sed -n '1,200p' || true
  [ -n "${MUTATION_KEEP:-}" ] && cp .mutmut-cache ".mutmut-cache.${target//\//_}"
  for id in $("$MUTMUT" result-ids survived 2>/dev/null || true); do
    echo "-- surviving mutant $id"
    "$MUTMUT" show "$id" 2>/dev/null | sed -n '1,20p'
  done
done

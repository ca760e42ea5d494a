#!/usr/bin/env bash
# The quick check of a change: the unit tests (tests/unit) in the base venv, leaving out the modules that
# spawn replica processes or many interpreters (listed below; scripts/test.sh runs them all), in a minute or two
# on 2 cores once the base venv exists (scripts/venv.sh makes it first: about 1 min).
#
#   bash scripts/quick.sh [--all] [PYTEST ARGS ...]     e.g. bash scripts/quick.sh -x -k status
#
# --all   every unit test module (about 10 min on 2 cores), still without the property tests, which need
#         Lightning (scripts/test.sh runs them against pytorch-lightning 1.8.6)
set -euo pipefail
cd "$(dirname "$0")/.."
# the slowest modules, about 90 % of the unit suite's time (pytest --durations=0, 2 cores): replica processes,
# benchmarks' smoke runs, launched and forked interpreters
SLOW=(
  test_synccheck_pod.py test_synccheck_layouts.py test_synccheck_replicas.py test_synccheck_host_threads.py
  test_synccheck_anchors_bench.py test_synccheck_probe_wall_bench.py test_synccheck_loop_bench.py test_synchook.py
  test_synccheck_word.py
  test_synccheck_threads.py test_synccheck_evidence.py test_synccheck_first_check_bench.py
  test_synccheck_host_jobs.py
  test_launcher.py test_startup.py test_safe_children.py test_fork.py
)
ALL=0
if [ "${1:-}" = "--all" ]; then ALL=1; shift; fi
source scripts/venv.sh
IGNORE=(--ignore=tests/unit/test_properties.py)
if [ "$ALL" = 0 ]; then
  for module in "${SLOW[@]}"; do IGNORE+=("--ignore=tests/unit/$module"); done
  echo "== unit tests but ${#SLOW[@]} slow modules (bash scripts/quick.sh --all: every module)" >&2
fi
start=$(date +%s)
set +e
"$PY" -m pytest -q -p no:cacheprovider "${IGNORE[@]}" "$@" tests/unit
status=$?
echo "== done in $(( $(date +%s) - start )) s (exit $status)" >&2
exit $status

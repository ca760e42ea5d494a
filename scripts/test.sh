#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs (into .cache/), then runs
#   1. tests/unit                       (no Lightning needed)
#   2. the release matrix               (scripts/matrix.py: every target release x tests/target)
#   3. the real-torch_xla tiers         (tests/xla, once per tier, each in its own venv:
#                                        torch_xla 2.1 + pytorch-lightning 1.8.6, and
#                                        torch_xla 2.9 + lightning-fabric/pytorch-lightning/lightning 2.6.6)
#   4. every other CPython 3.8-3.13     (scripts/pythons.py: tests/unit in a venv per interpreter, built two at a time;
#                                        pytorch-lightning 1.8.6 on 3.8, lightning-fabric 2.6.6 and
#                                        accelerate 1.15.0 on 3.13)
# and ends with one closing line 'N passed, N failed, N skipped' over all of them.
# Once the base venv is ready, everything but the matrix runs as a background lane beside it (unit tests, README
# and package checks, the fixes' install lines resolved by today's pip (tests/fixlines), the matrix's wheel
# downloads, the torch_xla venvs and tiers, the other interpreters): on 2 cores the run is bound by the CPU time
# of all stages together, so no stage waits for one it does not need. The matrix starts once its wheels are
# fetched and runs its targets two at a time, the property tests and the benchmarks' smoke mode beside it; then
# each lane's output is printed and its exit code counted. Options go to scripts/matrix.py (`--smoke`: one
# target per call-site family; `--targets A,B`; `--no-prune` keeps every target folder, about 2.3 GiB, instead
# of deleting each after its tests: its wheels stay cached in .cache/wheels either way).  Disk under .cache/:
# the two torch_xla venvs take 5.1 GiB (2.1) and 7.1 GiB (2.9) (du -h) and are kept for the next run; with the
# base venv, the demo's dependencies, the other interpreters' venvs, the wheel cache and the matrix's two target
# folders .cache/ ends at about 22 GiB. Figures of a fresh-clone run: docs/ci.md.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh || exit 1
set +e  # venv.sh turns -e on; here a failing stage is counted in $status and every later stage still runs
rm -rf results && mkdir -p results
status=0
disk() { echo "   (disk: $(du -sh .cache 2>/dev/null | cut -f1) in .cache/, $(df -Ph . | awk 'NR==2 {print $4}') free)"; }
disk
t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 )) s"; }

pytest_step() {  # name, pytest args...
  local name=$1; shift
  "$PY" -m pytest -q -p no:cacheprovider --junitxml="results/junit-$name.xml" "$@"
  local rc=$?
  if [ "$rc" = 5 ]; then echo "!! $name: no tests were collected"; status=1; elif [ "$rc" != 0 ]; then status=1; fi
}

# Background stages ("lanes"): each runs in a subshell, its output to results/lane-NAME.log; finish_lane
# waits for it, prints that output and counts its exit code. The CPU-bound lanes share the 2 cores with
# the foreground (the kernel interleaves them), so no core idles while another stage waits on the network
# or on a disk, and no stage waits for another it does not need.
declare -A lane_pids
lane() {  # name, function...
  local name=$1; shift
  ( "$@"; cpu_of "$name"; exit $status ) > "results/lane-$name.log" 2>&1 &
  lane_pids[$name]=$!
}
# A stage's CPU time: bash's `times` in the stage's own subshell (its second line counts every process it waited
# for) -> results/cpu-NAME.txt, summed up per stage at the end (cpu_seconds).
cpu_of() { times > "results/cpu-$1.txt"; }
cpu_seconds() {  # a `times` output file -> user + system seconds of the processes waited for
  tail -1 "$1" | awk '{ split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%d", u[1] * 60 + u[2] + s[1] * 60 + s[2] }'
}
finish_lane() {  # name
  wait "${lane_pids[$1]}" || status=1
  cat "results/lane-$1.log"
}

readme_and_package() {
  echo "== README's and the demo's commands, as written, in a fresh venv (tests/readme)"
  pytest_step readme tests/readme
  echo "== the package as it would be published: sdist and wheels, twine check, installed in fresh venvs (tests/package)"
  pytest_step package tests/package
}

fix_lines() {  # network: every pip line the tool prints for a call-site row, resolved by today's pip
  echo "== the fixes' install lines, resolved by today's pip beside the installed torch (tests/fixlines)"
  started=$(date +%s)
  pytest_step fixlines tests/fixlines
  echo "   (fix lines resolved in $(( $(date +%s) - started )) s)"
}

matrix_downloads() {  # network: the matrix's wheels, then the demo's dependencies (tests/target/test_demo.py)
  started=$(date +%s)
  "$PY" scripts/matrix.py --fetch-only "$@" || status=1
  bash scripts/demo.sh --help >/dev/null || { echo "!! installing the demo dependencies failed"; status=1; }
  echo "   (matrix wheels and demo dependencies ready in $(( $(date +%s) - started )) s)"
}

xla_build() {  # tier: its venv (scripts/xla_env.sh: about 6 GB to download and unpack)
  started=$(date +%s)
  bash scripts/xla_env.sh "$1" > "results/xla-env-$1.out" 2> "results/xla-env-$1.log"
  echo $? > "results/xla-env-$1.rc"
  echo $(( $(date +%s) - started )) > "results/xla-env-$1.seconds"
}

xla_test() {  # tier
  echo "== 3/3 real torch_xla tier $1"
  XLA_PY=$(cat "results/xla-env-$1.out" 2>/dev/null)
  if [ "$(cat "results/xla-env-$1.rc" 2>/dev/null)" = 0 ] && [ -x "$XLA_PY" ]; then
    tests_start=$(date +%s)
    TPU_CLOSURE_FIX_XLA_PYTHON="$XLA_PY" pytest_step "xla-$1" tests/xla
    echo "   (tier $1: environment built in $(cat "results/xla-env-$1.seconds") s, tests in" \
         "$(( $(date +%s) - tests_start )) s, done at $(elapsed))"
  else
    echo "!! building the torch_xla $1 environment failed (results/xla-env-$1.log):"
    tail -20 "results/xla-env-$1.log"
    status=1
  fi
}

xla_tiers() {  # the 2.9 venv downloads while the 2.1 tier's tests run
  xla_build 2.1
  xla_build 2.9 &
  local build_29=$!
  xla_test 2.1
  wait "$build_29"
  xla_test 2.9
}

other_pythons() {  # venvs built one after the other, each interpreter's tests as soon as its venv is ready
  echo "== every other CPython 3.8-3.13 found: tests/unit, and a real-framework target at each end (scripts/pythons.py;"
  echo "   $base_minor runs stage 1 in the base venv)"
  started=$(date +%s)
  "$PY" scripts/pythons.py test --results results --skip-minor "$base_minor" || status=1
  echo "   (interpreters' venvs and tests in $(( $(date +%s) - started )) s, done at $(elapsed))"
}

unit_tests() {
  echo "== 1/3 unit tests"
  pytest_step unit tests/unit --ignore=tests/unit/test_properties.py  # that one needs Lightning: below
  echo "   (unit tests done at $(elapsed))"
}

properties_and_benchmarks() {  # after the matrix's downloads: Lightning for the property tests comes from its wheels
  echo "== property tests (hypothesis) against real Lightning: pytorch-lightning 1.8.6"
  # a target folder of its own: the matrix installs and prunes its targets' folders meanwhile
  local root=.cache/properties-target
  "$PY" scripts/targets.py install "pytorch-lightning==1.8.6" --root "$root" >/dev/null || status=1
  PYTHONPATH=$("$PY" scripts/targets.py path "pytorch-lightning==1.8.6" --root "$root") \
    pytest_step properties-pl186 tests/unit/test_properties.py
  echo "== benchmarks, smoke mode (checks they run; figures not meaningful: see README 'Cost')"
  # the benchmarks whose smoke run a unit test makes and reads (tests/unit/test_*_bench.py) are not run twice
  for bench in bench_startup bench_import bench_step synccheck_overhead synccheck_collisions synccheck_scaling \
               synccheck_tensors; do
    "$PY" benchmarks/$bench.py --smoke > "results/$bench.txt" 2>&1 \
      || { echo "!! benchmarks/$bench.py --smoke failed:"; tail -20 "results/$bench.txt"; status=1; }
  done
  echo "   (property tests and benchmarks done at $(elapsed))"
}

# Each lane's replica runs take their rendezvous ports from a block of their own (tests/support/ports.py):
# the matrix's two workers use blocks 0 and 1.
base_minor=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
TPU_CLOSURE_FIX_PORT_BLOCK=2 lane readme-package readme_and_package
lane matrix-downloads matrix_downloads "$@"
lane fixlines fix_lines
TPU_CLOSURE_FIX_PORT_BLOCK=3 lane xla-tiers xla_tiers
TPU_CLOSURE_FIX_PORT_BLOCK=4 lane other-pythons other_pythons

TPU_CLOSURE_FIX_PORT_BLOCK=5 lane unit unit_tests

finish_lane matrix-downloads
TPU_CLOSURE_FIX_PORT_BLOCK=6 lane properties-benchmarks properties_and_benchmarks
echo "== 2/3 release matrix (started at $(elapsed))"
disk
( "$PY" scripts/matrix.py --results results --prune "$@"; rc=$?; cpu_of matrix; exit $rc ) || status=1
echo "   (matrix done at $(elapsed))"

finish_lane unit
finish_lane properties-benchmarks
finish_lane readme-package
finish_lane fixlines
finish_lane other-pythons
finish_lane xla-tiers
disk
# the CPU time of every stage (bash's `times`: the children's line counts every process waited for, lanes included):
# on 2 cores the run takes at least half of it
times > results/times.txt  # in this shell: a command substitution's subshell has no children's times
by_stage=""
for file in results/cpu-*.txt; do
  stage=${file#results/cpu-}; by_stage="$by_stage ${stage%.txt} $(cpu_seconds "$file"),"
done
echo "   (CPU seconds by stage:${by_stage%,})"
echo "== summary ($(elapsed) after the base venv was ready; $(cpu_seconds results/times.txt) s of CPU time in all" \
     "stages together)"
"$PY" scripts/junit_summary.py results/junit-*.xml || status=1
exit $status

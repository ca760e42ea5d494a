#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what it needs (into .cache/), then runs
#   1. tests/unit                       (no Lightning needed)
#   2. the release matrix               (scripts/matrix.py: every target release x tests/target)
#   3. the real-torch_xla tiers         (tests/xla, once per tier, each in its own venv, built in the
#                                        background while the matrix runs:
#                                        torch_xla 2.1 + pytorch-lightning 1.8.6, and
#                                        torch_xla 2.9 + lightning-fabric/pytorch-lightning/lightning 2.6.6)
#   4. every other CPython 3.8-3.13     (scripts/pythons.py: tests/unit in a venv per interpreter, built in the
#                                        background during the matrix; pytorch-lightning 1.8.6 on 3.8,
#                                        lightning-fabric 2.6.6 and accelerate 1.15.0 on 3.13)
# and ends with one closing line 'N passed, N failed, N skipped' over all of them.
# The matrix runs all 29 targets, two at a time: 40.6 min in the fresh-clone run of d863a00 (slowest targets
# pytorch-lightning 1.8.6 1,148 s and lightning-fabric 2.6.6 723 s); options go to scripts/matrix.py
# (`--smoke`: one target per call-site family; `--targets A,B`; `--no-prune` keeps every
# target folder, about 2.3 GiB, instead of deleting each after its tests: its wheels stay
# cached in .cache/wheels either way).  Free disk is printed before each stage.  Disk under
# .cache/: the two torch_xla venvs take 5.1 GiB (2.1) and 7.1 GiB (2.9) (du -h) and are kept for the next
# run; with the base venv, the demo's dependencies, the other interpreters' venvs, the wheel cache and the
# matrix's two target folders .cache/ ends at about 21 GiB, and the run peaks at about 22 GiB written.
# A fresh-clone run takes about 60 min (README, "ci-figures").
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh || exit 1
rm -rf results && mkdir -p results
status=0
disk() { echo "   (disk: $(du -sh .cache 2>/dev/null | cut -f1) in .cache/, $(df -Ph . | awk 'NR==2 {print $4}') free)"; }
disk

pytest_step() {  # name, pytest args...
  local name=$1; shift
  "$PY" -m pytest -q -p no:cacheprovider --junitxml="results/junit-$name.xml" "$@"
  local rc=$?
  if [ "$rc" = 5 ]; then echo "!! $name: no tests were collected"; status=1; elif [ "$rc" != 0 ]; then status=1; fi
}

# The README and package stages (fresh venvs: pip installs, mostly waiting on I/O) run in the background
# while the unit tests run; their output is printed after the unit tests', their exit code counted.
(
  echo "== README's and the demo's commands, as written, in a fresh venv (tests/readme)"
  pytest_step readme tests/readme
  echo "== the package as it would be published: sdist and wheels, twine check, installed in fresh venvs (tests/package)"
  pytest_step package tests/package
  exit $status
) > results/readme-package.log 2>&1 &
readme_package=$!

echo "== 1/3 unit tests"
pytest_step unit tests/unit --ignore=tests/unit/test_properties.py  # that one needs Lightning: below

wait "$readme_package" || status=1
cat results/readme-package.log

echo "== 2/3 release matrix (demo dependencies first: tests/target/test_demo.py needs them)"
bash scripts/demo.sh --help >/dev/null || { echo "!! installing the demo dependencies failed"; status=1; }
# The two torch_xla venvs are built in the background while the matrix runs, one after the other
# (downloading and unpacking about 6 GB is mostly I/O: some 6 minutes the matrix hides on 2 cores).
# Each build's stdout (the interpreter), stderr, exit code and duration go to results/xla-env-TIER.*.
(
  for tier in 2.1 2.9; do
    started=$(date +%s)
    bash scripts/xla_env.sh "$tier" > "results/xla-env-$tier.out" 2> "results/xla-env-$tier.log"
    echo $? > "results/xla-env-$tier.rc"
    echo $(( $(date +%s) - started )) > "results/xla-env-$tier.seconds"
  done
) &
xla_builds=$!
# The venvs of the other Pythons (scripts/pythons.py: pip downloads and unpacking, mostly waiting) are built
# meanwhile too; their tests run after the matrix. The base venv's Python ran stage 1: left out.
base_minor=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
"$PY" scripts/pythons.py build --results results --skip-minor "$base_minor" > results/pythons-build.log 2>&1 &
pythons_build=$!
disk
"$PY" scripts/matrix.py --results results --prune "$@" || status=1

echo "== property tests (hypothesis) against real Lightning: pytorch-lightning 1.8.6"
"$PY" scripts/targets.py install "pytorch-lightning==1.8.6" >/dev/null || status=1
PYTHONPATH=$("$PY" scripts/targets.py path "pytorch-lightning==1.8.6") pytest_step properties-pl186 tests/unit/test_properties.py

echo "== benchmarks, smoke mode (checks they run; figures not meaningful: see README 'Cost')"
for bench in bench_startup bench_import bench_step synccheck_overhead synccheck_collisions; do
  "$PY" benchmarks/$bench.py --smoke > "results/$bench.txt" 2>&1 || { echo "!! benchmarks/$bench.py --smoke failed:"; tail -20 "results/$bench.txt"; status=1; }
done

waited=$(date +%s)
wait "$xla_builds"
echo "   (waited $(( $(date +%s) - waited )) s for the torch_xla venvs built during the matrix)"
# The torch_xla tiers (one pytest each, one after the other) run in the background while the other
# interpreters' tests run: two single-process stages side by side on 2 cores. The tiers' output is printed
# after the interpreters', their exit code counted.
(
  for tier in 2.1 2.9; do
    echo "== 3/3 real torch_xla tier $tier"
    disk
    XLA_PY=$(cat "results/xla-env-$tier.out" 2>/dev/null)
    if [ "$(cat "results/xla-env-$tier.rc" 2>/dev/null)" = 0 ] && [ -x "$XLA_PY" ]; then
      tests_start=$(date +%s)
      TPU_CLOSURE_FIX_XLA_PYTHON="$XLA_PY" pytest_step "xla-$tier" tests/xla
      echo "   (tier $tier: environment built in $(cat "results/xla-env-$tier.seconds") s during the matrix," \
           "tests in $(( $(date +%s) - tests_start )) s)"
    else
      echo "!! building the torch_xla $tier environment failed (results/xla-env-$tier.log):"
      tail -20 "results/xla-env-$tier.log"
      status=1
    fi
  done
  exit $status
) > results/xla-tiers.log 2>&1 &
xla_tiers=$!

wait "$pythons_build"
echo "== every other CPython 3.8-3.13 found: tests/unit, and a real-framework target at each end (scripts/pythons.py;"
echo "   $base_minor ran stage 1 in the base venv)"
cat results/pythons-build.log
pythons_start=$(date +%s)
"$PY" scripts/pythons.py test --results results --skip-minor "$base_minor" || status=1
echo "   (interpreters' tests in $(( $(date +%s) - pythons_start )) s)"

wait "$xla_tiers" || status=1
cat results/xla-tiers.log

disk
echo "== summary"
"$PY" scripts/junit_summary.py results/junit-*.xml || status=1
exit $status

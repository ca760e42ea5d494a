#!/usr/bin/env bash
# The main job: an environment with an affected release (pytorch-lightning 1.8.6 on the CPU torch),
# tpu-closure-fix installed from a wheel, and the before/after evidence:
# `tpu-closure-fix status` with the shim switched off (TPU_CLOSURE_FIX=0), then on.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
TARGET="pytorch-lightning==1.8.6"
"$PY" scripts/targets.py install "$TARGET" >&2
TDIR=$("$PY" scripts/targets.py path "$TARGET")
export PYTHONPATH="$TDIR" PYTHONWARNINGS=ignore
echo
echo "### $TARGET, shim switched off (TPU_CLOSURE_FIX=0): the buggy call sites run"
set +e
TPU_CLOSURE_FIX=0 tpu-closure-fix status
off=$?
echo "(exit code $off)"
echo
echo "### $TARGET, shim on (default after pip install)"
tpu-closure-fix status
on=$?
echo "(exit code $on)"
set -e
[ "$off" = 1 ] && [ "$on" = 0 ]

#!/usr/bin/env bash
# The main job: an environment with an affected release (pytorch-lightning 1.8.6 on the CPU torch),
# tpu-closure-fix installed from a wheel, the torch_xla 2.1 tier (pass --no-xla to skip it), and
# `tpu-closure-fix check` with the shim switched off (TPU_CLOSURE_FIX=0), then on: the before/after
# evidence (status, event order with a recording stand-in, and the real XLA graph of one step).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
TARGET="pytorch-lightning==1.8.6"
"$PY" scripts/targets.py install "$TARGET" >&2
TDIR=$("$PY" scripts/targets.py path "$TARGET")
XLA_ARGS=()
if [ "${1:-}" != "--no-xla" ]; then
  XLA_PY=$(bash scripts/xla_env.sh)
  XLA_ARGS=(--xla-python "$XLA_PY")
fi
export PYTHONPATH="$TDIR" PYTHONWARNINGS=ignore
echo
echo "################ $TARGET, shim switched off (TPU_CLOSURE_FIX=0): the bug"
set +e
TPU_CLOSURE_FIX=0 tpu-closure-fix check "${XLA_ARGS[@]}"
off=$?
echo "(exit code $off)"
echo
echo "################ $TARGET, shim on (the default after pip install)"
tpu-closure-fix check "${XLA_ARGS[@]}"
on=$?
echo "(exit code $on)"
set -e
[ "$off" = 1 ] && [ "$on" = 0 ]

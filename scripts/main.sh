#!/usr/bin/env bash
# The main job: `tpu-closure-fix check` with the shim switched off (TPU_CLOSURE_FIX=0), then on: the
# before/after evidence (status, event order with a recording stand-in, and the real XLA graph of one
# step per call site).  Expects exit code 1 (unprotected) off and 0 (protected) on.
#
#   bash scripts/main.sh [--current] [--no-xla]
#
# default     pytorch-lightning 1.8.6, the last release whose Trainer *and* Lite both carry the bug:
#             the check runs in the CPU test environment (.cache/venv, the release installed as a
#             target); the graph check runs in the torch_xla 2.1 tier (scripts/xla_env.sh 2.1, 5.1 GiB)
#             through --xla-python.
# --current   the current stack, as a user installs it: torch 2.9 + torch_xla 2.9 with lightning-fabric,
#             pytorch-lightning and lightning 2.6.6 and tpu-closure-fix (scripts/xla_env.sh 2.9, 7.1 GiB);
#             the check runs inside that environment.  Fabric's site is patched; the Trainer's is fixed
#             upstream (verified, untouched).  With --no-xla: lightning-fabric 2.6.6 as a target of the
#             CPU environment instead, no graph.
# --no-xla    skip the torch_xla environment and the graph check.
set -euo pipefail
cd "$(dirname "$0")/.."
CURRENT=0 XLA=1
for arg in "$@"; do
  case "$arg" in
    --current) CURRENT=1 ;;
    --no-xla) XLA=0 ;;
    *) echo "main.sh: unknown option '$arg' (accepted: --current, --no-xla)" >&2; exit 2 ;;
  esac
done
T0=$(date +%s)
STAGES=4
[ "$XLA" = 1 ] && STAGES=5
[ "$CURRENT" = 1 ] && [ "$XLA" = 1 ] && STAGES=4
STAGE=0
stage() {  # one progress line per stage, on stderr: number, seconds since the start, what it does
  STAGE=$((STAGE + 1))
  echo "[main.sh $STAGE/$STAGES, $(( $(date +%s) - T0 )) s] $*" >&2
}
stage "base venv .cache/venv: torch 2.13.0 CPU, test tools, tpu-closure-fix from this checkout"
source scripts/venv.sh

if [ "$CURRENT" = 1 ] && [ "$XLA" = 1 ]; then
  stage "torch_xla 2.9 venv .cache/xla-venv-2.9, Lightning 2.6.6 (first run: about 7.1 GiB)"
  XLA_PY=$(bash scripts/xla_env.sh 2.9)
  CHECK=("$(dirname "$XLA_PY")/tpu-closure-fix" check)
  LABEL="torch_xla 2.9 + lightning-fabric / pytorch-lightning / lightning 2.6.6"
  unset PYTHONPATH
else
  if [ "$CURRENT" = 1 ]; then TARGET="lightning-fabric==2.6.6"; else TARGET="pytorch-lightning==1.8.6"; fi
  stage "$TARGET and its pinned dependencies into .cache/targets (no torch)"
  "$PY" scripts/targets.py install "$TARGET" >&2
  export PYTHONPATH
  PYTHONPATH=$("$PY" scripts/targets.py path "$TARGET")
  CHECK=(tpu-closure-fix check)
  LABEL="$TARGET"
  if [ "$XLA" = 1 ]; then
    stage "torch_xla 2.1 venv .cache/xla-venv-2.1 for the graph check (first run: about 5.1 GiB)"
    CHECK+=(--xla-python "$(bash scripts/xla_env.sh 2.1)")
    LABEL="$LABEL, graph in the torch_xla 2.1 tier"
  else
    CHECK+=(--no-graph)
  fi
fi
export PYTHONWARNINGS=ignore
stage "tpu-closure-fix check with the shim switched off (TPU_CLOSURE_FIX=0): expects exit code 1"
echo
echo "################ $LABEL, shim switched off (TPU_CLOSURE_FIX=0): the bug"
set +e
TPU_CLOSURE_FIX=0 "${CHECK[@]}"
off=$?
echo "(exit code $off)"
stage "tpu-closure-fix check with the shim on: expects exit code 0"
echo
echo "################ $LABEL, shim on (the default after pip install)"
"${CHECK[@]}"
on=$?
echo "(exit code $on)"
set -e
echo "[main.sh done, $(( $(date +%s) - T0 )) s] .cache/ holds $(du -sh .cache 2>/dev/null | cut -f1)" >&2
[ "$off" = 1 ] && [ "$on" = 0 ]

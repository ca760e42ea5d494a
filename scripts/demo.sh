#!/usr/bin/env bash
# tpu-closure-fix demo in this repository: installs (once) the pytorch-lightning==1.8.6 target and the
# demo's dependencies (.cache/demo-deps, from scripts/demo-requirements.txt), then runs
#   python -m tpu_closure_fix.integrations.lightning.demo "$@"
# with this checkout first on PYTHONPATH. Example (what made docs/demo.png):
#   bash scripts/demo.sh --out .cache/demo --png docs/demo.png
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY="$REPO/.cache/venv/bin/python"
if ! "$PY" -c "import torch, wrapt, packaging" >/dev/null 2>&1; then
  source "$REPO/scripts/venv.sh"  # creates the base venv (torch CPU) on a fresh clone
fi
"$PY" "$REPO/scripts/targets.py" install pytorch-lightning==1.8.6 >&2
TARGET=$("$PY" "$REPO/scripts/targets.py" path pytorch-lightning==1.8.6)
DEPS="$REPO/.cache/demo-deps"
STAMP="$DEPS/.requirements.txt"
if ! cmp -s "$REPO/scripts/demo-requirements.txt" "$STAMP" 2>/dev/null; then
  echo "== installing the demo's dependencies into $DEPS" >&2
  rm -rf "$DEPS.tmp"
  "$PY" -m pip install -q --no-deps --no-input --disable-pip-version-check --no-warn-script-location \
    --target "$DEPS.tmp" -r "$REPO/scripts/demo-requirements.txt" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
  PYTHONPATH="$TARGET:$DEPS.tmp" "$PY" -c "import matplotlib.pyplot, sklearn.datasets, tensorboardX, tqdm" \
    || { echo "installing the demo's dependencies failed" >&2; exit 1; }
  cp "$REPO/scripts/demo-requirements.txt" "$DEPS.tmp/.requirements.txt"
  rm -rf "$DEPS"
  mv "$DEPS.tmp" "$DEPS"
fi
export PYTHONPATH="$REPO:$TARGET:$DEPS"
export PYTHONNOUSERSITE=1
exec "$PY" -m tpu_closure_fix.integrations.lightning.demo "$@"

#!/usr/bin/env bash
# Source me: creates (once) the base venv .cache/venv with the CPU torch and installs this package
# into it from a freshly built wheel (non-editable, so the .pth/.start files and the console script
# are installed exactly as for a user). Exports VENV, PY and puts the venv's bin first on PATH.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$REPO/.cache/venv"
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV (python: $(python3 --version 2>&1))" >&2
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
source "$REPO/scripts/retry.sh"
quiet_pip() {  # pip install in the venv, its harmless find-links notes left out; pip's own exit status
  "$PY" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" >&2
  return "${PIPESTATUS[0]}"
}
if ! "$PY" -c "import torch, wrapt, pytest, hypothesis, packaging, xxhash" >/dev/null 2>&1; then
  echo "== installing torch 2.13.0 (CPU), the package's dependencies and the test tools" >&2
  retry_once quiet_pip torch==2.13.0 wrapt packaging "xxhash>=3.0" pytest hypothesis || true
  "$PY" -c "import torch, wrapt, pytest, hypothesis, packaging, xxhash" \
    || { echo "base venv install failed" >&2; exit 1; }
fi
echo "== installing tpu-closure-fix from a wheel built from this checkout" >&2
retry_once quiet_pip --no-deps --force-reinstall "$REPO" || true
"$PY" -c "import tpu_closure_fix" || { echo "installing tpu-closure-fix failed" >&2; exit 1; }
export VENV PY
export PATH="$VENV/bin:$PATH"

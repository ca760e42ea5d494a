#!/usr/bin/env bash
# Build the real-torch_xla (CPU/PJRT) environment used by the graph-evidence tier.
#
#   scripts/xla_env.sh [DIR]      (default: <repo>/.cache/xla-venv)
#
# Creates a venv with torch==2.1.0 + torch_xla==2.1.0 from PyPI (the CUDA build of
# torch comes along, ~5 GB; it still runs on the CPU), pytorch-lightning 1.8.6
# installed with --no-deps plus the pinned packages it needs to import, and wrapt.
# When <repo>/pyproject.toml exists this repo's package is installed too
# (--no-deps, refreshed on every run; a failure there only warns: the tests put the
# repo on PYTHONPATH).  Idempotent: the heavy part is skipped when the stamp file
# matches.  All progress goes to stderr; stdout is exactly one line, the interpreter:
#   XLA_PY=$(bash scripts/xla_env.sh)   ->   <DIR>/bin/python
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$REPO/.cache/xla-venv}"
PY_BOOT="${XLA_ENV_BOOT_PYTHON:-python3}"
STAMP="$DIR/.tpu-closure-fix-xla-env"

# Everything that decides the content of the venv; changing it rebuilds.
TORCH_PINS=(torch==2.1.0 torch_xla==2.1.0)
NODEPS_PINS=(
  pytorch-lightning==1.8.6
  torchmetrics==0.11.4
  lightning-utilities==0.5.0
  tensorboardX==2.6
)
SUPPORT_PINS=(
  "numpy<2"
  "protobuf<4"
  "setuptools<82"
  "fsspec"
  "PyYAML"
  "tqdm"
  "packaging"
  "typing_extensions"
  "wrapt"
)
SPEC="v1 ${TORCH_PINS[*]} | ${NODEPS_PINS[*]} | ${SUPPORT_PINS[*]}"

log() { echo "[xla_env] $*" >&2; }

check_imports() {
  "$DIR/bin/python" - <<'PY'
import os
os.environ.setdefault("PJRT_DEVICE", "CPU")
import torch, torch_xla, torch_xla.core.xla_model as xm  # noqa: F401
import pytorch_lightning as pl
from pytorch_lightning.plugins.precision.tpu import TPUPrecisionPlugin  # noqa: F401
from lightning_lite.plugins.precision.tpu import TPUPrecision  # noqa: F401
import wrapt  # noqa: F401
import sys
print(f"[xla_env] torch {torch.__version__}, torch_xla {torch_xla.__version__}, "
      f"pytorch_lightning {pl.__version__}", file=sys.stderr)
PY
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$SPEC" && -x "$DIR/bin/python" ]] && check_imports; then
  log "already built: $DIR (stamp $STAMP)"
else
  start=$(date +%s)
  rm -f "$STAMP"
  if [[ ! -x "$DIR/bin/python" ]]; then
    log "creating venv $DIR with $("$PY_BOOT" --version 2>&1)"
    mkdir -p "$(dirname "$DIR")"
    "$PY_BOOT" -m venv "$DIR" >&2
  fi
  PIP=("$DIR/bin/python" -m pip --disable-pip-version-check)
  export PIP_NO_INPUT=1
  log "installing ${TORCH_PINS[*]} (large download, ~5 GB)"
  "${PIP[@]}" install "${TORCH_PINS[@]}" >&2
  log "installing support packages: ${SUPPORT_PINS[*]}"
  # keep torch's own pins intact: list torch again so the resolver cannot move it
  "${PIP[@]}" install "${TORCH_PINS[@]}" "${SUPPORT_PINS[@]}" >&2
  log "installing --no-deps: ${NODEPS_PINS[*]}"
  "${PIP[@]}" install --no-deps "${NODEPS_PINS[@]}" >&2
  check_imports
  echo "$SPEC" > "$STAMP"
  log "built in $(( $(date +%s) - start )) s"
fi

if [[ -f "$REPO/pyproject.toml" ]]; then
  log "installing this repo's package (--no-deps) from $REPO"
  if ! "$DIR/bin/python" -m pip --disable-pip-version-check install --no-deps --force-reinstall -q "$REPO" >&2; then
    log "WARNING: installing $REPO into the venv failed (see above); the graph tier still runs from PYTHONPATH"
  fi
else
  log "no $REPO/pyproject.toml yet: repo package not installed (tests use PYTHONPATH)"
fi

log "installed into $DIR (python: $DIR/bin/python)"
echo "$DIR/bin/python"

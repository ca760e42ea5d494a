#!/usr/bin/env bash
# Build a real-torch_xla (CPU/PJRT) environment for the graph-evidence tier.
#
#   scripts/xla_env.sh [TIER] [DIR]     TIER: 2.1 (default) or 2.9
#                                       DIR:  default <repo>/.cache/xla-venv-<TIER>
#
# Tiers (each a venv of its own; the Lightning packages go in with --no-deps plus the
# pinned packages they need to import, so the resolver can never move torch):
#   2.1  torch==2.1.0 + torch_xla==2.1.0, pytorch-lightning 1.8.6 (vendors lightning_lite):
#        the releases with the bug.  About 5.1 GiB.
#   2.9  torch==2.9.0 + torch_xla==2.9.0, lightning-fabric 2.6.6, pytorch-lightning 2.6.6 and
#        lightning 2.6.6: the current stack (Fabric patched by the shim, the Trainer fixed
#        upstream).  About 7 GiB.
# PyPI's torch for Linux is the CUDA build: its nvidia-* wheels come along; it still runs on
# the CPU.  wrapt is installed too.  When <repo>/pyproject.toml exists this repo's package is
# installed (--no-deps, refreshed on every run; a failure there only warns: the tests put the
# repo on PYTHONPATH).  Idempotent: the heavy part is skipped when the stamp file matches.
# All progress goes to stderr; stdout is exactly one line, the interpreter:
#   XLA_PY=$(bash scripts/xla_env.sh 2.9)   ->   <DIR>/bin/python
#
# Disk: to keep the peak close to the finished size, the large CUDA/torch wheels are installed
# first, one pip call each (a downloaded wheel is freed when its call ends), never through pip's
# cache (--no-cache-dir): torch and torch_xla, then the large packages their installed metadata
# requires, until none is missing; then one resolution of all the pins installs the small rest
# and keeps what is installed.  Each wheel is downloaded once (a resolution before installing
# downloads every wheel whole when the index serves no separate metadata).
# Before building, the free space of DIR's file system is checked against
# XLA_ENV_NEED_GB (default: 6 for 2.1, 9 for 2.9); too little is an error that names both
# figures.  A venv this script created and could not finish is deleted again, so a failed
# build leaves no gigabytes behind.
set -euo pipefail
# The venv must hold everything it needs itself: a PYTHONPATH from the caller (a matrix target folder,
# say) would make pip count that folder's packages as installed and leave them out of the venv.
unset PYTHONPATH PYTHONHOME

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$REPO/scripts/retry.sh"  # retry_once: a failed package download is tried once more
TIER="${1:-2.1}"
PY_BOOT="${XLA_ENV_BOOT_PYTHON:-python3}"

# Everything that decides the content of the venv; changing it rebuilds.
SUPPORT_PINS=("fsspec" "PyYAML" "tqdm" "packaging" "typing_extensions" "wrapt")
case "$TIER" in
  2.1)
    TORCH_PINS=(torch==2.1.0 torch_xla==2.1.0)
    NODEPS_PINS=(
      pytorch-lightning==1.8.6
      torchmetrics==0.11.4
      lightning-utilities==0.5.0
      tensorboardX==2.6
    )
    SUPPORT_PINS+=("numpy<2" "protobuf<4" "setuptools<82")
    # module:Class pairs that must import once the venv is complete
    IMPORTS="pytorch_lightning.plugins.precision.tpu:TPUPrecisionPlugin lightning_lite.plugins.precision.tpu:TPUPrecision"
    DEFAULT_NEED_GB=6
    ;;
  2.9)
    TORCH_PINS=(torch==2.9.0 torch_xla==2.9.0)
    NODEPS_PINS=(
      lightning-fabric==2.6.6
      pytorch-lightning==2.6.6
      lightning==2.6.6
      torchmetrics==1.9.0
      lightning-utilities==0.15.3
    )
    SUPPORT_PINS+=("numpy")
    IMPORTS="lightning_fabric.plugins.precision.xla:XLAPrecision pytorch_lightning.plugins.precision.xla:XLAPrecision lightning.fabric.plugins.precision.xla:XLAPrecision"
    DEFAULT_NEED_GB=9
    ;;
  *)
    echo "[xla_env] ERROR: unknown tier '$TIER' (accepted: 2.1, 2.9)" >&2
    exit 2
    ;;
esac
DIR="${2:-$REPO/.cache/xla-venv-$TIER}"
STAMP="$DIR/.tpu-closure-fix-xla-env"
SPEC="v3 tier $TIER: ${TORCH_PINS[*]} | ${NODEPS_PINS[*]} | ${SUPPORT_PINS[*]}"

NEED_GB="${XLA_ENV_NEED_GB:-$DEFAULT_NEED_GB}"
if [[ ! "$NEED_GB" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
  echo "[xla_env] ERROR: XLA_ENV_NEED_GB=$NEED_GB is not a number of GiB (accepted: e.g. 6 or 5.5)" >&2
  exit 2
fi

log() { echo "[xla_env] $*" >&2; }

free_gb() {  # free space, in GiB, of the file system that holds $1 (or its nearest existing parent)
  local path=$1
  while [[ ! -e "$path" ]]; do path=$(dirname "$path"); done
  df -Pk "$path" | awk 'NR==2 {printf "%.1f", $4 / 1048576}'
}

check_imports() {
  "$DIR/bin/python" - $IMPORTS <<'PY'
import importlib, os, sys
os.environ.setdefault("PJRT_DEVICE", "CPU")
import torch, torch_xla, torch_xla.core.xla_model as xm  # noqa: F401
import packaging, wrapt  # noqa: F401  (the shim's own dependencies, needed by every check child)
for pair in sys.argv[1:]:
    module, name = pair.split(":")
    getattr(importlib.import_module(module), name)
from importlib.metadata import version
found = []
for dist in ("pytorch-lightning", "lightning-fabric", "lightning"):
    try:
        found.append(f"{dist} {version(dist)}")
    except Exception:
        pass
print(f"[xla_env] torch {torch.__version__}, torch_xla {torch_xla.__version__}, " + ", ".join(found),
      file=sys.stderr)
PY
}

missing_large_requirements() {  # requirements of the installed packages on large ones not installed yet, one a line
  "$DIR/bin/python" - <<'PY'
import re
from importlib import metadata
from pip._vendor.packaging.requirements import Requirement  # the venv's own pip: no other package needed yet

LARGE = re.compile(r"^(nvidia-|torch$|torch[-_]xla$|triton$)", re.I)
installed = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version for d in metadata.distributions()}
wanted = {}
for dist in metadata.distributions():
    for line in dist.requires or []:
        req = Requirement(line)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if LARGE.match(name) and (req.marker is None or req.marker.evaluate({"extra": ""})):
            if name not in installed:
                wanted.setdefault(name, str(req.specifier))
print("\n".join(name + spec for name, spec in sorted(wanted.items())))
PY
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$SPEC" && -x "$DIR/bin/python" ]] && check_imports; then
  log "already built: $DIR (stamp $STAMP)"
else
  start=$(date +%s)
  rm -f "$STAMP"
  created=0
  if [[ ! -x "$DIR/bin/python" ]]; then
    free=$(free_gb "$DIR")
    log "free disk for $DIR: ${free} GiB (needs about ${NEED_GB} GiB: XLA_ENV_NEED_GB)"
    if awk -v f="$free" -v n="$NEED_GB" 'BEGIN { exit !(f < n) }'; then
      log "ERROR: not enough disk to build the torch_xla environment: ${free} GiB free where $DIR would go," \
          "about ${NEED_GB} GiB needed (${TORCH_PINS[*]} with the CUDA libraries)." \
          "Free some space, or give another folder: bash scripts/xla_env.sh $TIER /bigger/disk/xla-venv-$TIER"
      exit 1
    fi
    log "creating venv $DIR with $("$PY_BOOT" --version 2>&1)"
    mkdir -p "$(dirname "$DIR")"
    "$PY_BOOT" -m venv "$DIR" >&2
    created=1
  fi
  cleanup_failed_build() {
    if [[ $created == 1 ]]; then
      log "build failed: deleting the unfinished venv $DIR (free disk now: $(free_gb "$DIR") GiB)"
      rm -rf "$DIR"
    fi
  }
  trap cleanup_failed_build ERR
  PIP=("$DIR/bin/python" -m pip --disable-pip-version-check --no-cache-dir)
  export PIP_NO_INPUT=1
  # The index serves no separate metadata (PEP 658), so a resolution (even --dry-run) downloads every wheel
  # whole: the large ones are found from the metadata of what is installed instead, so each is downloaded once.
  log "installing the large packages one at a time, following their requirements (free disk: $(free_gb "$DIR") GiB)"
  large=("${TORCH_PINS[@]}") installed=0
  while [[ ${#large[@]} -gt 0 ]]; do
    for pin in "${large[@]}"; do
      log "  $pin"
      retry_once "${PIP[@]}" install --no-deps --quiet "$pin" >&2
      installed=$((installed + 1))
    done
    wanted=$(missing_large_requirements)  # a failure here stops the build (errexit)
    large=()
    [[ -z "$wanted" ]] || mapfile -t large <<< "$wanted"
  done
  if [[ $installed -le ${#TORCH_PINS[@]} ]]; then
    log "ERROR: no large requirement found in the metadata of ${TORCH_PINS[*]}"; false
  fi
  log "installed $installed large packages; the others, resolved beside them (free disk: $(free_gb "$DIR") GiB)"
  # torch's pins are listed again so the resolver keeps the large packages installed above
  retry_once "${PIP[@]}" install --quiet "${TORCH_PINS[@]}" "${SUPPORT_PINS[@]}" >&2
  log "installing --no-deps: ${NODEPS_PINS[*]}"
  retry_once "${PIP[@]}" install --no-deps --quiet "${NODEPS_PINS[@]}" >&2
  check_imports
  trap - ERR
  echo "$SPEC" > "$STAMP"
  log "built in $(( $(date +%s) - start )) s; $(du -sh "$DIR" | cut -f1) on disk, $(free_gb "$DIR") GiB left free"
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

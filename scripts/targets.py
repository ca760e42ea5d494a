#!/usr/bin/env python
"""Version-matrix target installer for tpu-closure-fix.

Each *target* is one old Lightning release plus exact pins for its dependencies.
A target is installed with ``pip install --no-deps --target <root>/<slug>`` into a
folder of its own, and is used by putting that folder on ``PYTHONPATH`` on top of
a base venv that already holds torch (2.13.0+cpu), wrapt, pytest and packaging.
pip never resolves dependencies here, so torch is never pulled into a target.

Usage::

    python scripts/targets.py list
    python scripts/targets.py install [NAME ...] [--root DIR] [--force]
    python scripts/targets.py path NAME [--root DIR]
    python scripts/targets.py fetch [NAME ...]              # wheels only
    python scripts/targets.py remove [NAME ...] [--root DIR]
    python scripts/targets.py train [NAME ...] [--root DIR]   # CPU smoke-train

``install`` without names installs every target.  The default root is
``.cache/targets`` under the repository.  A stamp file in each target folder
holds a hash of the requirement list; a target whose stamp matches is not
reinstalled.  Any pip failure or failed import check is an error (exit 1).

Wheels are fetched once into a local wheel cache (``.cache/wheels``, or
``$TPU_CLOSURE_FIX_WHEELS``) and targets are installed from it with
``--no-index``, so a target folder can be deleted after use (``remove``,
``matrix.py --prune``) and comes back without the network.

Python 3.8+, standard library only.  See scripts/README.md for where the pins
come from.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling download_retry.py, however loaded
from download_retry import retry_once  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ROOT = REPO / ".cache" / "targets"
#: Local wheel cache shared by all targets (``$TPU_CLOSURE_FIX_WHEELS`` overrides).
#: pip's own HTTP cache stores nothing on these machines (see scripts/README.md),
#: so this folder is what makes a re-install, or a pruned target's next install,
#: work without the network.
DEFAULT_WHEELS = REPO / ".cache" / "wheels"
STAMP_NAME = ".tpu-closure-fix-target.json"
# Bump when the install procedure itself changes, to invalidate old stamps.
STAMP_FORMAT = 3  # 3: what the import check imports is byte-compiled at install (see verify_imports)

# Setuptools that still ships ``pkg_resources`` (82+ dropped it; torch 2.13
# pulls 84.x into the venv).  Installed into the target, it shadows the venv's.
# 75.3.0 is the last release for Python 3.8 (scripts/pythons.py installs targets
# there with a 3.8 venv running this script).
SETUPTOOLS = "setuptools==81.0.0" if sys.version_info >= (3, 9) else "setuptools==75.3.0"

# --------------------------------------------------------------------------
# Pins.  The Lightning distribution comes first, then its dependencies.
# --------------------------------------------------------------------------

_TB_STACK_1_2 = ["tensorboard==2.4.1", "protobuf==3.20.3", "absl-py==0.12.0", "six==1.16.0"]

_PL_1_8_6 = [
    "torchmetrics==0.11.0", "lightning-utilities==0.4.2", "packaging==22.0",
    "tqdm==4.64.1", "fsspec==2022.11.0", "PyYAML==6.0.1", "numpy==1.23.5",
    "tensorboardX==2.5.1", "protobuf==3.20.3", SETUPTOOLS,
]


def _with_tensorboard(lightning_pins, tensorboard_pins):
    """The pins of a PL 1.3-1.8.0 target: Lightning and its own dependencies, then the PyYAML and numpy
    that all of them share, then the tensorboard stack and the six and setuptools it needs.  The order is
    the requirement list's, which the install stamp hashes."""
    return lightning_pins + ["PyYAML==6.0.1", "numpy==1.23.5"] + tensorboard_pins + ["six==1.16.0", SETUPTOOLS]


#: PL 1.0.x-1.1.x predate torchmetrics (metrics lived in pytorch_lightning.metrics). Their wheels ask for
#: numpy, future, PyYAML, tqdm, fsspec and tensorboard; no module of theirs imports future (left out), and
#: tensorboard's stack needs pkg_resources (setuptools 81).
_PL_1_0 = ["tqdm==4.51.0", "fsspec==0.8.4", "PyYAML==6.0.1", "numpy==1.23.5"]

TARGETS = {
    "pytorch-lightning==1.0.4": ["pytorch-lightning==1.0.4"] + _PL_1_0 + _TB_STACK_1_2 + [SETUPTOOLS],
    "pytorch-lightning==1.0.8": ["pytorch-lightning==1.0.8"] + _PL_1_0 + _TB_STACK_1_2 + [SETUPTOOLS],
    "pytorch-lightning==1.1.0": ["pytorch-lightning==1.1.0"] + _PL_1_0 + _TB_STACK_1_2 + [SETUPTOOLS],
    "pytorch-lightning==1.1.8": ["pytorch-lightning==1.1.8"] + _PL_1_0 + _TB_STACK_1_2 + [SETUPTOOLS],
    "pytorch-lightning==1.2.10": [
        "pytorch-lightning==1.2.10", "torchmetrics==0.2.0", "future==1.0.0",
        "packaging==20.9", "pyparsing==2.4.7", "tqdm==4.60.0", "fsspec==2021.4.0",
        "PyYAML==6.0.1", "numpy==1.23.5",
    ] + _TB_STACK_1_2 + [SETUPTOOLS],
    "pytorch-lightning==1.3.8": _with_tensorboard(
        ["pytorch-lightning==1.3.8", "torchmetrics==0.4.1", "pyDeprecate==0.3.0", "future==1.0.0",
         "packaging==21.0", "pyparsing==2.4.7", "tqdm==4.61.1", "fsspec==2021.6.1"],
        ["tensorboard==2.4.1", "protobuf==3.20.3", "absl-py==0.13.0"]),
    "pytorch-lightning==1.4.9": _with_tensorboard(
        ["pytorch-lightning==1.4.9", "torchmetrics==0.5.0", "pyDeprecate==0.3.1", "packaging==21.0",
         "pyparsing==2.4.7", "tqdm==4.62.3", "fsspec==2021.9.0"],
        ["tensorboard==2.6.0", "protobuf==3.20.3", "absl-py==0.14.1"]),
    "pytorch-lightning==1.5.10": _with_tensorboard(
        ["pytorch-lightning==1.5.10", "torchmetrics==0.7.2", "pyDeprecate==0.3.1", "packaging==21.3",
         "pyparsing==3.0.7", "tqdm==4.62.3", "fsspec==2022.1.0"],
        ["tensorboard==2.8.0", "protobuf==3.20.3", "absl-py==1.0.0"]),
    "pytorch-lightning==1.6.5": _with_tensorboard(
        ["pytorch-lightning==1.6.5", "torchmetrics==0.9.2", "pyDeprecate==0.3.2", "packaging==21.3",
         "pyparsing==3.0.9", "tqdm==4.64.0", "fsspec==2022.5.0"],
        ["tensorboard==2.9.1", "protobuf==3.20.1", "absl-py==1.1.0"]),
    "pytorch-lightning==1.7.7": _with_tensorboard(
        ["pytorch-lightning==1.7.7", "torchmetrics==0.9.3", "pyDeprecate==0.3.2", "packaging==21.3",
         "pyparsing==3.0.9", "tqdm==4.64.1", "fsspec==2022.8.2"],
        ["tensorboard==2.10.0", "protobuf==3.19.6", "absl-py==1.2.0"]),
    "pytorch-lightning==1.8.0": _with_tensorboard(
        ["pytorch-lightning==1.8.0", "torchmetrics==0.10.2", "lightning-utilities==0.3.0", "packaging==21.3",
         "pyparsing==3.0.9", "tqdm==4.64.1", "fsspec==2022.10.0"],
        ["tensorboard==2.10.1", "protobuf==3.19.6", "absl-py==1.3.0"]),
    "pytorch-lightning==1.8.6": ["pytorch-lightning==1.8.6"] + _PL_1_8_6,
    "pytorch-lightning==1.9.0": [
        "pytorch-lightning==1.9.0", "torchmetrics==0.11.0", "lightning-utilities==0.5.0",
        "packaging==23.0", "tqdm==4.64.1", "fsspec==2023.1.0", "PyYAML==6.0.1",
        "numpy==1.24.1", SETUPTOOLS,
    ],
    "pytorch-lightning==1.9.5": [
        "pytorch-lightning==1.9.5", "torchmetrics==0.11.4", "lightning-utilities==0.8.0",
        "packaging==23.0", "tqdm==4.65.0", "fsspec==2023.4.0", "PyYAML==6.0.1",
        "numpy==1.24.2", SETUPTOOLS,
    ],
    "pytorch-lightning==2.0.9": [
        "pytorch-lightning==2.0.9", "torchmetrics==1.1.2", "lightning-utilities==0.9.0",
        "packaging==23.1", "tqdm==4.66.1", "fsspec==2023.9.0", "PyYAML==6.0.1",
        "numpy==1.25.2", SETUPTOOLS,
    ],
    "pytorch-lightning==2.6.6": [
        "pytorch-lightning==2.6.6", "torchmetrics==1.9.0", "lightning-utilities==0.15.3",
        "packaging==26.4", "tqdm==4.70.1", "fsspec==2026.9.0", "PyYAML==6.0.4",
        "numpy==2.4.6",
    ],
    "lightning==1.8.6": ["lightning==1.8.6"] + _PL_1_8_6 + [
        "requests==2.28.1", "urllib3==1.26.13", "idna==3.4", "charset-normalizer==2.1.1",
        "certifi==2022.12.7", "fastapi==0.88.0", "starlette==0.22.0", "pydantic==1.10.2",
        "anyio==3.6.2", "sniffio==1.3.0", "websockets==10.4", "deepdiff==6.2.2",
        "ordered-set==4.1.0", "lightning-cloud==0.5.12", "click==8.1.3", "pyjwt==2.6.0",
        "rich==12.6.0", "six==1.16.0", "websocket-client==1.4.2", "pygments==2.13.0",
        "commonmark==0.9.1", "uvicorn==0.20.0", "h11==0.14.0", "beautifulsoup4==4.11.1",
        "soupsieve==2.3.2.post1", "croniter==1.3.8", "python-dateutil==2.8.2",
    ],
    "lightning==2.6.6": [
        "lightning==2.6.6", "torchmetrics==1.9.0", "lightning-utilities==0.15.3",
        "packaging==26.4", "tqdm==4.70.1", "fsspec==2026.9.0", "PyYAML==6.0.4",
        "numpy==2.4.6",
    ],
    "lightning-lite==1.8.0": [
        "lightning-lite==1.8.0", "lightning-utilities==0.3.0", "packaging==21.3",
        "pyparsing==3.0.9", "fsspec==2022.10.0", "numpy==1.23.5", SETUPTOOLS,
    ],
    "lightning-lite==1.8.6": [
        "lightning-lite==1.8.6", "lightning-utilities==0.4.2", "packaging==22.0",
        "fsspec==2022.11.0", "numpy==1.23.5", SETUPTOOLS,
    ],
    "lightning-fabric==1.9.5": [
        "lightning-fabric==1.9.5", "lightning-utilities==0.8.0", "packaging==23.0",
        "fsspec==2023.4.0", "numpy==1.24.2", SETUPTOOLS,
    ],
    "lightning-fabric==2.0.9": [
        "lightning-fabric==2.0.9", "lightning-utilities==0.9.0", "packaging==23.1",
        "fsspec==2023.9.0", "numpy==1.25.2", SETUPTOOLS,
    ],
    "lightning-fabric==2.6.6": [
        "lightning-fabric==2.6.6", "lightning-utilities==0.15.3", "packaging==26.4",
        "fsspec==2026.9.0", "numpy==2.4.6",
    ],
}

# Hugging Face accelerate: one release per code shape of AcceleratedOptimizer.step around the
# 0.27 -> 0.28 change (xm.optimizer_step -> fetch + all_reduce), and the newest.  Its requirements
# plus huggingface_hub's (1.0.1's accelerator.py imports huggingface_hub at import time).
_HUB_2024_02 = ["filelock==3.13.1", "fsspec==2024.2.0", "requests==2.31.0", "tqdm==4.66.2",
                "idna==3.6", "charset-normalizer==3.3.2", "certifi==2024.2.2"]
ACCELERATE_TARGETS = {
    "accelerate==0.27.2": [
        "accelerate==0.27.2", "huggingface-hub==0.20.3", "safetensors==0.4.2", "numpy==1.26.4",
        "packaging==23.2", "psutil==5.9.8", "PyYAML==6.0.1", "urllib3==2.2.0",
    ] + _HUB_2024_02,
    "accelerate==0.28.0": [
        "accelerate==0.28.0", "huggingface-hub==0.21.4", "safetensors==0.4.2", "numpy==1.26.4",
        "packaging==24.0", "psutil==5.9.8", "PyYAML==6.0.1", "urllib3==2.2.1",
    ] + _HUB_2024_02,
    "accelerate==1.0.1": [
        "accelerate==1.0.1", "huggingface-hub==0.26.0", "safetensors==0.4.5", "numpy==2.1.2",
        "packaging==24.1", "psutil==6.1.0", "PyYAML==6.0.2", "filelock==3.16.1", "fsspec==2024.10.0",
        "requests==2.32.3", "tqdm==4.66.5", "urllib3==2.2.3", "idna==3.10", "charset-normalizer==3.4.0",
        "certifi==2024.8.30",
    ],
    "accelerate==1.15.0": [
        "accelerate==1.15.0", "huggingface-hub==2.4.0", "safetensors==0.8.0", "numpy==2.4.6",
        "packaging==26.4", "psutil==7.2.2", "PyYAML==6.0.4", "filelock==4.3.1", "fsspec==2026.9.0",
        "tqdm==4.70.1", "click==8.5.1", "hf-xet==1.8.0", "httpx2==2.16.2", "httpcore2==2.16.2",
        "anyio==4.16.0", "h11==0.16.0", "idna==3.20", "certifi==2026.5.20", "truststore==0.10.5",
    ],
    # the newest: 1.15.0's requirements (torch now >= 2.6.0, the venv's 2.13.0 meets it), so its pins
    "accelerate==1.16.0": [
        "accelerate==1.16.0", "huggingface-hub==2.4.0", "safetensors==0.8.0", "numpy==2.4.6",
        "packaging==26.4", "psutil==7.2.2", "PyYAML==6.0.4", "filelock==4.3.1", "fsspec==2026.9.0",
        "tqdm==4.70.1", "click==8.5.1", "hf-xet==1.8.0", "httpx2==2.16.2", "httpcore2==2.16.2",
        "anyio==4.16.0", "h11==0.16.0", "idna==3.20", "certifi==2026.5.20", "truststore==0.10.5",
    ],
}
TARGETS.update(ACCELERATE_TARGETS)

# Hugging Face optimum-neuron (AWS Trainium): one release per code shape of
# NeuronAcceleratedOptimizer.step (0.0.25-0.0.28 xm.optimizer_step, 0.1-0.2.2 imports inside step(),
# 0.3.0 imports at module level, 0.4.x expert-parallel passes), with the optimum / transformers /
# accelerate its wheel requires and what they import.  The Neuron SDK (torch-neuronx,
# neuronx-distributed) is not on the public index: the tests stand in for it (tests/support/neuron_sdk.py).
_HUB_2025 = ["filelock==3.20.3", "fsspec==2025.9.0", "requests==2.32.5", "tqdm==4.67.1", "urllib3==2.5.0",
             "idna==3.10", "charset-normalizer==3.4.3", "certifi==2025.8.3", "hf-xet==1.1.10",
             "PyYAML==6.0.2", "packaging==25.0", "regex==2025.9.18", "psutil==7.1.0"]
NEURON_TARGETS = {
    "optimum-neuron==0.0.28": [
        "optimum-neuron==0.0.28", "optimum==1.23.3", "transformers==4.48.3", "accelerate==0.29.2",
        "huggingface-hub==0.35.3", "tokenizers==0.21.4", "safetensors==0.6.2", "numpy==1.25.2",
        "protobuf==3.20.3",
    ] + _HUB_2025,
    "optimum-neuron==0.2.2": [
        "optimum-neuron==0.2.2", "optimum==1.23.3", "transformers==4.51.3", "accelerate==0.29.2",
        "huggingface-hub==0.35.3", "tokenizers==0.21.4", "safetensors==0.6.2", "numpy==1.25.2",
        "protobuf==3.20.3",
    ] + _HUB_2025,
    "optimum-neuron==0.3.0": [
        "optimum-neuron==0.3.0", "optimum==1.24.0", "transformers==4.51.3", "accelerate==1.8.1",
        "huggingface-hub==0.35.3", "tokenizers==0.21.4", "safetensors==0.6.2", "numpy==1.25.2",
        "protobuf==3.20.3",
    ] + _HUB_2025,
    "optimum-neuron==0.4.5": [
        "optimum-neuron==0.4.5", "optimum==2.0.0", "transformers==4.57.6", "accelerate==1.8.1",
        "huggingface-hub==0.36.2", "tokenizers==0.22.2", "safetensors==0.8.0", "numpy==2.4.6",
    ] + _HUB_2025,
}
TARGETS.update(NEURON_TARGETS)

# wrapt floor / ceiling, each on top of pytorch-lightning 1.8.6's pins.  The
# wrapt pin lives in the target folder and so shadows the venv's wrapt.
WRAPT_OLDEST = "wrapt==1.14.1"
WRAPT_NEWEST = "wrapt==2.5.2"
for _w in (WRAPT_OLDEST, WRAPT_NEWEST):
    TARGETS["pytorch-lightning==1.8.6+" + _w] = ["pytorch-lightning==1.8.6"] + _PL_1_8_6 + [_w]

# --------------------------------------------------------------------------
# Modules holding the optimizer-step call sites (and the classes that inherit
# them), per target.  The top-level package comes first.  Used by
# ``verify_imports`` and by the test-suite.
# --------------------------------------------------------------------------

_PL_1_0_CORE = ["pytorch_lightning", "pytorch_lightning.core.lightning", "pytorch_lightning.accelerators.tpu_accelerator"]
_PL_1_1_CORE = ["pytorch_lightning", "pytorch_lightning.core.optimizer", "pytorch_lightning.accelerators.tpu_accelerator"]
_PL_ACC_TPU = ["pytorch_lightning", "pytorch_lightning.accelerators.tpu",
               "pytorch_lightning.plugins.precision.tpu_bfloat"]
_PL_PREC_TPU = ["pytorch_lightning", "pytorch_lightning.plugins.precision.tpu",
                "pytorch_lightning.plugins.precision.tpu_bf16"]
_LITE = ["lightning_lite", "lightning_lite.plugins.precision.tpu",
         "lightning_lite.plugins.precision.tpu_bf16", "lightning_lite.wrappers"]
_FABRIC_TPU = ["lightning_fabric", "lightning_fabric.plugins.precision.tpu",
               "lightning_fabric.plugins.precision.tpu_bf16", "lightning_fabric.wrappers"]
_FABRIC_XLA = ["lightning_fabric", "lightning_fabric.plugins.precision.xla",
               "lightning_fabric.strategies.xla_fsdp", "lightning_fabric.wrappers"]

MODULES = {
    "pytorch-lightning==1.0.4": _PL_1_0_CORE,
    "pytorch-lightning==1.0.8": _PL_1_0_CORE,
    "pytorch-lightning==1.1.0": _PL_1_1_CORE,
    "pytorch-lightning==1.1.8": _PL_1_1_CORE,
    "pytorch-lightning==1.2.10": _PL_ACC_TPU,
    "pytorch-lightning==1.3.8": _PL_ACC_TPU,
    "pytorch-lightning==1.4.9": _PL_ACC_TPU,
    "pytorch-lightning==1.5.10": _PL_PREC_TPU + ["pytorch_lightning.lite.wrappers"],
    "pytorch-lightning==1.6.5": _PL_PREC_TPU + ["pytorch_lightning.lite.wrappers"],
    "pytorch-lightning==1.7.7": _PL_PREC_TPU + ["pytorch_lightning.lite.wrappers"],
    "pytorch-lightning==1.8.0": _PL_PREC_TPU + _LITE,
    "pytorch-lightning==1.8.6": _PL_PREC_TPU + _LITE,
    "pytorch-lightning==1.9.0": _PL_PREC_TPU + _FABRIC_TPU,
    "pytorch-lightning==1.9.5": _PL_PREC_TPU + _FABRIC_TPU,
    "pytorch-lightning==2.0.9": _PL_PREC_TPU + _FABRIC_TPU,
    "pytorch-lightning==2.6.6": [
        "pytorch_lightning", "pytorch_lightning.plugins.precision.xla",
        # graveyard alias, resolves to pytorch_lightning._graveyard.tpu
        "pytorch_lightning.plugins.precision.tpu",
    ] + _FABRIC_XLA,
    "lightning==1.8.6": [
        "lightning", "lightning.pytorch", "lightning.pytorch.plugins.precision.tpu",
        "lightning.pytorch.plugins.precision.tpu_bf16", "lightning.lite",
        "lightning.lite.plugins.precision.tpu", "lightning.lite.plugins.precision.tpu_bf16",
        "lightning.lite.wrappers",
    ],
    "lightning==2.6.6": [
        "lightning", "lightning.pytorch", "lightning.pytorch.plugins.precision.xla",
        "lightning.fabric", "lightning.fabric.plugins.precision.xla",
        "lightning.fabric.strategies.xla_fsdp", "lightning.fabric.wrappers",
    ],
    "lightning-lite==1.8.0": _LITE,
    "lightning-lite==1.8.6": _LITE,
    "lightning-fabric==1.9.5": _FABRIC_TPU,
    "lightning-fabric==2.0.9": _FABRIC_TPU,
    "lightning-fabric==2.6.6": _FABRIC_XLA,
}
for _n in ACCELERATE_TARGETS:
    MODULES[_n] = ["accelerate", "accelerate.optimizer", "accelerate.accelerator", "huggingface_hub"]
for _n in NEURON_TARGETS:
    # optimum.neuron needs the Neuron SDK to import (0.3.0's __init__ imports neuronx_distributed;
    # the tests load its optimizer module with stand-ins): what imports on a CPU machine is checked here.
    MODULES[_n] = ["accelerate", "accelerate.optimizer", "transformers"]
for _w in (WRAPT_OLDEST, WRAPT_NEWEST):
    MODULES["pytorch-lightning==1.8.6+" + _w] = ["wrapt"] + MODULES["pytorch-lightning==1.8.6"]

assert list(MODULES) == [n for n in TARGETS if n in MODULES] and set(MODULES) == set(TARGETS)

# --------------------------------------------------------------------------
# How to smoke-train each target on CPU (``train`` subcommand).
#   trainer-old: PL 1.2-1.4 Trainer args; trainer: PL >= 1.5 Trainer args;
#   lite / fabric: a 2-step manual loop.  Value: (kind, import line).
# --------------------------------------------------------------------------

TRAIN = {}
for _n in TARGETS:
    _dist, _, _ver = _n.split("+")[0].partition("==")
    if _dist == "pytorch-lightning":
        TRAIN[_n] = ("trainer-old" if _ver.startswith(("1.0.", "1.1.", "1.2.", "1.3.", "1.4.")) else "trainer",
                     "import pytorch_lightning as pl")
    elif _dist == "lightning":
        TRAIN[_n] = ("trainer", "import lightning.pytorch as pl")
    elif _dist == "lightning-lite":
        TRAIN[_n] = ("lite", "from lightning_lite import LightningLite")
    elif _dist == "lightning-fabric":
        TRAIN[_n] = ("fabric", "from lightning_fabric import Fabric")
    elif _dist == "accelerate":
        TRAIN[_n] = ("accelerate", "from accelerate import Accelerator")


class TargetError(RuntimeError):
    """A target could not be installed, imported or trained.  ``stderr`` holds
    the failing subprocess's (pip's, or the import check's) standard error."""

    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(message)
        self.stderr = stderr


def slug(name: str) -> str:
    """Folder name for a target: ``pytorch-lightning==1.8.6+wrapt==1.14.1`` ->
    ``pytorch-lightning-1.8.6+wrapt-1.14.1``."""
    return re.sub(r"[^A-Za-z0-9.+_-]+", "-", name)


def target_dir(name: str, root: Optional[os.PathLike] = None) -> Path:
    _check_name(name)
    return Path(root if root is not None else DEFAULT_ROOT).resolve() / slug(name)


def _check_name(name: str) -> None:
    if name not in TARGETS:
        raise KeyError("unknown target %r; known: %s" % (name, ", ".join(TARGETS)))


def _python() -> str:
    """The base venv's interpreter (the one running this script, unless
    TPU_TARGETS_PYTHON says otherwise)."""
    return os.environ.get("TPU_TARGETS_PYTHON") or sys.executable


def requirements_hash(name: str) -> str:
    payload = json.dumps({"format": STAMP_FORMAT, "reqs": TARGETS[name],
                          "python": "%d.%d" % sys.version_info[:2]}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def is_installed(name: str, root: Optional[os.PathLike] = None) -> bool:
    stamp = target_dir(name, root) / STAMP_NAME
    try:
        return json.loads(stamp.read_text()).get("hash") == requirements_hash(name)
    except (OSError, ValueError):
        return False


def target_env(path: os.PathLike) -> Dict[str, str]:
    """Environment for running the base venv's Python with a target on top."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(path)
    env["PYTHONNOUSERSITE"] = "1"
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def _run(cmd: List[str], env: Optional[Dict[str, str]] = None, timeout: float = 1800):
    return subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=timeout)


_VERIFY = textwrap.dedent(r"""
    import importlib, json, os, sys
    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover
        import importlib_metadata as metadata
    target = os.path.realpath(sys.argv[1])
    modules = json.loads(sys.argv[2])
    reqs = json.loads(sys.argv[3])
    problems = []
    for mod in modules:
        m = importlib.import_module(mod)
        f = os.path.realpath(getattr(m, "__file__", None) or "")
        if not f.startswith(target + os.sep):
            problems.append("%s loaded from %s, not from the target" % (mod, f))
    for req in reqs:
        dist, _, want = req.partition("==")
        got = metadata.version(dist)
        if got != want:
            problems.append("%s: wanted %s, found %s" % (dist, want, got))
    try:
        import torch_xla  # noqa: F401
        problems.append("torch_xla is importable")
    except ImportError:
        pass
    if problems:
        sys.exit("\n".join(problems))
    print("ok")
""")


def verify_imports(name: str, path: os.PathLike, write_bytecode: bool = False) -> None:
    """Import the target's call-site modules with ``PYTHONPATH=path``, check they
    load from the target, and that each pinned distribution resolves to the pinned
    version (so the target's copies shadow the venv's).  Raises TargetError.

    ``write_bytecode``: the check's interpreter (the one that runs the tests) writes the compiled file of
    every module it imports, as Python does without PYTHONDONTWRITEBYTECODE. That machine setting would
    have every test child compile the target from source again (about 2 CPU-s per Lightning import);
    compiling the whole folder instead (``compileall``) costs 3-15 CPU-s per target, mostly for modules
    no test imports (tensorboard's, transformers' model zoo). The top-level package imported here pulls
    in nearly all that a test child imports; a module imported later is compiled by each child, as
    before. The files record their source's time and size, which the rename into place keeps, and
    Python names the final path in their code at load."""
    cmd = [_python(), "-c", _VERIFY, str(path), json.dumps(MODULES[name]),
           json.dumps(TARGETS[name])]
    env = target_env(path)
    if write_bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    proc = _run(cmd, env=env, timeout=600)
    if proc.returncode != 0:
        raise TargetError("target %s does not import (exit %d):\n%s%s"
                          % (name, proc.returncode, proc.stdout, proc.stderr),
                          proc.stderr)


def wheel_dir() -> Path:
    return Path(os.environ.get("TPU_CLOSURE_FIX_WHEELS") or DEFAULT_WHEELS).resolve()


def _fetch_stamp(name: str) -> Path:
    return wheel_dir() / ".fetched" / (slug(name) + ".json")


def is_fetched(name: str) -> bool:
    try:
        return json.loads(_fetch_stamp(name).read_text()).get("hash") == requirements_hash(name)
    except (OSError, ValueError):
        return False


def fetch(name: str, force: bool = False) -> Path:
    """Put a wheel for every pinned requirement of ``name`` into the wheel cache
    and return the cache folder.

    Runs ``pip wheel --no-deps`` into a private temporary folder, then moves each
    wheel into the cache with an atomic rename, so parallel fetches of targets
    sharing a wheel (numpy, tensorboard...) never expose a half-written file.  A
    stamp per target makes a second fetch a no-op.  Raises TargetError with
    pip's stderr when a requirement cannot be fetched."""
    _check_name(name)
    wheels = wheel_dir()
    if not force and is_fetched(name):
        return wheels
    (wheels / ".fetched").mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".fetch-" + slug(name) + "-", dir=str(wheels)))
    try:
        cmd = [_python(), "-m", "pip", "wheel", "--no-deps", "--no-input", "--no-cache-dir",
               "--disable-pip-version-check", "--wheel-dir", str(tmp)] + list(TARGETS[name])
        proc = retry_once(lambda: _run(cmd), "fetching the wheels of target %s" % name)
        if proc.returncode != 0:
            raise TargetError("pip could not fetch the wheels of target %s (exit %d): %s\n%s"
                              % (name, proc.returncode, " ".join(cmd), proc.stderr),
                              proc.stderr)
        for wheel in tmp.iterdir():
            os.replace(str(wheel), str(wheels / wheel.name))
    finally:
        shutil.rmtree(str(tmp), ignore_errors=True)
    stamp = {"target": name, "hash": requirements_hash(name), "requirements": TARGETS[name]}
    _fetch_stamp(name).write_text(json.dumps(stamp, indent=1) + "\n")
    return wheels


def remove(name: str, root: Optional[os.PathLike] = None) -> bool:
    """Delete target ``name``'s folder (its wheels stay cached); True if it existed."""
    dest = target_dir(name, root)
    if not dest.exists():
        return False
    shutil.rmtree(str(dest))
    return True


def install(name: str, root: Optional[os.PathLike] = None, force: bool = False, byte_compile: bool = True) -> Path:
    """Install target ``name`` into ``<root>/<slug>`` and return that folder (what the import check
    imports byte-compiled, unless ``byte_compile`` is false: for a folder one interpreter imports once).

    Skips the install when the folder's stamp matches the requirement list
    (unless ``force``).  Fetches the wheels first (``fetch``), then installs
    them offline (``--no-index``) from the wheel cache into a temporary sibling folder first and
    renames it into place, so a failed or concurrent install never leaves a
    half-populated target behind.  Raises TargetError on pip failure (with pip's
    stderr) or when the installed target does not import."""
    dest = target_dir(name, root)
    if not force and is_installed(name, root):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".tmp-", dir=str(dest.parent)))
    try:
        wheels = fetch(name)
        cmd = [_python(), "-m", "pip", "install", "--no-deps", "--no-input", "--no-cache-dir",
               "--disable-pip-version-check", "--no-warn-script-location", "--no-compile",
               "--no-index", "--find-links", str(wheels),
               "--target", str(tmp)] + list(TARGETS[name])
        proc = _run(cmd)
        if proc.returncode != 0:
            raise TargetError("pip failed for target %s (exit %d): %s\n%s"
                              % (name, proc.returncode, " ".join(cmd), proc.stderr),
                              proc.stderr)
        verify_imports(name, tmp, write_bytecode=byte_compile)
        stamp = {"target": name, "hash": requirements_hash(name), "requirements": TARGETS[name]}
        (tmp / STAMP_NAME).write_text(json.dumps(stamp, indent=1) + "\n")
        if dest.exists():
            if not force and is_installed(name, root):
                return dest  # a concurrent install finished first
            old = Path(tempfile.mkdtemp(prefix=dest.name + ".old-", dir=str(dest.parent)))
            os.rename(str(dest), str(old / "x"))
            shutil.rmtree(str(old), ignore_errors=True)
        try:
            os.rename(str(tmp), str(dest))
        except OSError:
            if is_installed(name, root):
                return dest  # a concurrent install finished first
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(str(tmp), ignore_errors=True)
    return dest


# --------------------------------------------------------------------------
# CPU smoke training
# --------------------------------------------------------------------------

_TRAIN_COMMON = r"""
import warnings; warnings.filterwarnings("ignore")
import torch
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
data = TensorDataset(torch.randn(4, 3), torch.randn(4, 1))
"""

_TRAIN_PL = r"""
class M(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.steps = 0
    def training_step(self, batch, batch_idx):
        self.steps += 1
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
    def train_dataloader(self):
        return DataLoader(data, batch_size=2)
m = M()
before = m.layer.weight.detach().clone()
trainer = pl.Trainer(**KW)
trainer.fit(m)
assert trainer.global_step == 2, trainer.global_step
assert m.steps == 2, m.steps
assert not torch.equal(before, m.layer.weight.detach()), "weights did not change"
print("trained", pl.__version__, trainer.global_step)
"""

_TRAIN_KW = {
    "trainer-old": 'KW = dict(max_steps=2, gpus=None, logger=False, checkpoint_callback=False, '
                   'progress_bar_refresh_rate=0, weights_summary=None)',
    "trainer": 'KW = dict(max_steps=2, accelerator="cpu", devices=1, logger=False, '
               'enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)',
}

_TRAIN_LOOP = r"""
def loop(runner, model, opt):
    before = model.weight.detach().clone()
    for i, (x, y) in enumerate(DataLoader(data, batch_size=2)):
        x, y = x.to(runner.device), y.to(runner.device)
        if i == 0:   # plain backward + step
            opt.zero_grad()
            runner.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
        else:        # step with a closure (the path the patch targets)
            def closure():
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                runner.backward(loss)
                return loss
            opt.step(closure)
    assert i == 1
    assert not torch.equal(before, model.weight.detach()), "weights did not change"
"""

_TRAIN_LITE = r"""
class L(LightningLite):
    def run(self):
        model = torch.nn.Linear(3, 1)
        model, opt = self.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        loop(self, model, opt)
L(accelerator="cpu", devices=1).run()
print("trained lite")
"""

_TRAIN_ACCELERATE = r"""
accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(3, 1)
model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
loop(accelerator, model, opt)
print("trained accelerate")
"""

_TRAIN_FABRIC = r"""
fabric = Fabric(accelerator="cpu", devices=1)
model = torch.nn.Linear(3, 1)
model, opt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
loop(fabric, model, opt)
print("trained fabric")
"""


def train_script(name: str) -> str:
    kind, imp = TRAIN[name]
    src = imp + "\n" + _TRAIN_COMMON
    if kind in _TRAIN_KW:
        return src + _TRAIN_KW[kind] + "\n" + _TRAIN_PL
    return src + _TRAIN_LOOP + {"lite": _TRAIN_LITE, "fabric": _TRAIN_FABRIC, "accelerate": _TRAIN_ACCELERATE}[kind]


def train(name: str, root: Optional[os.PathLike] = None) -> str:
    """Fit a 1-layer model for 2 steps on CPU with the installed target; returns
    the script's stdout, raises TargetError on failure."""
    path = target_dir(name, root)
    if name not in TRAIN:
        raise TargetError("target %s has no CPU smoke-train: it trains only with the Neuron SDK (its tests "
                          "run its optimizer on stand-ins: tests/target/test_optimum_neuron.py)" % name)
    if not is_installed(name, root):
        raise TargetError("target %s is not installed under %s" % (name, path.parent))
    with tempfile.TemporaryDirectory() as cwd:  # keep lightning_logs etc. out of the repo
        proc = subprocess.run([_python(), "-c", train_script(name)], env=target_env(path),
                              cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=600)
    if proc.returncode != 0:
        raise TargetError("target %s does not train (exit %d):\n%s%s"
                          % (name, proc.returncode, proc.stdout, proc.stderr),
                          proc.stderr)
    return proc.stdout.strip()


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------

def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd")
    sub.required = True
    sub.add_parser("list", help="print target names")
    for cmd in ("install", "train"):
        sp = sub.add_parser(cmd, help="%s targets (all if none named)" % cmd)
        sp.add_argument("names", nargs="*", metavar="NAME")
        sp.add_argument("--root", default=str(DEFAULT_ROOT))
        sp.add_argument("--keep-going", action="store_true",
                        help="try every target, then fail if any failed")
        if cmd == "install":
            sp.add_argument("--force", action="store_true", help="ignore stamps")
    sp = sub.add_parser("fetch", help="fetch targets' wheels into the wheel cache (all if none named)")
    sp.add_argument("names", nargs="*", metavar="NAME")
    sp.add_argument("--keep-going", action="store_true", help="try every target, then fail if any failed")
    sp.add_argument("--force", action="store_true", help="ignore stamps")
    sp = sub.add_parser("remove", help="delete targets' folders; their wheels stay cached (all if none named)")
    sp.add_argument("names", nargs="*", metavar="NAME")
    sp.add_argument("--root", default=str(DEFAULT_ROOT))
    sp = sub.add_parser("path", help="print a target's folder")
    sp.add_argument("name", metavar="NAME")
    sp.add_argument("--root", default=str(DEFAULT_ROOT))
    args = p.parse_args(argv)

    if args.cmd == "list":
        for n in TARGETS:
            print(n)
        return 0
    try:
        if args.cmd == "path":
            print(target_dir(args.name, args.root))
            return 0
        for n in args.names:
            _check_name(n)
    except KeyError as e:
        print("error: %s" % e.args[0], file=sys.stderr)
        return 2

    if args.cmd == "remove":
        for n in args.names or list(TARGETS):
            print("%s: %s" % (n, "removed" if remove(n, args.root) else "not installed"), flush=True)
        return 0
    failed = []
    for n in args.names or list(TARGETS):
        try:
            if args.cmd == "fetch":
                print("%s -> %s" % (n, fetch(n, force=args.force)), flush=True)
            elif args.cmd == "install":
                print("%s -> %s" % (n, install(n, args.root, force=args.force)), flush=True)
            else:
                print("%s: %s" % (n, train(n, args.root)), flush=True)
        except (TargetError, subprocess.TimeoutExpired) as e:
            print("error: %s" % e, file=sys.stderr, flush=True)
            failed.append(n)
            if not args.keep_going:
                return 1
    if failed:
        print("failed: %s" % ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Issue #5: ``tpu-closure-fix demo`` in its smoke configuration (1 epoch of 6 steps, 2 replicas).

Runs ``python -m tpu_closure_fix.integrations.lightning.demo --smoke`` against the target's pytorch-lightning (1.5-1.8; the demo
is made with 1.8.6) with the demo's dependencies on PYTHONPATH: ``$TPU_CLOSURE_FIX_DEMO_DEPS`` or
``.cache/demo-deps`` (installed by ``scripts/demo.sh``; see scripts/demo-requirements.txt). Checks the
PNG, the TensorBoard event files, and that the replicas diverge without the shim and are bitwise
identical with it.
"""
import json
import os
import subprocess
import sys

import pytest
from packaging.version import Version

from conftest import REPO, TARGET, child_env
from support import expectations

DIST, VERSION = expectations.parse_target(TARGET)
DEPS = os.environ.get("TPU_CLOSURE_FIX_DEMO_DEPS") or os.path.join(REPO, ".cache", "demo-deps")

pytestmark = pytest.mark.skipif(
    not (DIST == "pytorch-lightning" and Version("1.5") <= VERSION < Version("1.9")),
    reason="the demo runs an affected pytorch-lightning Trainer with TPUPrecisionPlugin (1.5-1.8)")


def _env():
    env = child_env(True)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], DEPS])
    return env


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    probe = subprocess.run([sys.executable, "-c", "import matplotlib, sklearn, tensorboardX, tqdm"], env=_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    if probe.returncode != 0:
        pytest.skip("the demo's dependencies are not installed (bash scripts/demo.sh --help installs them "
                    "into .cache/demo-deps): %s" % probe.stdout.strip().splitlines()[-1])
    out = tmp_path_factory.mktemp("demo")
    proc = subprocess.run([sys.executable, "-m", "tpu_closure_fix.integrations.lightning.demo", "--smoke", "--no-progress",
                           "--synccheck-every", "3", "--out", str(out)],
                          env=_env(), cwd=str(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    with open(str(out / "results.json")) as handle:
        return out, proc.stdout, json.load(handle)


def test_writes_the_png(demo):
    out, _, _ = demo
    with open(str(out / "demo.png"), "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(str(out / "demo.png")) > 10000


def test_writes_tensorboard_scalars(demo):
    out, _, _ = demo
    for run in ("shim_off", "shim_on"):
        files = os.listdir(str(out / "tensorboard" / run))
        assert any(f.startswith("events.out.tfevents") for f in files), files


def test_diverges_without_the_shim_and_not_with_it(demo):
    _, stdout, results = demo
    off, on = results["shim off"], results["shim on"]
    assert off["shim"] is False and on["shim"] is True
    assert off["steps"] == on["steps"] == 6
    assert off["max_divergence"] > 0 == on["max_divergence"]
    assert all(d == 0 for d in on["divergence"]) and off["divergence"][-1] > 0
    accuracies = {r["accuracy"] for r in on["replicas"].values()}
    assert len(accuracies) == 1, "with the shim every replica holds the same model"
    # the callback checks at the start (identical: the replicas start alike), after step 1 and every 3 steps
    assert off["synccheck"] == {"checks": 4, "warned_steps": [1, 3, 6]}
    assert on["synccheck"] == {"checks": 4, "warned_steps": []}
    assert "final loss" in stdout and "test accuracy" in stdout and "bitwise identical" in stdout

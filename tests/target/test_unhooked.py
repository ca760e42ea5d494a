"""Lightning imported without the shim's import hook firing: status() never says "patched" falsely.

Two causes, each in a fresh interpreter against the real pytorch-lightning 1.8.6 (support/unhooked.py):
a meta-path finder ahead of wrapt's that returns Lightning's specs itself, and a wrapt whose
``register_post_import_hook`` raises. Expected: ``status()`` notices the unhooked call-site modules,
patches them then and warns once naming the cause; every ``patched`` record's class really resolves
the method to the shim's wrapper; the next Trainer step runs the fixed order. Twin: under
``TPU_CLOSURE_FIX=0`` the same import reports every affected site ``disabled`` and the buggy order runs.
"""
import json
import subprocess
import sys

import pytest

from conftest import TESTS, child_env

FIXED = ["forward", "backward", "reduce_gradients", "mark_step"]
BUGGY = ["reduce_gradients", "forward", "backward"]


def run(cause, shim):
    proc = subprocess.run([sys.executable, "-m", "support.unhooked", cause], env=child_env(shim),
                          capture_output=True, text=True, timeout=300, cwd=TESTS)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("cause", ["finder", "register"])
def test_unhooked_import_is_noticed_patched_and_reported_truthfully(cause):
    out = run(cause, shim=True)
    patched = [r for r in out["status"] if r["verdict"] == "patched"]
    assert patched, out["status"]
    assert all(out["patched_really"].values()), out["patched_really"]
    assert not [r for r in out["status"] if r["verdict"] in ("skipped", "failed", "disabled")], out["status"]
    late = [w for w in out["warnings"] if "without its import hook running" in w]
    assert len(late) >= 1 and all("patched it late" in w for w in late), out["warnings"]
    assert len(late) == len(set(late)), out["warnings"]  # once per module
    assert out["events"] == FIXED, out["events"]


@pytest.mark.parametrize("cause", ["finder", "register"])
def test_unhooked_import_twin_disabled(cause):
    out = run(cause, shim=False)
    affected = [r for r in out["status"] if r["variant"] and not r["variant"].startswith("torch_xla")]
    assert affected and {r["verdict"] for r in out["status"]
                         if r["verdict"] not in ("not in this release", "fixed upstream", "not imported yet")} \
        == {"disabled"}
    assert not out["patched_really"]
    assert out["events"] == BUGGY, out["events"]

"""Issue #4: ``tpu-closure-fix check`` against the installed release: protected with the shim, and the
twin under TPU_CLOSURE_FIX=0 is reported unprotected with failing self-tests (exit 1).

The graph part needs torch_xla (tests/xla and scripts/main.sh cover it); here ``--no-graph``.
"""
import json
import subprocess
import sys

from conftest import TESTS, child_env


def check(shim):
    proc = subprocess.run([sys.executable, "-m", "tpu_closure_fix", "check", "--no-graph", "--json"],
                          env=child_env(shim), capture_output=True, text=True, timeout=600, cwd=TESTS)
    return proc.returncode, json.loads(proc.stdout)


def test_check_with_the_shim_is_protected():
    code, out = check(True)
    assert code == 0 and out["ok"] is True, out["verdict"]
    assert out["verdict"].startswith("PROTECTED")
    assert out["event_check"] and all(e["ok"] for e in out["event_check"]), out["event_check"]
    for e in out["event_check"]:
        assert "reduce_gradients" in e["events"] and e["events"].index("backward") < e["events"].index(
            "reduce_gradients") < e["events"].index("step")


def test_check_without_the_shim_twin():
    code, out = check(False)
    assert code == 1 and out["ok"] is False and out["verdict"].startswith("UNPROTECTED")
    patched_sites = [e for e in out["event_check"] if e["verdict"] == "disabled"]
    assert patched_sites and not any(e["ok"] for e in patched_sites), out["event_check"]
    assert all(e["events"][0] == "reduce_gradients(no grads)" for e in patched_sites), out["event_check"]

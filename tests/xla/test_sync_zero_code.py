"""The zero-code SyncCheck on real torch_xla: a plain ``xm.optimizer_step`` loop, no SyncCheck in the code.

Two processes, one XLA device each (``PJRT_DEVICE=CPU``), joined by gloo only: torch_xla sees a world
of 1, so ``xm.optimizer_step``'s reduction reduces nothing and replicas with different data train
different models -- with the shim off or on. ``TPU_CLOSURE_FIX_SYNC_CHECK=10`` under
``TPU_CLOSURE_FIX=0`` must say so at steps 1 and 10, identical before the first step (the comparison goes over gloo: the fingerprint vector of
XLA tensors is copied to the host); its twins: the same data on both replicas (in sync: checked,
silent) and the variable unset (nothing checked, the check's module not imported).
"""
import os
import sys

import pytest

from xla_tier import REPO, TESTS, TIMEOUT, XLA_PY, defined_where, xla_env

if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from support import ranks  # noqa: E402

STEPS = 12
EVERY = 10


def run(tmp_path, scenarios, **variables):
    """Both ranks' results (one per scenario), the ranks on real torch_xla (``XLA_PY``) and the shim off."""
    env = xla_env(dict(variables, PJRT_DEVICE="CPU", TPU_CLOSURE_FIX="0"),
                  drop=("PJRT_DEVICE", "CPU_NUM_DEVICES", "TPU_CLOSURE_FIX", "PYTHONPATH",
                        "TPU_CLOSURE_FIX_SYNC_CHECK", "TPU_CLOSURE_FIX_SYNC_CHECK_ON_DIVERGENCE"))
    env["PYTHONPATH"] = os.pathsep.join([REPO, TESTS])
    results = ranks.run_replicas("support.zero_code", scenarios, 2, tmp_path, env, TIMEOUT, python=XLA_PY)
    return [results[rank]["runs"] for rank in sorted(results)]


@pytest.fixture(scope="module")
def armed(tmp_path_factory):
    scenarios = [{"api": "xla-real", "steps": STEPS}, {"api": "xla-real", "steps": STEPS, "same_data": True}]
    return run(tmp_path_factory.mktemp("armed"), scenarios, TPU_CLOSURE_FIX_SYNC_CHECK=str(EVERY))


@defined_where(bool(XLA_PY))
def test_different_data_warns_at_step_1_at_the_loops_line(armed):
    """Checks run at the first step and every EVERY-th; rank 0 says the divergence once (the check at step EVERY
    finds the same tensors different on the same ranks: not said again)."""
    for rank, (diverging, _) in enumerate(armed):
        assert diverging["steps"] == STEPS and not diverging["shim"], diverging
        report = diverging["zero_code"]["last_report"]
        assert report["outcome"] == "differ" and report["backend"] == "torch.distributed", report
        assert report["step"] == EVERY
        assert len(diverging["warnings"]) == (1 if rank == 0 else 0), diverging["warnings"]
        for step, warning in zip((1,), diverging["warnings"]):
            assert " step %d" % step in warning["message"] and "across 2 replicas" in warning["message"], warning
            assert warning["filename"] == os.path.join(TESTS, "support", "zero_code.py")


@defined_where(bool(XLA_PY))
def test_same_data_is_checked_and_silent(armed):
    for _, in_sync in armed:
        assert in_sync["steps"] == STEPS and in_sync["warnings"] == [], in_sync
        # the process's count: 3 checks (before step 1, after steps 1 and 10) of the diverging run before, 3 of this one
        assert in_sync["zero_code"]["checks"] == 6 and in_sync["zero_code"]["last_report"]["outcome"] == "identical"


@defined_where(bool(XLA_PY))
def test_unset_nothing_is_checked_or_imported(tmp_path):
    for (diverging,) in run(tmp_path, [{"api": "xla-real", "steps": STEPS}]):
        assert diverging["steps"] == STEPS and diverging["warnings"] == [], diverging
        assert diverging["zero_code"] == {"loaded": False, "armed_every": 0, "checks": 0, "last_report": None}

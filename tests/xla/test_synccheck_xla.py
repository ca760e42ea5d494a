"""SyncCheck on real torch_xla (2.1 and 2.9 tiers, CPU PJRT, 2 replicas as threads, no process group): the
fingerprint's XLA lowering is bitwise the CPU fingerprint, and one ``compare_replicas`` goes over the check's
own host channel (TCPStore + gloo), never through an XLA collective (tests/support/synccheck_xla.py makes
torch_xla's ``all_reduce`` and ``all_gather`` record and raise): it reports the replicas identical.
"""
import os
import sys

import pytest

from xla_tier import REPO, TESTS, TIMEOUT, TORCH_XLA, XLA_PY, defined_where, unavailable, xla_env

if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from tpu_closure_fix.synccheck import fingerprint
from tpu_closure_fix.verify.child import run_child

AVAILABLE = TORCH_XLA is not None


@defined_where(not AVAILABLE)
def test_xla_environment_is_available():
    unavailable()


@pytest.fixture(scope="module")
def replicas():
    env = xla_env({"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"},  # the check's channel: handed over by xmp
                  drop=("PJRT_DEVICE", "CPU_NUM_DEVICES", "TPU_CLOSURE_FIX", "PYTHONPATH", "MASTER_ADDR",
                        "MASTER_PORT", "TPU_CLOSURE_FIX_SYNC_CHECK_CHANNEL"))
    env["PYTHONPATH"] = os.pathsep.join([REPO, TESTS])
    run = run_child([XLA_PY, "-m", "support.synccheck_xla"], TIMEOUT, env=env, cwd=TESTS)
    assert run.payload is not None, "%s\n%s" % (run.error, run.stderr_tail())
    assert sorted(run.payload) == ["0", "1"], run.payload
    for ordinal, result in run.payload.items():
        assert "error" not in result, (ordinal, result.get("error"))
    return run.payload


@defined_where(AVAILABLE)
def test_the_xla_fingerprint_is_bitwise_the_cpu_fingerprint(replicas):
    for ordinal, result in replicas.items():
        found = result["fingerprint"]
        assert found["length"] == found["expected_length"] == fingerprint.vector_length()
        assert found["bit_hashes_xla"] == found["bit_hashes_cpu"], ordinal
        assert found["exact_equal"], (ordinal, found["exact_differing"])
        assert found["floats_close"], ordinal


@defined_where(AVAILABLE)
def test_one_check_goes_over_the_host_and_issues_no_xla_collective(replicas):
    for ordinal, result in replicas.items():
        check = result["check"]
        assert check["xla_collectives"] == [], (ordinal, check)
        report = check["report"]
        assert report["backend"] == "xla host" and report["world_size"] == 2 and report["step"] == 7, report
        assert report["outcome"] == "identical" and not report["diverged"], (ordinal, report)

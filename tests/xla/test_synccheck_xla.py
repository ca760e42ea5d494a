"""SyncCheck on real torch_xla (2.1 and 2.9 tiers, CPU PJRT, 2 replicas as threads): the fingerprint's XLA
lowering is bitwise the CPU fingerprint, and one check traces exactly one all-reduce (MAX) of the whole
fingerprint vector. Collectives cannot execute on CPU, so the check is traced and stopped at
torch_xla's ``all_reduce`` (tests/support/synccheck_xla.py): stopped there it reports "unverified"
instead of crashing, which is what a failing collective gives a user too.
"""
import os

import pytest

from xla_tier import REPO, TESTS, TIMEOUT, TORCH_XLA, XLA_PY, defined_where, unavailable, xla_env
from tpu_closure_fix.synccheck import fingerprint
from tpu_closure_fix.verify.child import run_child

AVAILABLE = TORCH_XLA is not None


@defined_where(not AVAILABLE)
def test_xla_environment_is_available():
    unavailable()


@pytest.fixture(scope="module")
def replicas():
    env = xla_env({"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"})
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
def test_one_check_is_one_max_all_reduce_of_the_whole_vector(replicas):
    for ordinal, result in replicas.items():
        check = result["check"]
        assert check["reduce_type"] == "max"
        assert check["input_shapes"] == [[fingerprint.vector_length()]]
        assert check["ir_all_reduces"] == 1 and check["hlo_all_reduces"] == 1, check["hlo_all_reduce_lines"]
        assert "MaxComputation" in check["hlo_all_reduce_lines"][0]


@defined_where(AVAILABLE)
def test_a_failed_collective_gives_unverified_not_a_crash(replicas):
    for ordinal, result in replicas.items():
        report = result["check"]["report"]
        assert report["backend"] == "xla" and report["world_size"] == 2 and report["step"] == 7
        assert report["outcome"] == "unverified" and not report["diverged"]
        assert "CollectiveNotExecuted" in report["reason"]

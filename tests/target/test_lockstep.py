"""The LBFGS lockstep rule, end to end, on 2 replicas whose shards make LBFGS stop at different points.

support.lockstep_replica runs the same LBFGS problem through the target's
framework (lightning-fabric's XLAPrecision, or accelerate's
AcceleratedOptimizer; only torch_xla is stood in). Replica 0's loss and
replica 1's (ten times steeper, another minimum) make LBFGS's
``tolerance_change`` test decide differently on each replica when each sees
its local loss.

With the shim (rule on): both replicas finish -- within the harness's hard
timeout --, evaluate the closure equally often, end bitwise identical and
equal to the plain-PyTorch reference. The twin, with the rule switched off in
the replica processes (gradients still reduced per evaluation): the
replicas' evaluation counts differ, and the replica that went on recorded
the failure of its partnerless all-reduce -- on a TPU it would wait forever.
"""
import pytest

from conftest import REPLICAS, TIMEOUT, child_env
from support import ranks

SCENARIO = {"name": "lbfgs-lockstep"}


def run(lockstep, tmp_path):
    """rank -> result of the two replicas, the shim on, the lockstep rule on or switched off."""
    return ranks.run_replicas("support.lockstep_replica", [dict(SCENARIO, lockstep=lockstep)], REPLICAS, tmp_path,
                              child_env(True), TIMEOUT)


@pytest.fixture(scope="module")
def lockstep_on(tmp_path_factory):
    return run(True, tmp_path_factory.mktemp("on"))


@pytest.fixture(scope="module")
def lockstep_off(tmp_path_factory):
    return run(False, tmp_path_factory.mktemp("off"))


def test_with_the_rule_replicas_stay_in_lockstep(lockstep_on):
    rank0, rank1 = lockstep_on[0], lockstep_on[1]
    assert rank0["shim"] and rank1["shim"]
    assert rank0["error"] is None and rank1["error"] is None
    assert rank0["evaluations"] == rank1["evaluations"] == rank0["reference"]["evaluations"]
    assert rank0["w"] == rank1["w"] == rank0["reference"]["w"]


def test_without_the_rule_replicas_leave_lockstep(lockstep_off):
    """The twin: same shim, same reduced gradients, local losses: the evaluation counts differ."""
    rank0, rank1 = lockstep_off[0], lockstep_off[1]
    assert rank0["shim"] and rank1["shim"]
    assert rank0["evaluations"] != rank1["evaluations"]
    further, stopped = (rank0, rank1) if rank0["evaluations"] > rank1["evaluations"] else (rank1, rank0)
    assert stopped["error"] is None
    assert further["error"] is not None, "the replica that went on completed an all-reduce without a partner"
    assert rank0["w"] != rank1["w"]

"""What a SyncCheck check costs on real torch_xla (2.9 tier), in torch_xla's own metrics: one fused graph.

Two processes, one XLA device each (``PJRT_DEVICE=CPU``), joined by gloo: ``check_sync`` builds the
fingerprint vector lazily on the XLA device and copies it to the host once (tests/support/synccheck_xla_cost.py).
A 30-step MLP checked every 5 steps (7 checks) against its twin without checks: the first check adds at most
2 compilations (CompileTime) and every later check none, with at most 2 graph executions (ExecuteTime) per
check, and the training's own graph is compiled and executed as often as without checks.

Before the check was one graph (view(dtype) ran on the host per tensor, a lazy key table stayed pending
into the training's next graph) the same run cost 8 compilations and 93 executions against 1 and 30.
"""
import os
import sys

import pytest

from xla_tier import REPO, TESTS, TIMEOUT, TORCH_XLA, XLA_PY, defined_where, xla_env

if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from support import ports  # noqa: E402
from tpu_closure_fix.verify.child import run_children  # noqa: E402

#: The tier measured: the compile and execute counts are torch_xla's, and the graph they count is 2.9's.
ON_TIER = TORCH_XLA is not None and TORCH_XLA.split(".")[:2] == ["2", "9"]
STEPS = 30
EVERY = 5
CHECKS = 1 + STEPS // EVERY  # step 1, then every EVERY steps
FIRST_CHECK_COMPILES = 2
CHECK_EXECUTES = 2


def run(tmp_path, *flags):
    """Both ranks' measurements (tests/support/synccheck_xla_cost.py)."""
    port = ports.free_port()
    outs = [str(tmp_path / ("rank%d.json" % rank)) for rank in range(2)]
    env = xla_env({"PJRT_DEVICE": "CPU", "TPU_CLOSURE_FIX": "0"},
                  drop=("PJRT_DEVICE", "CPU_NUM_DEVICES", "TPU_CLOSURE_FIX", "PYTHONPATH",
                        "TPU_CLOSURE_FIX_SYNC_CHECK", "TPU_CLOSURE_FIX_SYNC_CHECK_ON_DIVERGENCE"))
    env["PYTHONPATH"] = os.pathsep.join([REPO, TESTS])
    commands = [[XLA_PY, "-m", "support.synccheck_xla_cost", "--rank", str(rank), "--world", "2", "--port", str(port),
                 "--every", str(EVERY), "--steps", str(STEPS), "--out", out] + list(flags)
                for rank, out in enumerate(outs)]
    runs = run_children(commands, TIMEOUT, env=env, cwd=TESTS, result_files=outs)
    assert all(r.ok for r in runs), [r.error + r.stderr_tail() for r in runs]
    return [r.payload for r in runs]


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    return run(tmp_path_factory.mktemp("checked"))


@pytest.fixture(scope="module")
def unchecked(tmp_path_factory):
    return run(tmp_path_factory.mktemp("unchecked"), "--no-check")


def _counts(measured):
    return measured["compiles"], measured["executes"]


@defined_where(ON_TIER)
def test_without_checks_the_training_is_one_graph_per_step(unchecked):
    """The twin: what the numbers below are relative to."""
    for rank in unchecked:
        assert rank["checks"] == [] and rank["steps"] == STEPS, rank
        assert _counts(rank["whole_run"]) == _counts(rank["training"]) == (1, STEPS), rank["whole_run"]


@defined_where(ON_TIER)
def test_every_check_ran_and_found_the_replicas_identical(checked):
    for rank in checked:
        assert [c["step"] for c in rank["checks"]] == [1] + list(range(EVERY, STEPS + 1, EVERY)), rank["checks"]
        assert all(c["outcome"] == "identical" for c in rank["checks"]), rank["checks"]


@defined_where(ON_TIER)
def test_the_first_check_compiles_at_most_two_graphs(checked):
    for rank in checked:
        first = rank["checks"][0]
        assert first["compiles"] <= FIRST_CHECK_COMPILES, first
        assert first["executes"] <= CHECK_EXECUTES, first


@defined_where(ON_TIER)
def test_later_checks_compile_nothing_and_execute_at_most_two_graphs(checked):
    for rank in checked:
        for later in rank["checks"][1:]:
            assert later["compiles"] == 0, later
            assert later["executes"] <= CHECK_EXECUTES, later


@defined_where(ON_TIER)
def test_the_checks_leave_the_training_graph_alone(checked, unchecked):
    """Nothing of a check stays pending into the next step: the training compiles and runs as without checks,
    and the whole run costs the twin's plus the checks' own."""
    for rank, twin in zip(checked, unchecked):
        assert _counts(rank["training"]) == _counts(twin["training"]), (rank["training"], twin["training"])
        whole, base = rank["whole_run"], twin["whole_run"]
        assert whole["compiles"] - base["compiles"] <= FIRST_CHECK_COMPILES, (whole, base)
        assert whole["executes"] - base["executes"] <= CHECK_EXECUTES * CHECKS, (whole, base)

"""Replicas as threads of one process on torch_xla without a process group (PJRT on CPU, TPU v2/v3), on the test
double: the zero-code check exchanges over its own TCPStore and gloo groups, one worker per replica thread, and
never calls an XLA collective (the double's ``all_reduce`` / ``all_gather`` record and raise).

Each case is one child process (tests/support/xla_host_replicas.py, 2 replica threads, 12 steps,
``TPU_CLOSURE_FIX_SYNC_CHECK=3``: checks before the first update and at steps 1, 3, 6, 9, 12) under a hard
timeout: different data on the replicas warns at every check from step 1 on, naming the step
and the tensors; its twin with the same data is silent with every check answered; a probe optimizer stepped by
replica 0 alone costs one stand-down note and every replica finishes; a user's channel naming a port in use is
one warning naming it and the variable to set, and every replica finishes. The process hands its replica
threads the check's channel as torch_xla's ``spawn_threads`` does (:mod:`tpu_closure_fix.synccheck.launch`).
The first three on real torch_xla 2.9: tests/xla/test_synccheck_host_xla.py.
"""
import os
import sys

import pytest

pytest.importorskip("torch", reason="SyncCheck compares torch tensors: no torch here")

from support import features  # noqa: E402
from support.ranks import REPO, TESTS  # noqa: E402
from tpu_closure_fix.synccheck import comm  # noqa: E402
from tpu_closure_fix.verify.child import run_child  # noqa: E402

pytestmark = features.needs_step_hooks()  # every case is the zero-code check

TIMEOUT = 180
STEPS = 12
#: Checks per replica: before the first update, step 1, then every 3 steps.
CHECKS = 2 + STEPS // 3


def run(tmp_path, scenario, timeout_seconds="20", channel=None):
    """The process's result (see tests/support/xla_host_replicas.py); ``channel``: the user's
    TPU_CLOSURE_FIX_SYNC_CHECK_CHANNEL (None: the process hands its own over)."""
    out = str(tmp_path / ("%s.json" % scenario))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TPU_CLOSURE_FIX", "MASTER_"))}
    env.update(TPU_CLOSURE_FIX_SYNC_CHECK="3", TPU_CLOSURE_FIX_SYNC_CHECK_TIMEOUT=timeout_seconds,
               OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([REPO, TESTS]))
    if channel is not None:
        env[comm.CHANNEL_VAR] = channel
    child = run_child([sys.executable, "-m", "support.xla_host_replicas", "--mode", "standin", "--scenario",
                       scenario, "--steps", str(STEPS), "--out", out], TIMEOUT, env=env, cwd=TESTS, marker=None,
                      result_file=out)
    assert child.ok, "%s\n%s" % (child.error, child.stderr_tail())
    return child.payload


def _finished(result):
    assert result["replicas"] == {"0": {"steps": STEPS, "error": None}, "1": {"steps": STEPS, "error": None}}
    assert result["drained"] and result["collectives"] == [], result


@pytest.fixture(scope="module")
def different(tmp_path_factory):
    return run(tmp_path_factory.mktemp("different"), "different")


@pytest.fixture(scope="module")
def same(tmp_path_factory):
    return run(tmp_path_factory.mktemp("same"), "same")


def test_replica_threads_with_different_data_are_warned_once_at_the_first_difference(different):
    _finished(different)
    said = different["warnings"]
    # identical before the first update, different from step 1 on: the same divergence at every later check
    assert len(said) == 1, said
    assert "between the start (identical before the first optimizer step) and step 1" in said[0], said[0]
    assert "'0.weight', '0.bias', '2.weight', '2.bias'" in said[0], said
    assert different["checks"] == 2 * CHECKS


def test_twin_replica_threads_with_the_same_data_are_checked_and_silent(same):
    _finished(same)
    assert same["warnings"] == [] and same["checks"] == 2 * CHECKS and same["armed"] == 3


def test_a_probe_optimizer_of_replica_0_alone_is_one_note_and_every_replica_finishes(tmp_path):
    result = run(tmp_path, "probe", timeout_seconds="3")
    _finished(result)
    assert len(result["warnings"]) == 1, result["warnings"]
    note = result["warnings"][0]
    assert "stands down for SGD over weight, bias (in Linear) at step 0" in note, note
    assert "rank 0 reached it, rank 1 did not within 3s" in note, note
    assert result["checks"] == 2 * CHECKS  # the model's checks all answered, on both replicas


def test_a_users_channel_on_a_port_in_use_is_one_warning_naming_it_and_every_replica_finishes(tmp_path):
    """The user's channel names a port another program holds: process 0 cannot make the store there. Both replica
    threads' checks stand down with the one message (the check is then off in the process)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = run(tmp_path, "same", channel="127.0.0.1:%d:%s" % (port, "ab" * 16))
    _finished(result)
    assert len(result["warnings"]) == 1, result["warnings"]
    note = result["warnings"][0]
    assert "its store could not listen at 127.0.0.1:%d" % port in note, note
    assert "set %s to a free port" % comm.CHANNEL_VAR in note and result["checks"] == 0, note

"""The zero-code check on real torch_xla 2.9 launched as its users launch it: ``xmp.spawn`` with
``PJRT_DEVICE=CPU CPU_NUM_DEVICES=2`` (2 replica threads in one process), no torch.distributed process group,
``TPU_CLOSURE_FIX_SYNC_CHECK=3``, 12 plain optimizer steps (tests/support/xla_host_replicas.py).

The check goes over its own host channel (a TCPStore on a port of its own, gloo groups per replica thread): it
never issues an XLA collective, so no check can leave one replica in a collective without partner (on CPU such a
collective aborts the run; on a TPU it hangs). Replicas with different data are warned once (the same divergence at
step and the tensors; the twin with the same data on both is silent with every check answered; a probe optimizer
stepped by replica 0 alone costs one stand-down note and every replica finishes. torch_xla's ``all_reduce`` and
``all_gather`` record and raise in these runs: none may be called.
"""
import os
import sys

import pytest

from xla_tier import REPO, TESTS, TIMEOUT, TORCH_XLA, XLA_PY, defined_where, xla_env

if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from tpu_closure_fix.verify.child import run_children  # noqa: E402

ON_TIER = TORCH_XLA is not None and TORCH_XLA.split(".")[:2] == ["2", "9"]
STEPS = 12
CHECKS = 2 + STEPS // 3  # before the first update, step 1, then every 3 steps
SCENARIOS = ("different", "same", "probe")
#: The agreement's timeout of the probe case (short: the probe's check waits it out once); the other cases keep
#: a long one, so a loaded machine never stands a correct check down.
PROBE_TIMEOUT = 15


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """scenario -> the process's result; the three runs at once (each xmp.spawn hands its replicas a store of
    its own), under a hard timeout."""
    import threading

    folder = tmp_path_factory.mktemp("host")
    done = {}

    def one(scenario):
        out = str(folder / ("%s.json" % scenario))
        env = xla_env({"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2", "TPU_CLOSURE_FIX_SYNC_CHECK": "3",
                       "TPU_CLOSURE_FIX_SYNC_CHECK_TIMEOUT": str(PROBE_TIMEOUT if scenario == "probe" else 300),
                       "OMP_NUM_THREADS": "1"},
                      drop=("PJRT_DEVICE", "CPU_NUM_DEVICES", "PYTHONPATH", "MASTER_ADDR", "MASTER_PORT")
                      + tuple(k for k in os.environ if k.startswith("TPU_CLOSURE_FIX_SYNC_CHECK")))
        env["PYTHONPATH"] = os.pathsep.join([REPO, TESTS])
        command = [XLA_PY, "-m", "support.xla_host_replicas", "--mode", "real", "--scenario", scenario,
                   "--steps", str(STEPS), "--out", out]
        done[scenario] = run_children([command], TIMEOUT, env=env, cwd=TESTS, marker=None, result_files=[out])[0]

    threads = [threading.Thread(target=one, args=(scenario,)) for scenario in SCENARIOS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for scenario in SCENARIOS:
        assert done[scenario].ok, (scenario, done[scenario].error, done[scenario].stderr_tail())
    return {scenario: done[scenario].payload for scenario in SCENARIOS}


def _finished(result):
    assert result["replicas"] == {"0": {"steps": STEPS, "error": None}, "1": {"steps": STEPS, "error": None}}
    assert result["drained"] and result["collectives"] == [], result


@defined_where(ON_TIER)
def test_xmp_spawn_replicas_with_different_data_are_warned(runs):
    result = runs["different"]
    _finished(result)
    said = result["warnings"]
    # identical before the first update, different from step 1 on: the same divergence at every later check
    assert len(said) == 1, said
    assert "between the start (identical before the first optimizer step) and step 1" in said[0], said[0]
    assert "'0.weight', '0.bias', '2.weight', '2.bias'" in said[0], said


@defined_where(ON_TIER)
def test_twin_xmp_spawn_replicas_with_the_same_data_are_checked_and_silent(runs):
    result = runs["same"]
    _finished(result)
    assert result["warnings"] == [] and result["checks"] == 2 * CHECKS and result["armed"] == 3


@defined_where(ON_TIER)
def test_xmp_spawn_a_probe_optimizer_of_replica_0_alone_is_one_note_and_every_replica_finishes(runs):
    result = runs["probe"]
    _finished(result)
    assert len(result["warnings"]) == 1, result["warnings"]
    note = result["warnings"][0]
    assert "stands down for SGD over weight, bias (in Linear) at step 0" in note, note
    assert "rank 0 reached it, rank 1 did not within %ds" % PROBE_TIMEOUT in note, note
    assert result["checks"] == 2 * CHECKS

"""The zero-code SyncCheck: ``TPU_CLOSURE_FIX_SYNC_CHECK=10`` and a training script that never mentions it.

Two replica processes (gloo) train on different data through the installed, released framework
(:mod:`support.zero_code`: the pytorch-lightning 1.8.6 Trainer and a plain ``xm.optimizer_step``
loop, Fabric 2.6.6's ``optimizer.step(closure)``, accelerate 1.15.0's ``AcceleratedOptimizer.step``;
only torch_xla is the stand-in). Each run has its twins:

The check runs before each optimizer's first update (step 0: the replicas start identical here), after
step 1 and every 10 steps.

* ``TPU_CLOSURE_FIX=0`` (the bug present): rank 0 warns at steps 1 and 10 (rank 1 reaches the same
  verdict and only logs it), at the line of the script that stepped (``trainer.fit`` /
  ``optimizer.step`` / ``xm.optimizer_step``), never inside torch or the framework; with
  ``..._ON_DIVERGENCE=raise`` training stops on both, at the same optimizer step, after the check at step 1.
* the shim on: the checks run at steps 0, 1 and 10 and find the replicas identical; no warning.
* the variable unset: no check, and the check's module is not even imported.
* a plain loop whose ``xm.optimizer_step`` gets no closure is reduced correctly even without the
  shim: checked and silent.
"""
import os

import pytest

from conftest import REPLICAS, TARGET, TESTS, TIMEOUT, child_env, defined_where
from support import ranks
from support.said import assert_raised_together

EVERY = 10
STEPS = 12
#: Steps the raise test may run: the ranks raise at a step they agree on while training goes on, so on a loaded
#: machine that step can be far ahead; the loop ends at the raise (the bound is reached only if no rank raises).
RAISE_STEPS = 20000
VARIABLES = ("TPU_CLOSURE_FIX_SYNC_CHECK", "TPU_CLOSURE_FIX_SYNC_CHECK_ON_DIVERGENCE")
APIS = {"pytorch-lightning==1.8.6": ("trainer", "xla"), "lightning-fabric==2.6.6": ("lite",),
        "accelerate==1.15.0": ("accelerate",)}[TARGET]
SUPPORT = os.path.join(TESTS, "support") + os.sep


@pytest.fixture(autouse=True)
def no_inherited_variables(monkeypatch):
    """The children get exactly the variables a test gives them (child_env copies this environment)."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def run(api, shim, tmp_path, every=EVERY, action=None, steps=STEPS, **scenario):
    env = {} if every is None else {"TPU_CLOSURE_FIX_SYNC_CHECK": str(every)}
    if action:
        env["TPU_CLOSURE_FIX_SYNC_CHECK_ON_DIVERGENCE"] = action
    scenario = dict(scenario, api=api, steps=steps)
    return ranks.run_replicas("support.zero_code", scenario, REPLICAS, tmp_path, child_env(shim, env), TIMEOUT)


def ours(result):
    return [w for w in result["warnings"] if "SyncCheck" in w["message"] or "tpu-closure-fix" in w["message"]]


@pytest.mark.parametrize("api", APIS)
def test_without_the_shim_rank_0_warns_at_step_1_at_the_user_line_once(api, tmp_path):
    results = run(api, False, tmp_path)
    for rank, result in results.items():
        assert not result["shim"] and result["steps"] == STEPS and result["error"] is None, result
        warned = ours(result)
        if rank != 0:  # the same verdict, logged at debug level: one warning for the job
            assert warned == [], warned
        else:  # the check at step EVERY finds the same tensors different on the same ranks: not said again
            assert len(warned) == 1, warned
            for step, warning in zip((1,), warned):
                assert warning["category"] == "WARNING"  # a record of the check's logger
                assert "step %d" % step in warning["message"] and "across 2 replicas" in warning["message"], warning
                assert "rank 0 holds one version; rank 1 holds another" in warning["message"], warning
                # the location is the script's line that stepped, not torch's / the framework's / the shim's
                assert warning["filename"].startswith(SUPPORT), warning
        state = result["zero_code"]
        assert state["armed_every"] == EVERY and state["checks"] == 3, state  # steps 0, 1, 10
        assert state["last_report"]["step"] == EVERY and state["last_report"]["outcome"] == "differ", state
        assert state["last_report"]["identical_at"] == 0, state  # the replicas started identical
    assert results[0]["zero_code"]["last_report"] == results[1]["zero_code"]["last_report"]


@pytest.mark.parametrize("api", APIS)
def test_with_the_shim_it_checks_and_stays_silent(api, tmp_path):
    for rank, result in run(api, True, tmp_path).items():
        assert result["shim"] and result["steps"] == STEPS and result["error"] is None, result
        assert ours(result) == [], result["warnings"]
        state = result["zero_code"]
        assert state["checks"] == 3 and state["last_report"]["step"] == EVERY, state
        assert state["last_report"]["outcome"] == "identical", state


@pytest.mark.parametrize("api", APIS)
def test_unset_nothing_is_checked_or_imported(api, tmp_path):
    for rank, result in run(api, False, tmp_path, every=None).items():
        assert result["steps"] == STEPS and result["error"] is None, result
        assert ours(result) == [], result["warnings"]
        assert result["zero_code"] == {"loaded": False, "armed_every": 0, "checks": 0, "last_report": None}


def test_raise_stops_every_replica_at_the_same_step_after_the_check_at_step_1(tmp_path):
    """Identical at step 0; apart after the first update: the verdict of that check (found off the training
    thread) makes every rank raise at the optimizer step the ranks agreed on."""
    results = run(APIS[0], False, tmp_path, action="raise", steps=RAISE_STEPS)
    for rank, result in results.items():
        error = result["error"] or ""
        assert error.startswith("ReplicaDivergenceError: SyncCheck") and "and step 1: " in error, result
    # each at the optimizer step every rank agreed on (or, learnt late, after it: the documented limit)
    steps = assert_raised_together([result["error"] for result in results.values()])
    for (at, agreed), result in zip(steps, results.values()):
        # raised in torch's post-hooks of that step: the harness's step counter, a post-hook registered
        # after the check's, never sees it
        assert result["steps"] == at - 1 and agreed < RAISE_STEPS, result


@defined_where("xla" in APIS)
def test_plain_loop_without_a_closure_is_in_sync_even_without_the_shim(tmp_path):
    for rank, result in run("xla", False, tmp_path, closure=False).items():
        assert result["steps"] == STEPS and ours(result) == [], result
        state = result["zero_code"]
        assert state["checks"] == 3 and not state["last_report"]["diverged"], state

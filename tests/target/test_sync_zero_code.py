"""The zero-code SyncCheck: ``TPU_CLOSURE_FIX_SYNC_CHECK=10`` and a training script that never mentions it.

Two replica processes (gloo) train on different data through the installed, released framework
(:mod:`support.zero_code`: the pytorch-lightning 1.8.6 Trainer and a plain ``xm.optimizer_step``
loop, Fabric 2.6.6's ``optimizer.step(closure)``, accelerate 1.15.0's ``AcceleratedOptimizer.step``;
only torch_xla is the stand-in). Each run has its twins:

* ``TPU_CLOSURE_FIX=0`` (the bug present): one warning per replica by step 10, at the line of the
  script that stepped (``trainer.fit`` / ``optimizer.step`` / ``xm.optimizer_step``), never inside
  torch or the framework; with ``..._ON_DIVERGENCE=raise`` training stops at step 10 on both.
* the shim on: the check runs at step 10 and finds the replicas identical; no warning.
* the variable unset: no check, and the check's module is not even imported.
* a plain loop whose ``xm.optimizer_step`` gets no closure is reduced correctly even without the
  shim: checked and silent.
"""
import os

import pytest

from conftest import TARGET, TESTS, defined_where, run_replicas

EVERY = 10
STEPS = 12
VARIABLES = ("TPU_CLOSURE_FIX_SYNC_CHECK", "TPU_CLOSURE_FIX_SYNC_CHECK_ON_DIVERGENCE")
APIS = {"pytorch-lightning==1.8.6": ("trainer", "xla"), "lightning-fabric==2.6.6": ("lite",),
        "accelerate==1.15.0": ("accelerate",)}[TARGET]
SUPPORT = os.path.join(TESTS, "support") + os.sep


@pytest.fixture(autouse=True)
def no_inherited_variables(monkeypatch):
    """The children get exactly the variables a test gives them (child_env copies this environment)."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def run(api, shim, tmp_path, every=EVERY, action=None, **scenario):
    env = {} if every is None else {"TPU_CLOSURE_FIX_SYNC_CHECK": str(every)}
    if action:
        env["TPU_CLOSURE_FIX_SYNC_CHECK_ON_DIVERGENCE"] = action
    scenario = dict(scenario, api=api, steps=STEPS)
    return run_replicas(scenario, shim, tmp_path, module="support.zero_code", extra_env=env)


def ours(result):
    return [w for w in result["warnings"] if "SyncCheck" in w["message"] or "tpu-closure-fix" in w["message"]]


@pytest.mark.parametrize("api", APIS)
def test_without_the_shim_it_warns_at_step_10_at_the_user_line(api, tmp_path):
    results = run(api, False, tmp_path)
    for rank, result in results.items():
        assert not result["shim"] and result["steps"] == STEPS and result["error"] is None, result
        warned = ours(result)
        assert len(warned) == 1, warned
        assert warned[0]["category"] == "TPUClosureFixWarning"
        assert "at step %d" % EVERY in warned[0]["message"] and "across 2 replicas" in warned[0]["message"]
        # the location is the script's line that stepped, not torch's / the framework's / the shim's
        assert warned[0]["filename"].startswith(SUPPORT), warned[0]
        state = result["zero_code"]
        assert state["armed_every"] == EVERY and state["checks"] == 1, state
        assert state["last_report"]["step"] == EVERY and state["last_report"]["outcome"] == "differ", state
    assert results[0]["zero_code"]["last_report"] == results[1]["zero_code"]["last_report"]


@pytest.mark.parametrize("api", APIS)
def test_with_the_shim_it_checks_and_stays_silent(api, tmp_path):
    for rank, result in run(api, True, tmp_path).items():
        assert result["shim"] and result["steps"] == STEPS and result["error"] is None, result
        assert ours(result) == [], result["warnings"]
        state = result["zero_code"]
        assert state["checks"] == 1 and state["last_report"]["step"] == EVERY, state
        assert state["last_report"]["outcome"] == "identical", state


@pytest.mark.parametrize("api", APIS)
def test_unset_nothing_is_checked_or_imported(api, tmp_path):
    for rank, result in run(api, False, tmp_path, every=None).items():
        assert result["steps"] == STEPS and result["error"] is None, result
        assert ours(result) == [], result["warnings"]
        assert result["zero_code"] == {"loaded": False, "armed_every": 0, "checks": 0, "last_report": None}


def test_raise_stops_every_replica_at_step_10(tmp_path):
    for rank, result in run(APIS[0], False, tmp_path, action="raise").items():
        assert (result["error"] or "").startswith("ReplicaDivergenceError: SyncCheck"), result
        assert "at step %d" % EVERY in result["error"]
        assert result["steps"] == EVERY, result


@defined_where("xla" in APIS)
def test_plain_loop_without_a_closure_is_in_sync_even_without_the_shim(tmp_path):
    for rank, result in run("xla", False, tmp_path, closure=False).items():
        assert result["steps"] == STEPS and ours(result) == [], result
        state = result["zero_code"]
        assert state["checks"] == 1 and not state["last_report"]["diverged"], state

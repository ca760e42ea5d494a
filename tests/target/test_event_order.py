"""Issue #2: the recorded order of one training step, with the shim and without it.

Runs the real Lightning of the target (Trainer.fit with the TPU precision
plugin; the Lite/Fabric loop with ``optimizer.step(closure)``) on 2 replicas;
only torch_xla is the stand-in. Each "with the shim" assertion has its twin
under TPU_CLOSURE_FIX=0 that shows the bug, proving the check can fail.
"""
import pytest

from conftest import TARGET
from support import expectations

def only_if(applicable):
    """Define the test only where its API exists in the target (no skip entries for other targets);
    which API each target has is data in support/expectations.py."""
    def decorate(test):
        return test if applicable else None
    return decorate


@pytest.fixture(scope="module")
def runs(replica_runs):
    """Rank 0 of the shared replica run (conftest.replica_runs), per shim mode."""
    return {shim: replica_runs[shim][0] for shim in (True, False)}


def events(runs, shim, name):
    return [(ev, info) for ev, info in runs[shim]["scenarios"][name]["events"]]


def names(evs):
    return [ev for ev, _ in evs]


def test_runs_report_shim_state(runs):
    assert runs[True]["shim"] is True
    assert runs[False]["shim"] is False


def _trainer_fixed_order():
    import support.lightning_api  # noqa: F401

    dist, version = expectations.parse_target(TARGET)
    if version < expectations.Version("1.5"):
        # 1.2-1.4: the installed TPUAccelerator.run_optimizer_step with those releases' closure.
        return ["forward", "zero_grad", "backward", "reduce_gradients", "step", "mark_step"]
    return ["forward", "zero_grad", "backward", "reduce_gradients", "before_optimizer_step", "step", "mark_step"]


@only_if(expectations.has_trainer(TARGET))
def test_trainer_with_shim_reduces_after_backward(runs):
    evs = events(runs, True, "order-trainer")
    assert names(evs) == _trainer_fixed_order() * 2
    for ev, info in evs:
        if ev == "reduce_gradients":
            assert info["grads"] == info["params"] > 0, "reduction must see this step's gradients"


@only_if(expectations.has_trainer(TARGET))
def test_trainer_without_shim_twin(runs):
    evs = events(runs, False, "order-trainer")
    if expectations.trainer_affected(TARGET):
        # The bug: the reduction runs before the closure, on the first step with no gradient at all.
        assert names(evs)[0] == "reduce_gradients"
        assert evs[0][1]["grads"] == 0
        assert names(evs) != _trainer_fixed_order() * 2
    else:
        # Fixed upstream: the shim must change nothing.
        assert names(evs) == names(events(runs, True, "order-trainer")) == _trainer_fixed_order() * 2


def _lite_fixed(barrier):
    step = ["zero_grad", "forward", "backward", "reduce_gradients", "step"]
    return step + (["mark_step"] if barrier else [])


def _barrier():
    dist, version = expectations.parse_target(TARGET)
    return dist in ("lightning-fabric", "lightning", "pytorch-lightning") and version >= expectations.Version("2.1")


@only_if(expectations.has_lite(TARGET))
def test_lite_closure_with_shim(runs):
    assert names(events(runs, True, "order-lite")) == _lite_fixed(_barrier()) * 2


@only_if(expectations.has_lite(TARGET))
def test_lite_closure_without_shim_twin(runs):
    evs = events(runs, False, "order-lite")
    assert expectations.lite_affected(TARGET)
    assert names(evs)[0] == "reduce_gradients" and evs[0][1]["grads"] == 0
    assert names(evs) != _lite_fixed(_barrier()) * 2


@only_if(expectations.has_lite(TARGET))
def test_lbfgs_one_reduction_per_closure_evaluation(runs):
    evs = names(events(runs, True, "order-lbfgs"))
    assert evs.count("backward") > 2, "LBFGS must evaluate the closure several times per step"
    for i, ev in enumerate(evs):
        if ev == "backward":
            assert evs[i + 1] == "reduce_gradients"
    assert evs.count("reduce_gradients") == evs.count("backward")
    buggy = names(events(runs, False, "order-lbfgs"))
    assert buggy.count("reduce_gradients") == 2 and buggy.count("backward") == evs.count("backward")


@only_if(expectations.has_lite(TARGET))
def test_lite_without_closure_runs_original_call(runs):
    # backward, then optimizer.step(): the original reduce-then-step is right, and the shim keeps it.
    expected = ["zero_grad", "forward", "backward", "reduce_gradients", "step"] + (["mark_step"] if _barrier() else [])
    assert names(events(runs, True, "order-lite-no-closure")) == expected * 2
    assert names(events(runs, False, "order-lite-no-closure")) == expected * 2

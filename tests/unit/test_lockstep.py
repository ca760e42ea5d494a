"""The lockstep rule (tpu_closure_fix.lockstep) on its own: which optimizers, what they get.

torch_xla is replaced by a small recording double (the only test double allowed): its
``all_reduce`` records the call and returns what a 2-replica sum-then-scale would give if the
other replica held ``OTHER``.
"""
import types

import pytest

torch = pytest.importorskip("torch", reason="the lockstep rule acts on torch tensors: this interpreter has no torch")

from tpu_closure_fix import lockstep  # noqa: E402  (after the skip: needs torch)

OTHER = 3.0


def fake_xm(world):
    calls = []

    def all_reduce(reduce_type, value, scale=1.0):
        calls.append((reduce_type, value.clone(), scale))
        return (value + OTHER) * scale

    return types.SimpleNamespace(REDUCE_SUM="sum", all_reduce=all_reduce, xrt_world_size=lambda: world), calls


def params():
    return [torch.nn.Parameter(torch.zeros(2))]


def test_lbfgs_reads_the_loss_and_sgd_adam_do_not():
    assert lockstep.reads_loss(torch.optim.LBFGS(params()))
    assert not lockstep.reads_loss(torch.optim.SGD(params(), lr=0.1))
    assert not lockstep.reads_loss(torch.optim.Adam(params()))


def test_framework_wrappers_are_unwrapped():
    lbfgs = torch.optim.LBFGS(params())
    assert lockstep.reads_loss(types.SimpleNamespace(optimizer=lbfgs))  # accelerate's AcceleratedOptimizer
    assert lockstep.reads_loss(types.SimpleNamespace(_optimizer=lbfgs))  # Lightning's LightningOptimizer
    assert not lockstep.reads_loss(types.SimpleNamespace(optimizer=torch.optim.SGD(params(), lr=0.1)))


def test_lbfgs_gets_the_replica_mean_with_one_scalar_all_reduce():
    xm, calls = fake_xm(2)
    loss = torch.tensor(1.0, requires_grad=True) * 1.0
    seen = lockstep.lockstep_loss(xm, torch.optim.LBFGS(params()), loss)
    assert seen.item() == (1.0 + OTHER) / 2
    assert len(calls) == 1 and calls[0][0] == "sum" and calls[0][2] == 0.5
    assert loss.item() == 1.0 and loss.requires_grad  # the user's tensor is left as it was


def test_other_optimizers_get_the_closure_result_untouched_and_no_collective():
    xm, calls = fake_xm(2)
    loss = torch.tensor(1.0)
    assert lockstep.lockstep_loss(xm, torch.optim.SGD(params(), lr=0.1), loss) is loss
    assert calls == []


def test_one_replica_needs_no_collective():
    xm, calls = fake_xm(1)
    loss = torch.tensor(1.0)
    assert lockstep.lockstep_loss(xm, torch.optim.LBFGS(params()), loss) is loss
    assert calls == []


def test_a_python_number_becomes_a_tensor_and_other_results_pass_through():
    xm, calls = fake_xm(2)
    lbfgs = torch.optim.LBFGS(params())
    assert lockstep.lockstep_loss(xm, lbfgs, 5.0).item() == (5.0 + OTHER) / 2
    assert lockstep.lockstep_loss(xm, lbfgs, None) is None
    result = {"loss": 1}
    assert lockstep.lockstep_loss(xm, lbfgs, result) is result
    assert len(calls) == 1

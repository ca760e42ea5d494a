"""The torch_xla guard on ``xm.optimizer_step``, and the barrier rule, in isolation.

The guard is prepared exactly as the engine prepares it (``Fix.prepare`` on the
module's own ``optimizer_step``, wrapped in a ``wrapt.FunctionWrapper`` that is
put on the module), on a private copy of the package's CPU simulation of
``torch_xla.core.xla_model`` whose ``reduce_gradients`` and ``mark_step`` are
replaced by recorders. The optimizer is a small fake that records its calls
and, like every torch optimizer given a closure, calls it (``evaluations``
times: LBFGS evaluates several times).
"""
import importlib.util
import itertools
import os
import sys
from unittest import mock

import pytest
import wrapt

from tpu_closure_fix import engine, fixes, sites
from tpu_closure_fix.integrations import torch_xla as guard_integration
from tpu_closure_fix.integrations.torch_xla.fixes import OptimizerStepGuard

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUARD_KEY = ("torch_xla.core.xla_model", "optimizer_step")
_copies = itertools.count()


class FakeOptimizer(object):
    """Records ``step`` calls in the shared event list; evaluates the closure ``evaluations`` times."""

    def __init__(self, events, evaluations=1, result="step-result"):
        self.events, self.evaluations, self.result = events, evaluations, result
        self.param_groups = []
        self.step_kwargs = []

    def step(self, closure=None, **kwargs):
        self.events.append("step")
        self.step_kwargs.append(kwargs)
        losses = [closure() for _ in range(self.evaluations)] if closure is not None else []
        return (self.result, losses)


class Harness(object):
    """A private copy of the simulated xla_model with the guard installed on its ``optimizer_step``."""

    def __init__(self, switch_on=True):
        name = "tpu_closure_fix_guard_test_xla_%d" % next(_copies)
        spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "tpu_closure_fix", "_simulated_xla.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # the guard finds its module by the function's __module__
        spec.loader.exec_module(module)
        self.module, self.events, self.reductions = module, [], []
        module.reduce_gradients = self._reduce
        module.mark_step = lambda wait=False: self.events.append("mark_step")
        self.original = module.optimizer_step
        self.switch = engine.Switch()
        self.switch.on = switch_on
        (site,) = sites.rows_for(*GUARD_KEY)
        module.optimizer_step = wrapt.FunctionWrapper(self.original,
                                                      OptimizerStepGuard().prepare(site, self.original, self.switch))
        self.guarded = module.optimizer_step

    def _reduce(self, optimizer, groups=None, pin_layout=True):
        self.events.append("reduce_gradients")
        self.reductions.append({"optimizer": optimizer, "groups": groups, "pin_layout": pin_layout})

    def closure(self, loss="loss"):
        def closure():
            self.events.append("closure")
            return loss

        return closure

    def optimizer(self, evaluations=1):
        return FakeOptimizer(self.events, evaluations)

    def close(self):
        sys.modules.pop(self.module.__name__, None)


@pytest.fixture
def xla():
    harness = Harness()
    yield harness
    harness.close()


# The order of one guarded call, and the release's own order (reduce first, then step, which runs the closure).
FIXED = ["step", "closure", "reduce_gradients"]
ORIGINAL = ["reduce_gradients", "step", "closure"]


# --------------------------------------------------------------------------- argument binding
@pytest.mark.parametrize("call", [
    lambda h, opt, args: h.guarded(opt, optimizer_args=args),
    lambda h, opt, args: h.guarded(opt, False, args),
    lambda h, opt, args: h.guarded(optimizer=opt, optimizer_args=args),
    lambda h, opt, args: h.guarded(opt, barrier=False, optimizer_args=args, groups=None, pin_layout=True),
], ids=["keyword-args", "positional-args", "all-keyword", "every-parameter"])
def test_closure_runs_before_the_reduction_however_the_call_is_written(xla, call):
    optimizer = xla.optimizer()
    call(xla, optimizer, {"closure": xla.closure()})
    assert xla.events == FIXED
    assert xla.reductions == [{"optimizer": optimizer, "groups": None, "pin_layout": True}]


def test_the_release_order_without_the_guard_is_the_bug(xla):
    """The twin: the module's own function reduces before the closure runs."""
    xla.original(xla.optimizer(), optimizer_args={"closure": xla.closure()})
    assert xla.events == ORIGINAL


@pytest.mark.parametrize("positional", [False, True])
def test_groups_and_pin_layout_reach_reduce_gradients(xla, positional):
    optimizer = xla.optimizer()
    groups = [[0, 1], [2, 3]]
    if positional:
        xla.guarded(optimizer, False, {"closure": xla.closure()}, groups, False)
    else:
        xla.guarded(optimizer, optimizer_args={"closure": xla.closure()}, groups=groups, pin_layout=False)
    assert xla.reductions == [{"optimizer": optimizer, "groups": groups, "pin_layout": False}]


@pytest.mark.parametrize("positional", [False, True])
def test_barrier_true_adds_the_barrier_after_the_step(xla, positional):
    if positional:
        xla.guarded(xla.optimizer(), True, {"closure": xla.closure()})
    else:
        xla.guarded(xla.optimizer(), barrier=True, optimizer_args={"closure": xla.closure()})
    assert xla.events == FIXED + ["mark_step"]


def test_returns_what_the_optimizer_step_returns(xla):
    result = xla.guarded(xla.optimizer(), optimizer_args={"closure": xla.closure(loss=3.5)})
    assert result == ("step-result", [3.5])  # the closure's own result reached the optimizer


def test_other_optimizer_args_reach_the_step_and_the_callers_dict_is_kept(xla):
    optimizer = xla.optimizer()
    args = {"closure": xla.closure(), "lr_scale": 0.5}
    xla.guarded(optimizer, optimizer_args=args)
    assert optimizer.step_kwargs == [{"lr_scale": 0.5}]
    assert set(args) == {"closure", "lr_scale"}  # the guard copied the dict before taking the closure out


def test_every_closure_evaluation_is_followed_by_one_reduction(xla):
    xla.guarded(xla.optimizer(evaluations=3), optimizer_args={"closure": xla.closure()})
    assert xla.events == ["step"] + ["closure", "reduce_gradients"] * 3


def test_an_exception_in_the_closure_propagates_before_any_reduction(xla):
    def failing():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        xla.guarded(xla.optimizer(), optimizer_args={"closure": failing})
    assert "reduce_gradients" not in xla.events


# --------------------------------------------------------------------------- the original, untouched
@pytest.mark.parametrize("args", [{}, {"closure": None}, {"lr_scale": 1.0}], ids=["no-args", "closure-None", "no-closure"])
def test_without_a_closure_the_original_runs(xla, args):
    optimizer = xla.optimizer()
    xla.guarded(optimizer, optimizer_args=args)
    assert xla.events == ["reduce_gradients", "step"]  # the module's own order: right when gradients exist


def test_no_optimizer_args_at_all_runs_the_original(xla):
    xla.guarded(xla.optimizer())
    assert xla.events == ["reduce_gradients", "step"]


def test_switched_off_the_original_runs_even_with_a_closure():
    harness = Harness(switch_on=False)
    try:
        harness.guarded(harness.optimizer(), optimizer_args={"closure": harness.closure()})
        assert harness.events == ORIGINAL
        harness.switch.on = True  # the same wrapper, switched on again
        del harness.events[:]
        harness.guarded(harness.optimizer(), optimizer_args={"closure": harness.closure()})
        assert harness.events == FIXED
    finally:
        harness.close()


@pytest.mark.parametrize("call", [
    lambda h, opt, c: h.guarded(opt, False, {"closure": c}, None, True, "one too many"),
    lambda h, opt, c: h.guarded(opt, optimizer_args={"closure": c}, unknown=1),
    lambda h, opt, c: h.guarded(opt, False, {"closure": c}, barrier=True),
], ids=["too-many-positional", "unknown-keyword", "given-twice"])
def test_calls_that_do_not_bind_raise_the_originals_type_error(xla, call):
    with pytest.raises(TypeError):
        call(xla, xla.optimizer(), xla.closure())
    assert xla.events == []  # the original raised before doing anything


# --------------------------------------------------------------------------- the barrier rule
def _sync_style_step(optimizer, barrier=False, optimizer_args={}, groups=None, pin_layout=True):
    """A release whose optimizer_step issues torch_xla.sync() (never executed here; only its code is read)."""
    import torch_xla

    loss = optimizer.step(**optimizer_args)
    if barrier:
        torch_xla.sync()
    return loss


def _mark_step_style_step(optimizer, barrier=False, optimizer_args={}, groups=None, pin_layout=True):
    loss = optimizer.step(**optimizer_args)
    if barrier:
        mark_step()  # noqa: F821  (never executed; only its code is read)
    return loss


def _both_style_step(optimizer, barrier=False, optimizer_args={}, groups=None, pin_layout=True):
    import torch_xla

    if barrier:
        torch_xla.sync() if optimizer else mark_step()  # noqa: F821
    return None


@pytest.fixture
def torch_xla_sync(monkeypatch):
    """A ``torch_xla`` package whose ``sync()`` is recorded (what ``import torch_xla`` in barrier() finds)."""
    package = mock.Mock(name="torch_xla")
    monkeypatch.setitem(sys.modules, "torch_xla", package)
    return package.sync


def _xm(step):
    xm = mock.Mock(name="xm")
    xm.optimizer_step = step
    return xm


def test_barrier_is_torch_xla_sync_when_the_installed_step_uses_it(torch_xla_sync):
    xm = _xm(_sync_style_step)
    fixes.barrier(xm)
    torch_xla_sync.assert_called_once_with()
    xm.mark_step.assert_not_called()


def test_barrier_is_mark_step_when_the_installed_step_uses_it(torch_xla_sync):
    xm = _xm(_mark_step_style_step)
    fixes.barrier(xm)
    xm.mark_step.assert_called_once_with()
    torch_xla_sync.assert_not_called()


def test_barrier_is_mark_step_when_the_code_names_both(torch_xla_sync):
    xm = _xm(_both_style_step)
    fixes.barrier(xm)
    xm.mark_step.assert_called_once_with()
    torch_xla_sync.assert_not_called()


def test_barrier_reads_the_function_under_a_wrapper(torch_xla_sync):
    """The installed optimizer_step is the guard (a wrapt wrapper): its wrapped function decides."""
    xm = _xm(wrapt.FunctionWrapper(_sync_style_step, lambda wrapped, instance, args, kwargs: None))
    fixes.barrier(xm)
    torch_xla_sync.assert_called_once_with()
    xm.mark_step.assert_not_called()


@pytest.mark.parametrize("make", [mock.Mock, mock.MagicMock], ids=["Mock", "MagicMock"])
def test_barrier_of_a_mock_without_code_is_mark_step(torch_xla_sync, make):
    xm = make(name="xla_model")
    fixes.barrier(xm)
    xm.mark_step.assert_called_once_with()
    torch_xla_sync.assert_not_called()


def test_barrier_without_an_optimizer_step_is_mark_step(torch_xla_sync):
    xm = mock.Mock(spec=["mark_step"])
    fixes.barrier(xm)
    xm.mark_step.assert_called_once_with()
    torch_xla_sync.assert_not_called()


def test_the_guard_issues_the_barrier_of_the_installed_release(torch_xla_sync):
    """End to end: a module whose optimizer_step uses torch_xla.sync() gets sync() from the guard."""
    harness = Harness()
    try:
        harness.original.__code__ = _sync_style_step.__code__  # the module's step now reads like a sync release
        harness.guarded(harness.optimizer(), barrier=True, optimizer_args={"closure": harness.closure()})
        assert harness.events == FIXED
        torch_xla_sync.assert_called_once_with()
    finally:
        harness.close()


# --------------------------------------------------------------------------- torch_xla as the original obtains it
xm = "first"  # a module global, as pytorch-lightning 1.2-1.4 and accelerate bind torch_xla's xla_model


def _global_xm_step(optimizer):
    return xm.optimizer_step(optimizer)


def test_xla_model_for_code_with_a_module_global_reads_it_at_call_time(monkeypatch):
    get = fixes.xla_model_for(_global_xm_step)
    assert get() == "first"
    monkeypatch.setitem(globals(), "xm", "rebound")
    assert get() == "rebound"


def test_xla_model_for_code_that_imports_it_is_the_call_time_import():
    def step(optimizer):
        import torch_xla.core.xla_model as xm

        return xm.optimizer_step(optimizer)

    assert fixes.xla_model_for(step) is fixes.xla_model


# --------------------------------------------------------------------------- which framework code the guard covers
# Never executed: only their code is read, as the engine reads a skipped site's method.
class _Shapes(object):
    def trainer_1_8(self, optimizer, model, optimizer_idx, closure, **kwargs):  # pytorch-lightning 1.8.6
        import torch_xla.core.xla_model as xm

        closure = self._wrap_closure(model, optimizer, optimizer_idx, closure)
        return xm.optimizer_step(optimizer, optimizer_args={"closure": closure, **kwargs})

    def fabric_2_6(self, optimizer, **kwargs):  # lightning-fabric 2.6.6 XLAPrecision: the closure is in kwargs
        import torch_xla.core.xla_model as xm

        return xm.optimizer_step(optimizer, optimizer_args=kwargs, barrier=True)

    def no_optimizer_args(self, optimizer, **kwargs):  # steps through torch_xla without handing it a closure
        import torch_xla.core.xla_model as xm

        return xm.optimizer_step(optimizer)

    def nothing_to_hand_over(self, optimizer):  # no closure and no **kwargs to carry one
        import torch_xla.core.xla_model as xm

        return xm.optimizer_step(optimizer, optimizer_args={})


def _as_torch_xla(module):
    """``module`` where ``import torch_xla.core.xla_model`` finds it (package objects included)."""
    import types

    top, core = types.ModuleType("torch_xla"), types.ModuleType("torch_xla.core")
    top.core, core.xla_model = core, module
    return mock.patch.dict(sys.modules, {"torch_xla": top, "torch_xla.core": core, "torch_xla.core.xla_model": module})


@pytest.mark.parametrize("name, covered", [("trainer_1_8", True), ("fabric_2_6", True),
                                           ("no_optimizer_args", False), ("nothing_to_hand_over", False)])
def test_guard_covers_code_that_can_pass_a_closure_to_optimizer_step(xla, name, covered):
    with _as_torch_xla(xla.module):
        assert guard_integration.covers(getattr(_Shapes, name), {"optimizer_step": xla.guarded}) is covered


def test_guard_covers_looks_under_wrappers(xla):
    wrapped = wrapt.FunctionWrapper(_Shapes.fabric_2_6, lambda wrapped, instance, args, kwargs: None)
    with _as_torch_xla(xla.module):
        assert guard_integration.covers(wrapped, {"optimizer_step": xla.guarded}) is True


def test_guard_does_not_cover_a_call_that_resolves_elsewhere(xla):
    """The names are all there, but ``xm`` here is not the module holding the guard: not covered."""
    with _as_torch_xla(xla.module):
        assert guard_integration.covers(_Shapes.fabric_2_6, {"optimizer_step": xla.original}) is False
    assert guard_integration.covers(_Shapes.fabric_2_6, {"optimizer_step": xla.guarded}) is False  # no torch_xla


def test_the_simulations_torch_xla_packages_read_as_not_installed_to_find_spec_and_import_all_the_same():
    """Lightning and torchmetrics ask ``importlib.util.find_spec("torch_xla")`` at import. For a module already
    in ``sys.modules`` that reads its ``__spec__``: None raises ValueError, which torchmetrics 0.11 does not
    catch (``import pytorch_lightning`` 1.9 then fails under the event-order self-test), and a real spec makes
    Lightning 2.x import parts of torch_xla the stand-in does not have. The stand-in's packages raise
    ModuleNotFoundError, which every such probe catches, and still import by name."""
    import subprocess

    code = ("import importlib.util\n"
            "from tpu_closure_fix import _simulated_xla\n"
            "_simulated_xla.install()\n"
            "for name in ('torch_xla', 'torch_xla.core'):\n"
            "    try:\n"
            "        importlib.util.find_spec(name)\n"
            "    except ModuleNotFoundError as exc:\n"
            "        print(name, 'not installed', exc.name)\n"
            "import torch_xla.core.xla_model as xm\n"
            "print(xm is _simulated_xla, importlib.util.find_spec('torch_xla.core.xla_model').name)\n")
    env = dict(os.environ, PYTHONPATH=REPO, TPU_CLOSURE_FIX="0")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["torch_xla not installed torch_xla", "torch_xla.core not installed torch_xla.core",
                                        "True tpu_closure_fix._simulated_xla"]

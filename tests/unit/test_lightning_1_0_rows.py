"""pytorch-lightning 1.0.4-1.1.8: the rows of the call-site table and their fixes, without the framework.

The code each fix wraps is the releases' own, copied below from the wheels (1.0.8's default
``LightningModule.optimizer_step`` hook; 1.1.8's ``LightningOptimizer.__optimizer_step``) into small
classes whose module-level ``xm`` is the package's CPU simulation of torch_xla with an event recorder.
Each ordering test has its twin with the shim switched off, which shows the bug: the reduction first.
"""
import json
import os
import types

import pytest
import wrapt
from packaging.version import Version

from tpu_closure_fix import engine, sites
from tpu_closure_fix.integrations import lightning
from tpu_closure_fix.releases import in_range
from tpu_closure_fix.verify import driver

torch = pytest.importorskip("torch", reason="the fixes step torch optimizers: this interpreter has no torch")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS = {s.variant: s for s in sites.CALL_SITES if s.variant in ("pl-1.0.4", "pl-1.0.7", "pl-1.1.0", "pl-1.1.4")}
READ = ["1.0.%d" % n for n in range(9)] + ["1.1.%d" % n for n in range(9)]

# ---- the releases' code (bodies as in the wheels; ``xm`` is the module global they read) -----------------
RELEASE_SOURCE = '''
class LightningModule:
    def optimizer_step(self, *args, epoch=None, batch_idx=None, optimizer=None, optimizer_idx=None,
                       optimizer_closure=None, on_tpu=None, using_native_amp=None, using_lbfgs=None, **kwargs):
        if on_tpu:
            xm.optimizer_step(optimizer, optimizer_args={'closure': optimizer_closure, **kwargs})
        elif self.trainer.amp_backend == AMPType.NATIVE:
            optimizer_closure()
            self.trainer.scaler.step(optimizer)
        elif self.trainer.amp_backend == AMPType.APEX:
            optimizer_closure()
            optimizer.step(*args, **kwargs)
        else:
            optimizer.step(closure=optimizer_closure, *args, **kwargs)


class LightningOptimizer:
    def __init__(self, optimizer, trainer, optimizer_idx=0):
        self._optimizer, self._trainer, self._optimizer_idx = optimizer, trainer, optimizer_idx

    def __optimizer_step(self, *args, closure=None, profiler_name=None, **kwargs):
        trainer = self._trainer
        optimizer = self._optimizer
        model = trainer.get_model()

        if trainer.on_tpu:
            with trainer.profiler.profile(profiler_name):
                xm.optimizer_step(optimizer, optimizer_args={'closure': closure, **kwargs})

        elif trainer.amp_backend is not None:
            trainer.precision_connector.backend.optimizer_step(trainer, optimizer, closure)

        else:
            with trainer.profiler.profile(profiler_name):
                optimizer.step(closure=closure, *args, **kwargs)

        accelerator_backend = trainer.accelerator_backend
        if accelerator_backend is not None and accelerator_backend.rpc_enabled:
            if accelerator_backend.ddp_plugin.is_main_rpc_process:
                accelerator_backend.ddp_plugin.worker_optimizer_step(
                    model=model, opt_idx=self._optimizer_idx, *args, **kwargs)

        trainer.train_loop.on_before_zero_grad(optimizer)

        model.optimizer_zero_grad(trainer.current_epoch, trainer.batch_idx, optimizer, self._optimizer_idx)
'''


@pytest.fixture
def xla():
    """The simulated torch_xla (one replica) with its recorder, as a fresh module of its own."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_lightning_rows_xla", os.path.join(REPO, "tpu_closure_fix",
                                                                                      "_simulated_xla.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.events = []
    module.recorder = lambda name, **info: module.events.append(name if info.get("grads", 1) else name + "(no grads)")
    return module


def release_code(xla):
    namespace = {"xm": xla, "AMPType": types.SimpleNamespace(NATIVE="native", APEX="apex")}
    exec(compile(RELEASE_SOURCE, "<pytorch-lightning release code>", "exec"), namespace)
    return namespace["LightningModule"], namespace["LightningOptimizer"]


def patch(owner, attr, row, on=True):
    """The row's fix around ``owner.attr``, as the engine applies it; returns the switch."""
    switch = engine.Switch()
    switch.on = on
    original = vars(owner)[attr]
    assert row.shape.check(original, owner).ok, row.shape.check(original, owner).reason
    setattr(owner, attr, wrapt.FunctionWrapper(original, row.fix.prepare(row, original, switch)))
    return switch


def model_and_closure(events):
    """The ``check`` self-test's recording step, with pytorch-lightning 1.0-1.1's
    ``train_step_and_backward_closure`` order (forward, zero_grad, backward)."""
    step = driver.recording_step(torch, events, zero_grad_after_forward=True)
    return step.model, step.optimizer, step.closure


FIXED = ["forward", "backward", "reduce_gradients", "step", "mark_step"]
BUGGY = ["reduce_gradients(no grads)", "forward", "backward", "step"]


# ---- the table -------------------------------------------------------------------------------------------
def test_every_affected_release_read_falls_in_exactly_one_row_and_1_0_0_to_1_0_3_in_none():
    for release in READ:
        hits = [v for v, row in ROWS.items() if in_range(release, row.releases)]
        assert hits == ([] if Version(release) < Version("1.0.4") else [hits[0]]), (release, hits)
    assert [e.releases for e in sites.not_affected_for(lightning.PL_CORE, lightning.MODULE_STEP)] == \
        ["<1.0.4", ">=1.1.0"]


def test_recorded_fingerprints_agree_with_the_releases_measured():
    with open(os.path.join(REPO, "docs", "fingerprints.json")) as handle:
        measured = json.load(handle)
    for variant, row in ROWS.items():
        assert sorted(measured[variant]) == sorted(r for r in READ if in_range(r, row.releases)), variant
        assert {fp for _, fp in row.fingerprints} == set(measured[variant].values()), variant
        for release, fingerprint in row.fingerprints:
            assert measured[variant][release] == fingerprint, (variant, release)


def test_the_1_0_hook_and_the_1_1_lightning_optimizer_are_what_the_scan_covers():
    from tpu_closure_fix.verify import scan

    keys = set(sites.site_keys())
    assert scan._covered(lightning.PL_CORE, "LightningModule.optimizer_step", keys)
    assert scan._covered(lightning.PL_OPTIMIZER, "LightningOptimizer.__optimizer_step", keys)
    found = scan.calls_in_source("import torch_xla.core.xla_model as xm\n" + RELEASE_SOURCE)
    assert [name for name, _ in found] == ["LightningModule.optimizer_step", "LightningOptimizer.__optimizer_step"]


# ---- 1.0.x: the default LightningModule.optimizer_step hook ---------------------------------------------
def module_hook_step(module, optimizer, closure, on_tpu=True):
    module.optimizer_step(epoch=0, batch_idx=0, optimizer=optimizer, optimizer_idx=0, optimizer_closure=closure,
                          on_tpu=on_tpu, using_native_amp=False, using_lbfgs=False)


@pytest.mark.parametrize("on", [True, False], ids=["shim", "switched-off-twin"])
def test_1_0_hook_on_tpu_runs_the_closure_then_one_reduction_then_the_step(xla, on):
    hook_class, _ = release_code(xla)
    patch(hook_class, "optimizer_step", ROWS["pl-1.0.7"], on=on)
    _, optimizer, closure = model_and_closure(xla.events)
    module_hook_step(hook_class(), optimizer, closure)
    assert xla.events == (FIXED if on else BUGGY)


def test_1_0_hook_off_tpu_runs_the_original(xla):
    hook_class, _ = release_code(xla)
    patch(hook_class, "optimizer_step", ROWS["pl-1.0.7"])
    _, optimizer, closure = model_and_closure(xla.events)
    module = hook_class()
    module.trainer = types.SimpleNamespace(amp_backend=None)
    module_hook_step(module, optimizer, closure, on_tpu=False)
    assert xla.events == ["forward", "backward", "step"]  # no reduction, no barrier: not the TPU branch


def test_1_0_hook_lbfgs_reduces_after_every_closure_evaluation(xla):
    hook_class, _ = release_code(xla)
    patch(hook_class, "optimizer_step", ROWS["pl-1.0.7"])
    model, _, closure = model_and_closure(xla.events)
    lbfgs = torch.optim.LBFGS(model.parameters(), max_iter=3)
    module_hook_step(hook_class(), lbfgs, lambda: (lbfgs.zero_grad(), closure())[1])
    backwards = [i for i, ev in enumerate(xla.events) if ev == "backward"]
    assert len(backwards) > 1 and all(xla.events[i + 1] == "reduce_gradients" for i in backwards)


def test_1_0_override_that_steps_itself_is_not_covered_and_status_says_so(xla):
    """An override of the hook that steps the optimizer itself never reaches xm.optimizer_step: no reduction
    at all, nothing to patch; the patched verdict of the default hook says so."""
    hook_class, _ = release_code(xla)
    patch(hook_class, "optimizer_step", ROWS["pl-1.0.7"])

    class Override(hook_class):
        def optimizer_step(self, *args, optimizer=None, optimizer_closure=None, **kwargs):
            optimizer.step(closure=optimizer_closure)

    _, optimizer, closure = model_and_closure(xla.events)
    module_hook_step(Override(), optimizer, closure)
    assert xla.events == ["forward", "backward", "step"]
    assert "super().optimizer_step" in ROWS["pl-1.0.7"].fix.caveat
    assert engine._with_caveat(ROWS["pl-1.0.7"], "") == ROWS["pl-1.0.7"].fix.caveat


# ---- 1.1.x: LightningOptimizer.__optimizer_step ---------------------------------------------------------
class Recorder(object):
    def __init__(self, events):
        self.events = events

    def __getattr__(self, name):
        return lambda *args, **kwargs: self.events.append(name)


def tpu_trainer(events, model):
    profiler = types.SimpleNamespace(profile=lambda name: _Section(events, name))
    return types.SimpleNamespace(on_tpu=True, profiler=profiler, get_model=lambda: model, accelerator_backend=None,
                                 train_loop=Recorder(events), current_epoch=0, batch_idx=0, amp_backend=None)


class _Section(object):
    def __init__(self, events, name):
        self.events, self.name = events, name

    def __enter__(self):
        self.events.append("profile:%s" % self.name)

    def __exit__(self, *exc):
        self.events.append("end:%s" % self.name)


@pytest.mark.parametrize("on", [True, False], ids=["shim", "switched-off-twin"])
def test_1_1_lightning_optimizer_runs_the_upstream_order_then_the_zero_grad_hooks(xla, on):
    _, optimizer_class = release_code(xla)
    attr = "_LightningOptimizer__optimizer_step"
    patch(optimizer_class, attr, ROWS["pl-1.1.4"], on=on)
    _, optimizer, closure = model_and_closure(xla.events)
    trainer = tpu_trainer(xla.events, Recorder(xla.events))
    getattr(optimizer_class(optimizer, trainer), attr)(closure=closure, profiler_name="s")
    zero_grad_hooks = ["on_before_zero_grad", "optimizer_zero_grad"]
    if on:
        assert xla.events == ["profile:s"] + FIXED + ["end:s"] + zero_grad_hooks
    else:
        assert xla.events == ["profile:s"] + BUGGY + ["end:s"] + zero_grad_hooks


def test_1_1_lightning_optimizer_hook_argument_follows_the_release(xla):
    _, optimizer_class = release_code(xla)
    attr = "_LightningOptimizer__optimizer_step"
    _, optimizer, closure = model_and_closure(xla.events)
    for variant, expected in (("pl-1.1.0", "wrapper"), ("pl-1.1.4", "optimizer")):
        given = []
        trainer = tpu_trainer(xla.events, Recorder(xla.events))
        trainer.train_loop = types.SimpleNamespace(on_before_zero_grad=given.append)
        original = vars(optimizer_class)[attr]
        patch(optimizer_class, attr, ROWS[variant])
        wrapper = optimizer_class(optimizer, trainer)
        getattr(wrapper, attr)(closure=closure, profiler_name="s")
        setattr(optimizer_class, attr, original)
        assert given == [wrapper if expected == "wrapper" else optimizer], variant


def test_1_1_lightning_optimizer_off_tpu_runs_the_original(xla):
    _, optimizer_class = release_code(xla)
    attr = "_LightningOptimizer__optimizer_step"
    patch(optimizer_class, attr, ROWS["pl-1.1.4"])
    _, optimizer, closure = model_and_closure(xla.events)
    trainer = tpu_trainer(xla.events, Recorder(xla.events))
    trainer.on_tpu = False
    getattr(optimizer_class(optimizer, trainer), attr)(closure=closure, profiler_name="s")
    assert xla.events == ["profile:s", "forward", "backward", "step", "end:s", "on_before_zero_grad",
                          "optimizer_zero_grad"]


# ---- releases the table has no row for: the hook's NOT_AFFECTED entries ---------------------------------
HOOK_1_0_3 = '''
class LightningModule:
    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_idx, second_order_closure=None,
                       on_tpu=False, using_native_amp=False, using_lbfgs=False):
        if on_tpu:
            xm.optimizer_step(optimizer)
        else:
            optimizer.step()
'''


def examine_hook(monkeypatch, release, source):
    """engine.examine of the 1.0 hook's site with a stand-in ``pytorch_lightning`` of ``release`` whose
    core.lightning module holds ``source``."""
    top = types.ModuleType("pytorch_lightning")
    top.__version__ = release
    module = types.ModuleType(lightning.PL_CORE)
    exec(compile(source, lightning.PL_CORE, "exec"), vars(module))
    monkeypatch.setitem(__import__("sys").modules, "pytorch_lightning", top)
    monkeypatch.setitem(__import__("sys").modules, lightning.PL_CORE, module)
    return engine.examine((lightning.PL_CORE, lightning.MODULE_STEP))


@pytest.mark.parametrize("release", ["0.7.1", "0.10.0", "1.0.0", "1.0.3"])
def test_releases_before_1_0_4_are_not_affected_not_in_this_release(monkeypatch, release):
    finding = examine_hook(monkeypatch, release, HOOK_1_0_3)
    assert finding.verdict == engine.ABSENT and "not affected" in finding.reason, finding


def test_a_not_affected_release_whose_code_hands_the_closure_over_is_never_hidden(monkeypatch):
    changed = HOOK_1_0_3.replace("xm.optimizer_step(optimizer)",
                                 "xm.optimizer_step(optimizer, optimizer_args={'closure': second_order_closure})")
    finding = examine_hook(monkeypatch, "1.0.3", changed)
    assert finding.verdict == engine.SKIPPED and "unknown release 1.0.3" in finding.reason, finding

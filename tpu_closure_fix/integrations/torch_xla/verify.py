"""Verification driver for the torch_xla guard: one ``xm.optimizer_step`` call with a closure.

Used by ``tpu-closure-fix check`` only (the patching code never imports it). The target is the
guard's row: ``torch_xla.core.xla_model.optimizer_step``, looked up on the module at call time
(what a caller's ``xm.optimizer_step(...)`` resolves: the guard when it is in place, the release's
function when the shim is off). The step is a plain PyTorch loop's: a closure that runs forward,
``zero_grad`` and backward, handed over as ``optimizer_args={"closure": closure}``.

Entry points (the interface every integration's ``verify.py`` provides): :func:`event_step`,
:func:`graph_step`, :func:`reference_fix`.
"""
from functools import partial

from ...verify import driver


def _step_function(target):
    """``xm.optimizer_step`` as a caller resolves it now."""
    return getattr(target.module, target.attribute)


def _closure_step(target, optimizer, closure):
    """A plain loop's call: ``xm.optimizer_step(optimizer, optimizer_args={"closure": closure})``."""
    return _step_function(target)(optimizer, optimizer_args={"closure": closure})


def event_step(target, torch, xm, events):
    """One ``xm.optimizer_step(opt, optimizer_args={"closure": closure})`` with the recording stand-in;
    appends ``forward``/``backward``/``step`` (the stand-in adds ``reduce_gradients``)."""
    step = driver.recording_step(torch, events)
    _closure_step(target, step.optimizer, step.closure)


def graph_step(target, harness):
    """One plain-loop step on the harness's XLA device through ``xm.optimizer_step`` with a closure."""
    training = driver.graph_training(harness)
    closure = driver.traced_closure(harness, training)
    return driver.traced_step(
        harness, training, run=partial(_closure_step, target, training.optimizer, closure),
        route=["xm.optimizer_step(optimizer, optimizer_args={'closure': closure}) -> %s.%s"
               % (target.module.__name__, target.attribute)])


def reference_fix(target):
    """Put the fixed order, written out by hand, in place of ``xm.optimizer_step``: the closure,
    then ``reduce_gradients`` with the caller's groups and layout, then the step."""
    module = target.module
    release_reduce = module.reduce_gradients

    def optimizer_step(optimizer, barrier=False, optimizer_args={}, groups=None, pin_layout=True):
        step_args = dict(optimizer_args)
        closure = step_args.pop("closure", None)
        if closure is None:
            release_reduce(optimizer, groups=groups, pin_layout=pin_layout)
            return optimizer.step(**step_args)
        reduced_closure = partial(driver.reduce_after, release_reduce, optimizer, closure,
                                  groups=groups, pin_layout=pin_layout)
        return optimizer.step(closure=reduced_closure, **step_args)

    setattr(module, target.attribute, optimizer_step)


def double_scenarios(site, target):
    """Names of the scenarios of a release-matrix ``target`` (its trimmed summary) that ran the guard
    over the torch_xla test double (the matrix installs no torch_xla, so its status has no row for it).

    The ``xla-*`` scenarios: a plain PyTorch loop calling ``xm.optimizer_step(opt,
    optimizer_args={"closure": closure})`` on 2 gloo replicas. The matrix has no real torch_xla
    (no TPU): these run the guard over the test double, whose ``optimizer_step`` body is the
    releases' (reduce, then step); the real releases are checked by tracing in tests/xla.
    """
    return [name for name in target.get("scenarios_run") or [] if name.startswith("xla-")]

"""Verification driver for the accelerate integration: one optimizer step through a table row.

Used by ``tpu-closure-fix check`` only (the patching code never imports it). Each entry point
receives a ``Target`` (:mod:`tpu_closure_fix.verify.table`): the row of the call-site table that
matched the loaded release, the live ``accelerate.optimizer`` module, the class the row names
(``AcceleratedOptimizer``) and its ``step`` as it is now (the shim's wrapper, or the release's
code with the shim off).

The step is driven on a bare ``AcceleratedOptimizer`` (``__new__``, no ``Accelerator``): its
``step`` reads only ``optimizer``, ``scaler``, the state attribute the row's code shape names
(``state`` up to 0.5, ``accelerator_state`` from 0.6) whose ``distributed_type`` is set to
the release's ``DistributedType.TPU`` (<= 0.27) or ``XLA`` (>= 0.28), and from 0.11 a
``gradient_state`` with ``sync_gradients`` (and from 0.28 ``is_xla_gradients_synced``). An
``Accelerator`` would need torch_xla's runtime to build its state; the step itself is what the
table patches, and this is the code path an ``Accelerator`` on XLA reaches.

Entry points (the interface every integration's ``verify.py`` provides):

* :func:`event_step`: event-order self-test with the recording stand-in for torch_xla;
* :func:`graph_step`: graph check on real torch_xla, returns a ``TracedStep``;
* :func:`reference_fix`: the fixed order written out by hand in place of the row's method;
* :func:`matrix_scenarios` (generated support table): which release-matrix scenarios of a target
  ran through a row.
"""
import types

from ...verify import driver


def _is_xla_shape(row):
    """Rows from 0.28 on: the pre-step all_reduce on DistributedType.XLA (no xm.optimizer_step)."""
    return "_fetch_gradients" in row.shape.requires


def _state_attribute(row):
    return "accelerator_state" if "accelerator_state" in row.shape.requires or _is_xla_shape(row) else "state"


def accelerated_optimizer(target, optimizer):
    """A bare AcceleratedOptimizer of the row's release around ``optimizer``, on its TPU/XLA branch."""
    member = "XLA" if _is_xla_shape(target.row) else "TPU"
    distributed_type = getattr(target.module.DistributedType, member)
    accelerated = target.owner.__new__(target.owner)
    accelerated.__dict__.update(optimizer=optimizer, scaler=None, device_placement=False, _is_overflow=False)
    accelerated.__dict__[_state_attribute(target.row)] = types.SimpleNamespace(distributed_type=distributed_type)
    accelerated.__dict__["gradient_state"] = types.SimpleNamespace(sync_gradients=True,
                                                                   is_xla_gradients_synced=False)
    return accelerated


class _RecordingXlaModel(driver.FetchingXlaModel):
    """accelerate 0.28+ reduces with ``xm.all_reduce("sum", xm._fetch_gradients(opt), ...)``, not with
    ``xm.reduce_gradients``: record a non-empty gradient all_reduce as ``reduce_gradients`` (an empty
    one reduces nothing), delegate everything else to the recording stand-in."""

    def __init__(self, xm, events):
        super(_RecordingXlaModel, self).__init__(xm)
        self._events = events

    def all_reduce(self, reduce_type, inputs, scale=1.0, groups=None, pin_layout=True):
        if isinstance(inputs, list) and inputs:
            self._events.append("reduce_gradients")
        return self._xm.all_reduce(reduce_type, inputs, scale=scale, groups=groups, pin_layout=pin_layout)

    def xrt_world_size(self):
        return 1


def _bind_torch_xla(target, xm):
    """accelerate binds ``xm`` (and ``xr`` from 1.7) at import time only where torch_xla imported;
    put the given ones there, as that import would have."""
    target.module.xm = xm
    if "xr" in target.row.shape.requires:
        target.module.xr = types.SimpleNamespace(world_size=lambda: 1)


def event_step(target, torch, xm, events):
    """Run one ``step(closure)`` through ``target`` with the recording stand-in ``xm`` as torch_xla;
    append ``forward``/``backward``/``step`` to ``events`` (the stand-in adds ``reduce_gradients``)."""
    if _is_xla_shape(target.row):
        xm = _RecordingXlaModel(xm, events)
    _bind_torch_xla(target, xm)
    step = driver.recording_step(torch, events)
    accelerated_optimizer(target, step.optimizer).step(step.closure)


def graph_step(target, harness):
    """One training step through ``target`` on the harness's XLA device (real torch_xla)."""
    import torch_xla.core.xla_model as xm

    _bind_torch_xla(target, xm)
    if "xr" in target.row.shape.requires:
        import torch_xla.runtime as xr

        target.module.xr = xr
    training = driver.graph_training(harness)
    accelerated = accelerated_optimizer(target, training.optimizer)
    closure = driver.traced_closure(harness, training)
    return driver.traced_step(harness, training, run=lambda: accelerated.step(closure),
                              route=["%s.step(closure) (%s)" % (target.owner.__name__, target.row.variant)])


def reference_fix(target):
    """Replace the row's ``step`` by the fixed order written out by hand: closure, then
    ``xm.reduce_gradients``, then the optimizer's step (and, from 0.28, the release's flag reset)."""
    def step(self, closure=None):
        optimizer = self.optimizer
        if closure is None:
            driver.xla_reduce_gradients(optimizer)
            return optimizer.step()
        return optimizer.step(closure=driver.xla_reduced_closure(optimizer, closure))

    setattr(target.owner, target.attribute, step)


def matrix_scenarios(site, target):
    """Names of the scenarios of a release-matrix ``target`` that ran through ``site``: every
    ``accelerate-*`` scenario (a target installs one accelerate release, which one row matches)."""
    return [n for n in target.get("scenarios_run") or [] if n.startswith("accelerate-")]

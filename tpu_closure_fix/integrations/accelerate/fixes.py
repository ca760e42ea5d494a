"""accelerate's fixes: ``AcceleratedOptimizer.step(closure)`` on torch_xla.

Two code shapes (see the rows in this package's ``__init__``):

* up to 0.27: ``xm.optimizer_step(self.optimizer, optimizer_args={"closure": closure})``
  on ``DistributedType.TPU`` -- Lightning's exact call: the reduction runs
  before the closure computes the gradients. :class:`OptimizerStepClosureFix`
  does what torch_xla's guard does for that call: closure, reduce, step.
* 0.28 on: on ``DistributedType.XLA``, ``step`` all-reduces the gradients that
  exist (unless ``gradient_state.is_xla_gradients_synced``), then calls
  ``self.optimizer.step(closure)``: the closure's fresh gradients are never
  reduced. :class:`XlaClosureFix` runs the release's own ``step`` unchanged
  with the closure wrapped, so every evaluation is followed by exactly one
  reduction of the gradients it produced, the way the release reduces them.
"""
from functools import partial

from ...fixes import Fix, FixUnavailable, guarded, one_of, reduce_after, xla_model_for

#: ``AcceleratedOptimizer.step(self, closure=None)`` in every release that takes a closure.
PARAMS = ("closure",)


def _distributed_type(original, member):
    """accelerate's ``DistributedType.<member>``, from the module the original function lives in."""
    enum = getattr(original, "__globals__", {}).get("DistributedType")
    value = getattr(enum, member, None) if enum is not None else None
    if value is None:
        raise FixUnavailable("accelerate.optimizer has no DistributedType.%s" % member)
    return value


def _closure_call(args, kwargs, closure):
    """The call's arguments with its closure replaced, positional or keyword as the caller passed it."""
    if args:
        return (closure,) + tuple(args[1:]), kwargs
    kwargs = dict(kwargs)
    kwargs["closure"] = closure
    return args, kwargs


class OptimizerStepClosureFix(Fix):
    """accelerate 0.4-0.27: closure -> reduce_gradients (per evaluation) -> step.

    ``state_attribute``: where the release keeps its AcceleratorState
    (``state`` up to 0.5, ``accelerator_state`` from 0.6). ``gated``: the
    release steps only when ``gradient_state.sync_gradients`` (0.11 on); on an
    accumulation micro-step the original runs, and does nothing. Without a
    closure, or off TPU, the original runs unchanged. Like the original, it
    returns None; like the torch_xla guard (and upstream Lightning), it does not
    reduce the gradients that existed before the closure ran.
    """

    name = "accelerate-optimizer-step"

    def __init__(self, state_attribute, gated):
        self.state_attribute = state_attribute
        self.gated = gated

    def describe(self):
        return "on TPU with a closure: closure -> reduce_gradients (per evaluation) -> step; otherwise: original"

    def prepare(self, site, original, switch):
        tpu = _distributed_type(original, "TPU")
        xla_model = xla_model_for(original)
        state_attribute = self.state_attribute
        gated = self.gated

        def optimizer_step_closure_fix(wrapped, args, kwargs, instance, values, extra):
            if values["closure"] is None or getattr(instance, state_attribute).distributed_type != tpu or (
                    gated and not instance.gradient_state.sync_gradients):
                return wrapped(*args, **kwargs)
            xm = xla_model()
            optimizer = instance.optimizer
            optimizer.step(closure=partial(reduce_after, xm, optimizer, values["closure"]))
            return None

        return guarded(site.shape.params, switch, optimizer_step_closure_fix)


class XlaClosureFix(Fix):
    """accelerate 0.28+: the release's ``step``, with each closure evaluation reduced once.

    Before each evaluation the flag ``gradient_state.is_xla_gradients_synced``
    is cleared (the closure is about to produce new gradients); after it, unless
    something inside the closure already reduced them and set the flag
    (``accelerator.clip_grad_norm_`` does, before it clips), the gradients are
    all-reduced exactly as the release does before a step --
    ``xm.all_reduce("sum", xm._fetch_gradients(optimizer), scale=1/world size)``
    through the module's own ``xm`` -- and the flag is set. Everything else is
    the release's code: the reduction of the gradients that exist before the
    step, the accumulation micro-step (the closure never runs), the scaler and
    LOMO branches, the flag reset after the step, the return value. Under XLA
    FSDP the flag always reads True, so nothing more is reduced.

    ``world_size``: how the release computes the scale: ``"xrt"``
    (``xm.xrt_world_size()``, 0.28-1.6) or ``"xr"`` (``xr.world_size()``, 1.7+).
    """

    name = "accelerate-xla-closure"

    def __init__(self, world_size):
        self.world_size = one_of("world_size", world_size, ("xrt", "xr"))

    def describe(self):
        return ("on XLA with a closure: the release's step, each closure evaluation followed by one "
                "all_reduce of its gradients unless already synced (e.g. by clip_grad_norm_)")

    def prepare(self, site, original, switch):
        xla = _distributed_type(original, "XLA")
        xla_model = xla_model_for(original)
        module_globals = original.__globals__
        if self.world_size == "xr":
            def world_size(xm):
                return module_globals["xr"].world_size()
        else:
            def world_size(xm):
                return xm.xrt_world_size()

        def xla_closure_fix(wrapped, args, kwargs, instance, values, extra):
            closure = values["closure"]
            if closure is None or instance.accelerator_state.distributed_type != xla:
                return wrapped(*args, **kwargs)
            xm = xla_model()
            reduce = partial(_reduce_unless_synced, xm, instance.gradient_state, world_size)
            evaluate = partial(_evaluate, xm, instance, closure, reduce)
            args, kwargs = _closure_call(args, kwargs, evaluate)
            return wrapped(*args, **kwargs)

        return guarded(site.shape.params, switch, xla_closure_fix)


def _evaluate(xm, accelerated, closure, reduce):
    """One evaluation of the user's closure, its gradients then reduced once (see XlaClosureFix)."""
    accelerated.gradient_state.is_xla_gradients_synced = False
    return reduce_after(xm, accelerated.optimizer, closure, reduce)


def _reduce_unless_synced(xm, gradient_state, world_size, optimizer):
    """accelerate's own pre-step reduction, applied to the closure's gradients."""
    if gradient_state.is_xla_gradients_synced:
        return
    gradients = xm._fetch_gradients(optimizer)
    xm.all_reduce("sum", gradients, scale=1.0 / world_size(xm))
    gradient_state.is_xla_gradients_synced = True

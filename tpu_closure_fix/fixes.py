"""The fixes: what a patched call site does instead of the buggy call.

Every affected call site hands a closure that computes gradients to
``xm.optimizer_step``, which all-reduces *before* ``optimizer.step(closure)``
runs that closure. Each fix below does what the upstream fix in
pytorch-lightning 1.9.0 does (``_tpu_wrap_closure``)::

    closure()                    # forward, zero_grad, backward
    xm.reduce_gradients(opt)     # mean across replicas (no-op on one replica)
    ... Lightning's after-closure hooks (on_before_optimizer_step, clipping)
    optimizer.step(closure=...)
    xm.mark_step()

A fix is a small object: ``prepare(site, original)`` checks everything the fix
needs from the loaded code (and raises :class:`FixUnavailable` otherwise, so the
site is skipped, never half-patched) and returns a wrapt wrapper function
``(wrapped, instance, args, kwargs)``. The wrapper falls back to the original
call whenever the call cannot be bound to the expected parameters, and when the
shim is switched off (``switch.on`` false).
"""
import sys
from functools import partial

from .lockstep import lockstep_loss

XLA_MODEL = "torch_xla.core.xla_model"


class FixUnavailable(Exception):
    """The loaded code lacks something this fix relies on; the site stays unpatched."""


class _Unbindable(Exception):
    pass


def xla_model():
    """torch_xla's xla_model module, imported at call time like upstream does."""
    xm = sys.modules.get(XLA_MODEL)
    if xm is None:
        import torch_xla.core.xla_model as xm
    return xm


def reduce_after(xm, optimizer, closure):
    """Run the closure, then all-reduce the gradients it produced.

    The body of upstream's ``_tpu_wrap_closure``; returns the closure's result,
    as the replica mean for an optimizer that branches on it (:mod:`.lockstep`).
    An exception from the closure propagates before any reduction.
    """
    result = closure()
    xm.reduce_gradients(optimizer)
    return lockstep_loss(xm, optimizer, result)


def bind(names, args, kwargs):
    """Map a call onto the expected parameter names; the rest goes to ``extra``.

    Raises _Unbindable when the call does not fit (then the original runs and
    raises whatever TypeError the user would have seen).
    """
    if len(args) > len(names):
        raise _Unbindable()
    values = dict(zip(names, args))
    extra = dict(kwargs)
    for name in names[len(args):]:
        if name not in extra:
            raise _Unbindable()
        values[name] = extra.pop(name)
    return values, extra


def guarded(names, switch, body, precondition=None):
    """Build the wrapt wrapper shared by every fix.

    The original runs unchanged when the shim is switched off, when called on
    the class rather than an instance, when ``precondition(kwargs)`` is false,
    or when the call does not bind to ``names``; otherwise
    ``body(wrapped, instance, values, extra)`` runs the fix.
    """

    def wrapper(wrapped, instance, args, kwargs):
        if not switch.on or instance is None or (precondition is not None and not precondition(kwargs)):
            return wrapped(*args, **kwargs)
        try:
            values, extra = bind(names, args, kwargs)
        except _Unbindable:
            return wrapped(*args, **kwargs)
        return body(wrapped, args, kwargs, instance, values, extra)

    return wrapper


def _is_do_nothing_closure(closure):
    # PL 1.5-1.7 LightningLite passes ``_do_nothing_closure`` when the user
    # called ``optimizer.step()`` without a closure (gradients already exist).
    return getattr(closure, "__name__", None) in ("_do_nothing_closure", "do_nothing_closure") and str(
        getattr(closure, "__module__", "")
    ).startswith(("pytorch_lightning", "lightning"))


def _has_closure(kwargs):
    return kwargs.get("closure") is not None


class Fix(object):
    """Base class; ``describe()`` is what the support table prints."""

    name = "fix"

    def describe(self):
        raise NotImplementedError

    def prepare(self, site, original, switch):
        raise NotImplementedError


class TrainerClosureFix(Fix):
    """Trainer precision plugin ``optimizer_step`` (PL 1.5-1.8, lightning.pytorch 1.8).

    Exactly upstream 1.9.0: closure, reduce, ``_wrap_closure``'s after-closure
    hooks (so clipping sees reduced gradients), step, mark_step; the same
    error as the installed release when ``training_step`` returns None under
    automatic optimization.

    ``returns_result``: the release's original returns the closure result
    (1.6+) or nothing (1.5). ``lite_when_not_lightning_module``: PL 1.5-1.7
    route LightningLite through this method with a plain ``nn.Module``; then
    the Lite rule applies (a user closure is reduced after each evaluation,
    ``_do_nothing_closure`` keeps the original call) and no ``mark_step`` is
    added, since the original passed ``barrier=False``.
    """

    name = "trainer-closure"

    def __init__(self, returns_result=True, lite_when_not_lightning_module=False):
        self.returns_result = returns_result
        self.lite_when_not_lightning_module = lite_when_not_lightning_module

    def describe(self):
        text = "closure -> reduce_gradients -> after-closure hooks/clipping -> step -> mark_step (upstream 1.9.0)"
        if self.lite_when_not_lightning_module:
            text += "; LightningLite path: user closure -> reduce per evaluation"
        return text

    def prepare(self, site, original, switch):
        from .shape import string_constant_containing

        names = site.shape.params
        module_globals = getattr(original, "__globals__", {})
        error_type = module_globals.get("MisconfigurationException")
        message = string_constant_containing(original, "Skipping backward")
        if error_type is None or message is None:
            raise FixUnavailable("cannot find the release's MisconfigurationException and its message")
        pl = module_globals.get("pl")
        if self.lite_when_not_lightning_module and pl is None:
            raise FixUnavailable("module has no 'pl' binding for the LightningModule check")
        returns_result = self.returns_result
        lite_path = self.lite_when_not_lightning_module

        def trainer_closure_fix(wrapped, args, kwargs, instance, values, extra):
            model = values["model"]
            optimizer = values["optimizer"]
            closure = values["closure"]
            if lite_path and not isinstance(model, pl.LightningModule):
                if _is_do_nothing_closure(closure):
                    return wrapped(*args, **kwargs)
                xm = xla_model()
                result = optimizer.step(closure=partial(reduce_after, xm, optimizer, closure), **extra)
                return result if returns_result else None
            xm = xla_model()
            closure = partial(reduce_after, xm, optimizer, closure)
            closure = partial(instance._wrap_closure, model, optimizer, values["optimizer_idx"], closure)
            closure_result = optimizer.step(closure=closure, **extra)
            xm.mark_step()
            if closure_result is None and model.automatic_optimization:
                raise error_type(message)
            return closure_result if returns_result else None

        return guarded(names, switch, trainer_closure_fix)


class AcceleratorStepFix(Fix):
    """``TPUAccelerator.run_optimizer_step`` (PL 1.2-1.4; never fixed upstream).

    Same order as upstream 1.9.0: Lightning's closure (which in these releases
    also clips gradients, *before* the reduction: see README limitations), then
    reduce_gradients, then step, then mark_step. Returns None like the original.
    """

    name = "accelerator-closure"

    def describe(self):
        return "closure -> reduce_gradients -> step -> mark_step (upstream 1.9.0 order)"

    def prepare(self, site, original, switch):
        names = site.shape.params

        def accelerator_step_fix(wrapped, args, kwargs, instance, values, extra):
            optimizer = values["optimizer"]
            xm = xla_model()
            optimizer.step(closure=partial(reduce_after, xm, optimizer, values["lambda_closure"]), **extra)
            xm.mark_step()
            return None

        return guarded(names, switch, accelerator_step_fix)


class LiteClosureFix(Fix):
    """Lite/Fabric precision ``optimizer_step(optimizer, **kwargs)``.

    With a user closure (``optimizer.step(closure)``), every evaluation of the
    closure (LBFGS evaluates it several times) is followed by exactly one
    reduce_gradients, then the step runs; ``mark_step`` follows where the
    original asked for ``barrier=True``. Without a closure the original
    ``xm.optimizer_step`` call runs unchanged (gradients already exist, so its
    reduce-then-step order is right).
    """

    name = "lite-closure"

    def __init__(self, barrier=False):
        self.barrier = barrier

    def describe(self):
        text = "with a closure: closure -> reduce_gradients (per evaluation) -> step"
        if self.barrier:
            text += " -> mark_step"
        return text + "; without: original call"

    def prepare(self, site, original, switch):
        names = site.shape.params
        barrier = self.barrier

        def lite_closure_fix(wrapped, args, kwargs, instance, values, extra):
            optimizer = values["optimizer"]
            closure = extra.pop("closure")
            xm = xla_model()
            result = optimizer.step(closure=partial(reduce_after, xm, optimizer, closure), **extra)
            if barrier:
                xm.mark_step()
            return result

        return guarded(names, switch, lite_closure_fix, precondition=_has_closure)

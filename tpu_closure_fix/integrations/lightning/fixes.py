"""Lightning's fixes: Trainer precision plugins, the 1.2-1.4 accelerator, Lite/Fabric precisions.

Each does what upstream pytorch-lightning 1.9.0 does for the Trainer
(``_tpu_wrap_closure``): the closure, then ``reduce_gradients``, then the step,
then the barrier. torch_xla is obtained at call time the way the patched
method's own code obtains it (:func:`tpu_closure_fix.fixes.xla_model_for`).
"""
from functools import partial

from ...fixes import Fix, FixUnavailable, barrier, guarded, has_closure, reduce_after, xla_model_for


def _is_do_nothing_closure(closure):
    # PL 1.5-1.7 LightningLite passes ``_do_nothing_closure`` when the user
    # called ``optimizer.step()`` without a closure (gradients already exist).
    return getattr(closure, "__name__", None) in ("_do_nothing_closure", "do_nothing_closure") and str(
        getattr(closure, "__module__", "")
    ).startswith(("pytorch_lightning", "lightning"))


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
        from ...shape import string_constant_containing

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
        xla_model = xla_model_for(original)

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
            barrier(xm)
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
        xla_model = xla_model_for(original)

        def accelerator_step_fix(wrapped, args, kwargs, instance, values, extra):
            optimizer = values["optimizer"]
            xm = xla_model()
            optimizer.step(closure=partial(reduce_after, xm, optimizer, values["lambda_closure"]), **extra)
            barrier(xm)
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
        with_barrier = self.barrier
        xla_model = xla_model_for(original)

        def lite_closure_fix(wrapped, args, kwargs, instance, values, extra):
            optimizer = values["optimizer"]
            closure = extra.pop("closure")
            xm = xla_model()
            result = optimizer.step(closure=partial(reduce_after, xm, optimizer, closure), **extra)
            if with_barrier:
                barrier(xm)
            return result

        return guarded(names, switch, lite_closure_fix, precondition=has_closure)

"""Lightning's fixes: Trainer precision plugins, the 1.2-1.4 accelerator, Lite/Fabric precisions.

Each does what upstream pytorch-lightning 1.9.0 does for the Trainer
(``_tpu_wrap_closure``): the closure, then ``reduce_gradients``, then the step,
then the barrier. torch_xla is obtained at call time the way the patched
method's own code obtains it (:func:`tpu_closure_fix.fixes.xla_model_for`).
"""
from functools import partial

from ...fixes import (Fix, FixUnavailable, barrier, bind_with_defaults, guarded, has_closure, reduce_after,
                      xla_model_for)


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


def _bound_call(original, instance, args, kwargs):
    """The call's arguments by parameter name (defaults applied, ``self`` included), or None when they do not
    fit: the original then runs and raises what the user would have seen."""
    return bind_with_defaults(original, (instance,) + tuple(args), kwargs)


def _reduced_step(xm, optimizer, closure, step_kwargs):
    """The upstream 1.9.0 order: the step evaluates the closure, each evaluation is followed by one
    reduction of the gradients it produced, the update follows, then the barrier."""
    result = optimizer.step(closure=partial(reduce_after, xm, optimizer, closure), **step_kwargs)
    barrier(xm)
    return result


class ModuleHookFix(Fix):
    """``LightningModule.optimizer_step`` (pytorch-lightning 1.0.4-1.0.8), the default hook.

    On TPU (``on_tpu``) it hands ``optimizer_closure`` to ``xm.optimizer_step``,
    which reduces before the closure runs. The fix runs upstream 1.9.0's order:
    closure, one reduction, step, ``mark_step``; every other branch (GPU, AMP,
    CPU) runs the original. A LightningModule that overrides ``optimizer_step``
    is covered only where its override calls ``super().optimizer_step``.
    """

    name = "module-hook"
    caveat = ("covers the default hook: a LightningModule overriding optimizer_step without calling "
              "super().optimizer_step is not covered; tpu_closure_fix.check_sync(model, step) detects its divergence")

    def describe(self):
        return ("on TPU: closure -> reduce_gradients -> step -> mark_step (upstream 1.9.0 order); "
                "otherwise: original. Only the default hook: an override that steps the optimizer itself is not "
                "covered")

    def prepare(self, site, original, switch):
        xla_model = xla_model_for(original)

        def module_hook_fix(wrapped, instance, args, kwargs):
            values = None if not switch.on or instance is None else _bound_call(original, instance, args, kwargs)
            if values is None or not values.get("on_tpu") or values.get("optimizer_closure") is None:
                return wrapped(*args, **kwargs)
            # what the original hands xm.optimizer_step besides the closure: **kwargs (1.0.7+), never *args
            _reduced_step(xla_model(), values["optimizer"], values["optimizer_closure"], values.get("kwargs") or {})
            return None

        return module_hook_fix


class LightningOptimizerFix(Fix):
    """``LightningOptimizer.__optimizer_step`` (pytorch-lightning 1.1.x): the Trainer's default
    ``optimizer_step`` and every override calling ``optimizer.step(closure=...)`` reach it.

    On TPU (``trainer.on_tpu``) with a closure: the step under the release's
    profiler section in upstream 1.9.0's order (closure, one reduction, step,
    ``mark_step``), then what the release does after its step: the RPC worker
    step where RPC is enabled, the ``on_before_zero_grad`` hook (given the
    ``LightningOptimizer`` up to 1.1.3, the wrapped optimizer from 1.1.4:
    ``hook_gets_wrapper``) and ``LightningModule.optimizer_zero_grad``.
    Otherwise the original runs.
    """

    name = "lightning-optimizer"

    def __init__(self, hook_gets_wrapper):
        self.hook_gets_wrapper = hook_gets_wrapper

    def describe(self):
        return ("on TPU with a closure: closure -> reduce_gradients -> step -> mark_step (upstream 1.9.0 order), "
                "then the release's zero_grad hooks; otherwise: original")

    def prepare(self, site, original, switch):
        xla_model = xla_model_for(original)
        hook_gets_wrapper = self.hook_gets_wrapper

        def lightning_optimizer_fix(wrapped, instance, args, kwargs):
            trainer = getattr(instance, "_trainer", None)
            if not switch.on or trainer is None or not trainer.on_tpu or kwargs.get("closure") is None:
                return wrapped(*args, **kwargs)
            values = _bound_call(original, instance, args, kwargs)
            if values is None:
                return wrapped(*args, **kwargs)
            optimizer, model = instance._optimizer, trainer.get_model()
            with trainer.profiler.profile(values["profiler_name"]):
                # the original hands xm.optimizer_step the closure and **kwargs, never *args
                _reduced_step(xla_model(), optimizer, values["closure"], values["kwargs"])
            _after_step(trainer, model, instance, values)
            trainer.train_loop.on_before_zero_grad(instance if hook_gets_wrapper else optimizer)
            model.optimizer_zero_grad(trainer.current_epoch, trainer.batch_idx, optimizer, instance._optimizer_idx)
            return None

        return lightning_optimizer_fix


def _after_step(trainer, model, lightning_optimizer, values):
    """The release's RPC worker step, as it follows the step (never enabled on TPU: kept for the same code)."""
    backend = trainer.accelerator_backend
    if backend is not None and backend.rpc_enabled and backend.ddp_plugin.is_main_rpc_process:
        backend.ddp_plugin.worker_optimizer_step(model=model, opt_idx=lightning_optimizer._optimizer_idx,
                                                 *values["args"], **values["kwargs"])

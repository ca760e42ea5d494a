"""The torch_xla integration: a guard on ``torch_xla.core.xla_model.optimizer_step`` itself.

``xm.optimizer_step(optimizer, barrier, optimizer_args, groups, pin_layout)``
reduces the gradients, then calls ``optimizer.step(**optimizer_args)``. Whoever
passes a gradient-computing ``closure`` in ``optimizer_args`` -- a framework
release this package has no row for, or a user's own loop -- gets the
reduction before the gradients exist. The guard is the net under every
framework: framework sites keep their own, more exact fixes (Lightning's
Trainer clips after the reduction), and never reach the guard once patched.

The function is patched as a module attribute, which is what ``xm.optimizer_step``
resolves at call time. Its limit: code that bound the function itself earlier
(``from torch_xla.core.xla_model import optimizer_step``) keeps the original.
"""
import inspect

from ...shape import Shape, code_names
from ...sites import make_site
from .fixes import OptimizerStepGuard

NAME = "torch_xla"
PACKAGES = frozenset(("torch_xla",))

#: ``optimizer_step``'s code from torch_xla 2.1 to 2.9: reduce, then step with the
#: caller's ``optimizer_args``.
OPTIMIZER_STEP = Shape(
    ("optimizer", "barrier", "optimizer_args", "groups", "pin_layout"),
    varkw=False,
    method=False,
    requires=("reduce_gradients", "step", "optimizer_args", "groups", "pin_layout"),
)

CALL_SITES = (
    make_site("torch_xla-2.1+", NAME, "torch_xla", "torch-xla", "torch_xla.core.xla_model", "optimizer_step",
              ">=2.1.0,<2.10", OPTIMIZER_STEP, OptimizerStepGuard(),
              note="the net under every framework: any closure passed in optimizer_args"),
)

#: Distributions whose code hands its closure to ``xm.optimizer_step`` but that no row can cover: they
#: ship compiled code only, under a licence that restricts its use and modification, so the shim never
#: patches, imports or reads them. This guard is their only net; ``status`` names them when installed
#: (found by their metadata alone) with whether it covers them. {distribution: the call, as published}.
COMPILED_ONLY = {
    "pytorch-lightning-enterprise": "XLAPrecision.optimizer_step passes the closure to xm.optimizer_step",
}


def covers(function, guards):
    """True when ``function`` hands a closure to ``xm.optimizer_step`` and that call reaches the guard.

    Two facts, both required:

    * the code can pass a closure in ``optimizer_args``: it names ``optimizer_args`` and either the
      closure itself (the Trainer plugins) or takes ``**kwargs``, in which the caller's closure travels
      (Lite and Fabric pass ``optimizer_args=kwargs``);
    * every load of ``optimizer_step`` in it resolves, now, to the patched guard (``guards``:
      {"optimizer_step": the live patched attribute}; :func:`tpu_closure_fix.calls.covers`). A
      function bound by ``from torch_xla.core.xla_model import optimizer_step`` before the shim patched
      torch_xla holds the original: its call never reaches the guard, whatever the code's names say.
    """
    from ... import calls

    code = getattr(inspect.unwrap(function), "__code__", None)
    if code is None:
        return False
    names = code_names(code)
    if "optimizer_args" not in names:
        return False
    if "closure" not in names and not code.co_flags & inspect.CO_VARKEYWORDS:
        return False
    return calls.covers(function, guards)

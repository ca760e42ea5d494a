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


def covers(function):
    """True when ``function``'s code hands a closure to ``xm.optimizer_step`` in ``optimizer_args``.

    Such code, at a framework site whose own row does not apply (an unknown
    release, an edited body), still goes through the guard when it is patched:
    the engine then reports the site ``guarded`` rather than unprotected.
    """
    code = getattr(inspect.unwrap(function), "__code__", None)
    return code is not None and {"optimizer_step", "optimizer_args", "closure"} <= code_names(code)

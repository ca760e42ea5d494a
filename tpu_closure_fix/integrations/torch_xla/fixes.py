"""The guard's fix: with a closure in ``optimizer_args``, reduce after each evaluation."""
import sys
from functools import partial

from ...fixes import Fix, FixUnavailable, barrier, reduce_after

#: ``optimizer_step``'s parameters, in order, and the defaults of every torch_xla release in the table.
_PARAMS = ("optimizer", "barrier", "optimizer_args", "groups", "pin_layout")
_DEFAULTS = {"barrier": False, "optimizer_args": {}, "groups": None, "pin_layout": True}


def _bind(args, kwargs):
    """The call's arguments by name (defaults filled in), or None when they do not fit the signature."""
    if len(args) > len(_PARAMS) or any(name not in _PARAMS for name in kwargs):
        return None
    values = dict(_DEFAULTS)
    values.update(zip(_PARAMS, args))
    for name, value in kwargs.items():
        if name in values and _PARAMS.index(name) < len(args):
            return None  # given twice: let the original raise its TypeError
        values[name] = value
    return values if "optimizer" in values else None


class OptimizerStepGuard(Fix):
    """``xm.optimizer_step`` with a closure: closure -> reduce_gradients (per evaluation) -> step -> barrier.

    The reduction is the module's own ``reduce_gradients`` with the caller's
    ``groups`` and ``pin_layout``; the barrier (``barrier=True``) is the one the
    installed release issues; the return value is ``optimizer.step``'s. Without
    a closure the original runs untouched.
    """

    name = "torch_xla-guard"

    def describe(self):
        return ("with a closure in optimizer_args: closure -> reduce_gradients (per evaluation) -> step "
                "-> barrier if barrier=True; without: original call")

    def prepare(self, site, original, switch):
        module_globals = getattr(original, "__globals__", None)
        if not module_globals or not callable(module_globals.get("reduce_gradients")):
            raise FixUnavailable("the module defines no reduce_gradients")

        def guard(wrapped, instance, args, kwargs):
            # The test every call pays, written inline (a helper's call would cost as much as the test):
            # the closure in optimizer_args, positional (third) or by keyword; anything without .get has none.
            optimizer_args = args[2] if len(args) > 2 else kwargs.get("optimizer_args")
            get = getattr(optimizer_args, "get", None)
            if not switch.on or get is None or get("closure") is None:
                return wrapped(*args, **kwargs)
            values = _bind(args, kwargs)
            if values is None:
                return wrapped(*args, **kwargs)
            optimizer = values["optimizer"]
            step_args = dict(values["optimizer_args"])
            closure = step_args.pop("closure")
            reduce = partial(module_globals["reduce_gradients"], groups=values["groups"],
                             pin_layout=values["pin_layout"])
            xm = sys.modules.get(original.__module__)
            loss = optimizer.step(closure=partial(reduce_after, xm, optimizer, closure, reduce), **step_args)
            if values["barrier"]:
                barrier(xm)
            return loss

        return guard

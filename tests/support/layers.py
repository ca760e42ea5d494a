"""Wrapper layers around a patched function, counted the same way by every probe.

A layer is a ``wrapt.FunctionWrapper`` (the shim's on a class attribute, or another
library's on top of it) or the shim's plain wrapper of a module-level function
(marked with the engine's marker attribute, holding ``__wrapped__``). Standard library
only: the probes that use it must not import wrapt or the shim before they mean to.
"""

#: The engine's marker attribute (``tpu_closure_fix.engine.MARKER``), spelled out so nothing is imported.
MARKER = "_self_tpu_closure_fix_variant"


def is_layer(obj):
    if type(obj).__name__ == "FunctionWrapper":
        return True
    return getattr(obj, MARKER, None) is not None and getattr(obj, "__wrapped__", None) is not None


def depth(obj):
    """How many layers ``obj`` has (the shim's and anyone else's)."""
    n = 0
    while is_layer(obj):
        n += 1
        obj = obj.__wrapped__
    return n


def innermost(obj):
    """The function under every layer."""
    while is_layer(obj):
        obj = obj.__wrapped__
    return obj

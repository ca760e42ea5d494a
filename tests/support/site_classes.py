"""The classes that define the call sites a probe looks at, found without importing the shim.

A probe gets its call sites as ``[module, "Class.method"]`` pairs (importing ``tpu_closure_fix`` to read
its table would activate it, and activation is what the probes observe). Only the release's own modules
are imported here.
"""
import importlib


def defining_classes(sites):
    """Yield ``(module_name, qualname, cls, attr)`` for each ``(module_name, "Class.method")`` in ``sites``
    whose module imports and whose class defines ``method`` itself.

    A module missing from the installed release, a class it lacks, and a method the class only inherits
    are all passed over: the wrapper is installed on the class that defines the method.
    """
    for module_name, qualname in sites:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        class_name, attr = qualname.rsplit(".", 1)
        cls = getattr(module, class_name, None)
        if cls is not None and attr in vars(cls):
            yield module_name, qualname, cls, attr

"""The wrapt wrappers the engine installs: pickle, copy and deepcopy like the functions they replace.

wrapt's proxies refuse to be pickled or copied (``NotImplementedError: object
proxy must define __reduce__()``): a proxy cannot know what its wrapped object
means to the program. The shim's wrappers can. They replace a function that
lives at a fixed place (``Class.method`` or a module-level function), so they
reduce exactly as that function and its bound methods do, *by reference*:

=====================================  ===========================================
the object                             pickle / copy / deepcopy
=====================================  ===========================================
``Class.method`` (function, or our     pickle: ``getattr(Class, "method")`` (the
wrapper reached through the class)     class is pickled by reference, as pickle
                                       does for a function with a dotted qualname).
                                       copy and deepcopy: the object itself (copy
                                       treats functions as atomic).
``module.function``                    pickle: the global ``module.function`` (the
                                       function itself, by reference, when its
                                       module's name still holds the original).
                                       copy and deepcopy: the object itself.
``instance.method`` (bound)            pickle and copy: ``getattr(instance,
                                       "method")`` (what a bound method's
                                       ``__reduce__`` returns); deepcopy: the same
                                       name looked up on a deep copy of the
                                       instance.
=====================================  ===========================================

So unpickling gives whatever the name holds in the loading process (the
wrapper where the shim is active, Lightning's function where it is not), and a
pickle never names ``tpu_closure_fix``: a process without the shim loads it.

wrapt binds a ``FunctionWrapper`` on attribute access by creating the class
named in its ``__bound_function_wrapper__`` attribute (wrapt 1.14 and 2.x, C
extension and pure Python alike): that is the object ``pickle`` and ``copy``
usually see, so it gets the same methods. Both classes keep wrapt's names,
``FunctionWrapper`` and ``BoundFunctionWrapper``, so code that recognises wrapt
wrappers by type name still recognises these.
"""
import copy as _copy
import functools
import pickle as _pickle
import sys
import types

import wrapt

#: How many ``__wrapped__`` layers the by-name check follows (someone may wrap on top of the shim).
_MAX_LAYERS = 64


def _attribute_path(function):
    """(module, ["Class", "method"]) naming ``function`` the way pickle does: __module__ and __qualname__."""
    module_name = getattr(function, "__module__", None)
    qualname = getattr(function, "__qualname__", None) or getattr(function, "__name__", None)
    if not module_name or not qualname:
        raise _pickle.PicklingError("Can't pickle %r: it has no __module__/__qualname__" % (function,))
    if "<locals>" in qualname.split("."):
        raise _pickle.PicklingError("Can't pickle local object %r" % (qualname,))
    module = sys.modules.get(module_name)
    if module is None:
        raise _pickle.PicklingError("Can't pickle %r: module %r is not imported" % (qualname, module_name))
    return module, qualname.split(".")


def _holds(found, wrapper, function):
    """True if ``found`` (what the name resolves to now) is ``wrapper`` or a layer around ``function``."""
    for _ in range(_MAX_LAYERS):
        if found is wrapper or found is function:
            return True
        found = getattr(found, "__wrapped__", None)
        if found is None:
            return False
    return False


def _reduce_by_name(wrapper, function):
    """The reduction of an unbound wrapper: a reference to the name ``function`` is reachable by."""
    module, path = _attribute_path(function)
    parent = module
    for part in path[:-1]:
        parent = getattr(parent, part, None)
        if parent is None:
            raise _pickle.PicklingError("Can't pickle %r: %s has no attribute path %s"
                                        % (function, module.__name__, ".".join(path)))
    name = path[-1]
    found = getattr(parent, name, None)
    if parent is module and found is wrapper:
        # A module-level function: a string reduction makes pickle store the global module.name
        # (it checks that the name holds this very object, which it does: modules do not bind).
        return name
    if parent is module and found is function:
        # The function's own module still holds the original (the wrapper was installed under another
        # name): what pickling the original gives, the function by reference. copy.copy returns a
        # function unchanged, and is a global every Python can load.
        return _copy.copy, (function,)
    if parent is module or not _holds(found, wrapper, function):
        # pickle's own rule for functions: the name must lead back to the object being pickled.
        raise _pickle.PicklingError("Can't pickle %r: it's not the same object as %s.%s"
                                    % (function, module.__name__, ".".join(path)))
    return getattr, (parent, name)


def _reduce(wrapper):
    wrapped = wrapper.__wrapped__
    if isinstance(wrapped, types.MethodType):
        # Bound (to an instance, or a classmethod to its class): exactly what the bound method reduces
        # to, getattr(its __self__, its name), so loading looks the name up on the loaded instance.
        return wrapped.__reduce__()
    return _reduce_by_name(wrapper, wrapped)


def _copy_of(wrapper):
    wrapped = wrapper.__wrapped__
    if isinstance(wrapped, types.MethodType):
        return getattr(wrapped.__self__, wrapped.__func__.__name__)  # a bound method copies to a new binding
    return wrapper  # functions are atomic for copy


def _deepcopy_of(wrapper, memo):
    wrapped = wrapper.__wrapped__
    if isinstance(wrapped, types.MethodType):
        # copy deep-copies a bound method's __self__ and binds the method to the copy.
        return getattr(_copy.deepcopy(wrapped.__self__, memo), wrapped.__func__.__name__)
    return wrapper  # functions are atomic for deepcopy


class _ByReference(object):
    """The reduction methods shared by the unbound and the bound wrapper (a mixin placed first in the MRO)."""

    def __reduce_ex__(self, protocol):
        return _reduce(self)

    def __reduce__(self):
        return _reduce(self)

    def __copy__(self):
        return _copy_of(self)

    def __deepcopy__(self, memo):
        return _deepcopy_of(self, memo)


class BoundFunctionWrapper(_ByReference, wrapt.BoundFunctionWrapper):
    """What wrapt creates when a :class:`FunctionWrapper` is reached through a class or an instance."""


class FunctionWrapper(_ByReference, wrapt.FunctionWrapper):
    """``wrapt.FunctionWrapper`` that pickles, copies and deep-copies by reference (see the module doc)."""

    __bound_function_wrapper__ = BoundFunctionWrapper


def module_function_wrapper(function, wrapper):
    """A plain function to put in place of the module-level ``function``: calls
    ``wrapper(function, None, args, kwargs)``.

    Why not a ``FunctionWrapper``: on every call of an unbound wrapper around a
    plain function, wrapt looks up the function's ``__self__`` (an AttributeError
    raised and cleared in C), about 0.6 us of the 0.8 us a pass-through costs on
    the test machine. A module attribute is never bound through a class, so
    nothing of the descriptor protocol is needed; this costs a third of that.
    It carries the function's ``__name__``, ``__qualname__``, ``__module__``,
    ``__doc__``, attributes and ``__wrapped__`` (``functools.update_wrapper``),
    so ``inspect.signature`` sees the original's parameters and pickle stores
    it by reference, as the global its module holds. Limit: like any replaced
    function, a reference taken while it is installed no longer pickles once
    the module holds the original again (after ``disable()``).
    """

    def module_function(*args, **kwargs):
        return wrapper(function, None, args, kwargs)

    return functools.update_wrapper(module_function, function)

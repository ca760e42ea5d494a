"""What every fix shares: binding a call, the on/off guard, and torch_xla at call time.

Every affected call site hands a closure that computes gradients to a step
that all-reduces *before* the closure runs. A fix does what the upstream fix in
pytorch-lightning 1.9.0 does (``_tpu_wrap_closure``)::

    closure()                    # forward, zero_grad, backward
    xm.reduce_gradients(opt)     # mean across replicas (no-op on one replica)
    optimizer.step(closure=...)
    barrier                      # xm.mark_step(), or torch_xla.sync() where that is the barrier

A fix is a small object (one class per code shape, in its integration's
``fixes`` module): ``prepare(site, original, switch)`` checks everything the
fix needs from the loaded code (and raises :class:`FixUnavailable` otherwise, so
the site is skipped, never half-patched) and returns a wrapt wrapper function
``(wrapped, instance, args, kwargs)`` built with :func:`guarded`. The wrapper
falls back to the original call whenever the call cannot be bound to the
expected parameters, and when the shim is switched off (``switch.on`` false).
"""
import inspect
import sys

from .lockstep import lockstep_loss

XLA_MODEL = "torch_xla.core.xla_model"


class FixUnavailable(Exception):
    """The loaded code lacks something this fix relies on; the site stays unpatched."""


class _Unbindable(Exception):
    pass


def xla_model():
    """torch_xla's xla_model, as ``import torch_xla.core.xla_model as xm`` gives it now.

    Exactly that statement, run at call time: it resolves ``torch_xla.core`` and
    then its ``xla_model`` attribute, so a test that replaced the attribute
    (``mock.patch("torch_xla.core.xla_model")``) gets its mock, as the
    framework's own call-time import does.
    """
    import torch_xla.core.xla_model as xm

    return xm


def xla_model_for(original):
    """A function returning torch_xla's xla_model the way ``original``'s own code obtains it.

    Code that reads a module global ``xm`` (imported at module level, as
    pytorch-lightning 1.2-1.4 and accelerate do) gets that global, looked up at
    call time; code that imports it in its body (``xm`` a local variable)
    gets :func:`xla_model`.
    """
    code = getattr(inspect.unwrap(original), "__code__", None)
    module_globals = getattr(inspect.unwrap(original), "__globals__", None)
    if code is not None and module_globals is not None and "xm" in code.co_names and "xm" not in code.co_varnames:
        return lambda: module_globals.get("xm") or xla_model()
    return xla_model


_barriers = {}


def barrier(xm):
    """Issue the barrier the installed ``xm.optimizer_step`` issues for ``barrier=True``.

    torch_xla releases that deprecate ``xm.mark_step`` call ``torch_xla.sync()``
    there instead; doing what the installed release does means the shim causes
    no DeprecationWarning. Read from the release's own code (cached per
    function), so it follows the installed release, not a version number; a
    stand-in without code (a mock) gets ``xm.mark_step()``.
    """
    step = inspect.unwrap(getattr(xm, "optimizer_step", None) or (lambda: None))
    kind = _barriers.get(step)
    if kind is None:
        code = getattr(step, "__code__", None)
        names = set(code.co_names) if code is not None else set()
        kind = _barriers[step] = "sync" if "sync" in names and "mark_step" not in names else "mark_step"
    if kind == "sync":
        import torch_xla

        torch_xla.sync()
    else:
        xm.mark_step()


def reduce_after(xm, optimizer, closure, reduce=None, mean=None):
    """Run the closure, then reduce the gradients it produced; return its result.

    The body of upstream's ``_tpu_wrap_closure``. ``reduce(optimizer)`` defaults
    to ``xm.reduce_gradients(optimizer)``. An exception from the closure
    propagates before any reduction. An optimizer that branches on the result
    gets the replica mean instead (:mod:`.lockstep`; ``mean``: over the group
    ``reduce`` reduces over, when that is not every replica).
    """
    result = closure()
    if reduce is None:
        xm.reduce_gradients(optimizer)
    else:
        reduce(optimizer)
    return lockstep_loss(xm, optimizer, result, mean)


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


def bind_with_defaults(function, args, kwargs):
    """Bind a call to a plain function's full signature (defaults applied); None if it does not fit."""
    try:
        bound = inspect.signature(function).bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    return bound.arguments


def guarded(names, switch, body, precondition=None, method=True):
    """Build the wrapt wrapper shared by every fix.

    The original runs unchanged when the shim is switched off, when a method is
    called on the class rather than an instance (``method``), when
    ``precondition(kwargs)`` is false, or when the call does not bind to
    ``names``; otherwise ``body(wrapped, args, kwargs, instance, values, extra)``
    runs the fix.
    """

    def wrapper(wrapped, instance, args, kwargs):
        if not switch.on or (method and instance is None) or (precondition is not None and not precondition(kwargs)):
            return wrapped(*args, **kwargs)
        try:
            values, extra = bind(names, args, kwargs)
        except _Unbindable:
            return wrapped(*args, **kwargs)
        return body(wrapped, args, kwargs, instance, values, extra)

    return wrapper


def has_closure(kwargs):
    """Precondition of the Lite-style fixes: the call passes a closure."""
    return kwargs.get("closure") is not None


def one_of(parameter, value, choices):
    """``value`` when it is one of ``choices``, else ValueError naming ``parameter``.

    A fix's constructor argument picks the code shape it handles; checking it when the table is built
    makes a mistyped row fail at import, not at the first training step.
    """
    if value not in choices:
        raise ValueError("%s must be %s, got %r" % (parameter, " or ".join(repr(c) for c in choices), value))
    return value


class Fix(object):
    """Base class; ``describe()`` is what the support table prints."""

    name = "fix"
    #: What the patch cannot reach, said with every ``patched`` verdict of its sites ("" for nothing).
    caveat = ""

    def describe(self):
        raise NotImplementedError

    def prepare(self, site, original, switch):
        raise NotImplementedError

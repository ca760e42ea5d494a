"""The shape guard: does the loaded function really contain the buggy call?

A release number says which code *should* be loaded; the shape says which code
*is* loaded (a vendored copy, a local patch, a backport of the upstream fix).
The check reads the function's code object, not its source file, so it works
for .pyc-only and zipped installs, costs no file I/O, and is immune to
formatting changes. It compares three things against the call-site table:

* the parameter names, in order (this is what the fix relies on to bind
  arguments: the optimizer_step argument order changed in Lightning 1.8);
* identifiers and string constants that must appear (``optimizer_step``,
  ``optimizer_args``, ``closure``, ...);
* identifiers that must not appear (``reduce_gradients``, ``_tpu_wrap_closure``
  ... i.e. signs that the upstream fix is already there).
"""
import inspect
from collections import namedtuple

ShapeResult = namedtuple("ShapeResult", "ok reason")


class Shape(object):
    """Expected shape of a call-site function (declarative; see sites.py).

    ``params``: positional parameter names after ``self`` (all of them for a
    plain function, ``method=False``), in order.
    ``varkw``: whether the function takes ``**kwargs``.
    ``requires``: names/constants that must occur in the code.
    ``forbids``: names/constants that must not occur.
    """

    __slots__ = ("params", "varkw", "requires", "forbids", "method")

    def __init__(self, params, varkw=True, requires=(), forbids=(), method=True):
        self.params = tuple(params)
        self.varkw = varkw
        self.method = method
        self.requires = frozenset(requires)
        self.forbids = frozenset(forbids)

    def __repr__(self):
        return "Shape(params=%r, varkw=%r, requires=%s, forbids=%s)" % (
            self.params,
            self.varkw,
            sorted(self.requires),
            sorted(self.forbids),
        )

    def check(self, function):
        """Return ShapeResult(ok, reason) for a plain function (not a wrapper)."""
        code = getattr(inspect.unwrap(function), "__code__", None)
        if code is None:
            return ShapeResult(False, "not a Python function (%r)" % (type(function).__name__,))
        params = code_params(code)
        if (params[1:] if self.method else params) != self.params:
            return ShapeResult(False, "parameters are %s, expected (%s)"
                               % (params, ", ".join((("self",) if self.method else ()) + self.params)))
        has_varkw = bool(code.co_flags & inspect.CO_VARKEYWORDS)
        if has_varkw != self.varkw:
            return ShapeResult(False, "**kwargs %s" % ("present" if has_varkw else "missing"))
        names = code_names(code)
        missing = sorted(self.requires - names)
        if missing:
            return ShapeResult(False, "code lacks %s" % ", ".join(missing))
        present = sorted(self.forbids & names)
        if present:
            return ShapeResult(False, "code contains %s" % ", ".join(present))
        return ShapeResult(True, "")


def code_params(code):
    """Positional parameter names of a code object, ``self`` included."""
    return tuple(code.co_varnames[: code.co_argcount])


def code_names(code):
    """Identifiers and string constants of a code object (not of nested functions)."""
    names = set(code.co_names) | set(code.co_varnames) | set(code.co_freevars) | set(code.co_cellvars)
    stack = list(code.co_consts)
    while stack:
        const = stack.pop()
        if isinstance(const, str):
            names.add(const)
        elif isinstance(const, (tuple, frozenset)):
            stack.extend(const)
    return names


def string_constant_containing(function, needle):
    """The first string constant of ``function`` that contains ``needle`` (or None).

    Used to raise exactly the installed release's error message rather than a
    copy of one release's wording.
    """
    code = getattr(inspect.unwrap(function), "__code__", None)
    if code is None:
        return None
    for const in code.co_consts:
        if isinstance(const, str) and needle in const:
            return const
    return None

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
  ... i.e. signs that the upstream fix is already there);
* for code whose order lives in a helper the method reaches (the upstream fix's
  ``self._xla_wrap_closure``), that helper, resolved on the class: which name it
  loads first (``closure`` before ``reduce_gradients``). Read from the bytecode
  in instruction order: it sees the order of straight-line code, which is what
  the helpers hold; a helper that branches between the two is judged by the
  first load of each.
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
    ``helpers``: ``(helper, (first, then))`` pairs: the class's method ``helper`` must load ``first``
    before ``then`` (checked when the class is given to :meth:`check`).
    """

    __slots__ = ("params", "varkw", "requires", "forbids", "method", "helpers")

    def __init__(self, params, varkw=True, requires=(), forbids=(), method=True, helpers=()):
        self.params = tuple(params)
        self.varkw = varkw
        self.method = method
        self.requires = frozenset(requires)
        self.forbids = frozenset(forbids)
        self.helpers = tuple(helpers)

    def __repr__(self):
        return "Shape(params=%r, varkw=%r, requires=%s, forbids=%s)" % (
            self.params,
            self.varkw,
            sorted(self.requires),
            sorted(self.forbids),
        )

    def check(self, function, owner=None):
        """Return ShapeResult(ok, reason) for a plain function (not a wrapper); ``owner``: the class the
        method is looked up on, for the helpers (without it the helpers are not checked)."""
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
        if isinstance(owner, type):
            for helper, order in self.helpers:
                problem = _helper_order(owner, helper, order)
                if problem:
                    return ShapeResult(False, problem)
        return ShapeResult(True, "")


def _helper_order(owner, helper, order):
    """Why ``owner.helper`` does not load ``order[0]`` before ``order[1]``, or None when it does."""
    import dis

    found = next((vars(klass)[helper] for klass in owner.__mro__ if helper in vars(klass)), None)
    code = getattr(inspect.unwrap(found), "__code__", None) if found is not None else None
    if code is None:
        return "%s has no Python method %s" % (owner.__name__, helper)
    first = {}
    for position, instruction in enumerate(dis.get_instructions(code)):
        if instruction.opname.startswith("LOAD") and instruction.argval in order:
            first.setdefault(instruction.argval, position)
    missing = [name for name in order if name not in first]
    if missing:
        return "its helper %s lacks %s" % (helper, ", ".join(missing))
    if first[order[0]] > first[order[1]]:
        return "its helper %s loads %s before %s" % (helper, order[1], order[0])
    return None


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

"""What a function's call of a name reaches *now*: read from its bytecode and the live objects.

A site whose own fix is not in place is protected by the torch_xla guard only if its call of
``xm.optimizer_step`` actually lands in the patched guard. Which object a call reaches is decided at
call time by the name it loads: ``xm.optimizer_step`` reads the module global ``xm`` and then its
attribute ``optimizer_step`` (the patched module attribute: the guard); ``optimizer_step`` bound by
``from torch_xla.core.xla_model import optimizer_step`` at module level reads the module global, which
holds whatever the attribute was when that import ran -- the original, when the shim patched torch_xla
later. So the names in the code say nothing; the resolved object does.

:func:`references` lists every load in a function's code (and in the code of functions, lambdas and
comprehensions nested in it) whose final name is the one asked for, with the chain it loads and the
object that chain resolves to now, read without running anything:

* a module global (``LOAD_GLOBAL``): the function's ``__globals__``, then builtins;
* a free variable of the function itself: its closure cell;
* a local (or a cell of the function, or a free variable of nested code) is resolved only when every
  store to it in the enclosing code is an import (``import a.b as x``, ``from a.b import x``): the object
  that import statement would bind now, read from ``sys.modules``; a parameter or any other assignment
  leaves it unresolved;
* each attribute after it (``LOAD_ATTR`` / ``LOAD_METHOD``) only on a module, from the module's own
  ``__dict__`` (what ``getattr`` returns for a module without ``__getattr__``); on anything else the
  chain is unresolved (an attribute of an arbitrary object may be computed).

:func:`covers` is True only when there is at least one such reference and every one resolves to one of
the given guard objects. Unresolved means "not shown to reach the guard", never "reaches it".
Limits: a call through an object held elsewhere (``self.xm.optimizer_step``, a name passed in, a
``getattr`` with a computed name) is unresolved, so such code is never called guarded.
"""
import builtins
import dis
import sys
import types
from collections import namedtuple

#: One load of the name: ``chain`` as written (``("xm", "optimizer_step")``), ``resolved`` the object it
#: reaches now (``UNRESOLVED`` when it cannot be read without running code), ``why`` a short reason.
Reference = namedtuple("Reference", "chain resolved why")


class _Unresolved(object):
    def __repr__(self):
        return "<unresolved>"


UNRESOLVED = _Unresolved()

_ATTRIBUTE_OPS = frozenset(("LOAD_ATTR", "LOAD_METHOD"))
_GLOBAL_OPS = frozenset(("LOAD_GLOBAL", "LOAD_NAME"))


def covers(function, guards):
    """True when every reference to a guard's name in ``function`` resolves to that guard.

    ``guards``: {name: guard object}, e.g. ``{"optimizer_step": <the patched xm.optimizer_step>}``.
    At least one reference must exist; one unresolved or resolving elsewhere makes it False.
    """
    found = False
    for name, guard in guards.items():
        for reference in references(function, name):
            found = True
            if reference.resolved is not guard:
                return False
    return found


def references(function, name):
    """Every :class:`Reference` in ``function`` (unwrapped) whose last name is ``name``."""
    function = _unwrap(function)
    code = getattr(function, "__code__", None)
    if not isinstance(code, types.CodeType):
        return []
    context = _Context(function)
    out = []
    _collect(code, (), name, context, out)
    return out


class _Context(object):
    """What the top-level function's names resolve against."""

    def __init__(self, function):
        self.globals = getattr(function, "__globals__", {}) or {}
        self.package = self.globals.get("__package__") or ""
        code = function.__code__
        cells = getattr(function, "__closure__", None) or ()
        self.free = dict(zip(code.co_freevars, cells))


def _unwrap(function):
    seen = set()
    while id(function) not in seen and len(seen) < 100:
        seen.add(id(function))
        inner = getattr(function, "__wrapped__", None) or getattr(function, "__func__", None)
        if inner is None:
            break
        function = inner
    return function


def _collect(code, enclosing, name, context, out):
    instructions = _instructions(code)
    scopes = (code,) + enclosing
    for index, ins in enumerate(instructions):
        base = _base_name(ins)
        if base is None:
            continue
        chain = [base]
        position = index + 1
        while position < len(instructions) and instructions[position].opname in _ATTRIBUTE_OPS:
            chain.append(instructions[position].argval)
            position += 1
        # Every prefix of the chain that ends in the name is a load of it (``xm.optimizer_step.__doc__``
        # still loads ``xm.optimizer_step``).
        if name not in chain:
            continue
        chain = tuple(chain[:chain.index(name) + 1])
        resolved, why = _resolve(ins, chain, scopes, context, instructions, code)
        out.append(Reference(chain, resolved, why))
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            _collect(constant, scopes, name, context, out)


def _base_name(ins):
    """The name a load instruction pushes (None for other instructions)."""
    op = ins.opname
    if op in _GLOBAL_OPS or op.startswith("LOAD_FAST") or op in ("LOAD_DEREF", "LOAD_CLASSDEREF",
                                                                  "LOAD_FROM_DICT_OR_DEREF"):
        value = ins.argval
        if isinstance(value, tuple):  # 3.13 LOAD_FAST_LOAD_FAST: the second name is on top
            value = value[-1]
        return value if isinstance(value, str) else None
    return None


def _resolve(ins, chain, scopes, context, instructions, code):
    """(object, why) for the load ``ins`` followed by the attribute chain."""
    first = chain[0]
    if ins.opname in _GLOBAL_OPS:
        if first in context.globals:
            value = context.globals[first]
        elif hasattr(builtins, first):
            value = getattr(builtins, first)
        else:
            return UNRESOLVED, "global %s is not bound" % first
    else:
        value, why = _resolve_local(first, scopes, context)
        if value is UNRESOLVED:
            return value, why
    for attribute in chain[1:]:
        if not isinstance(value, types.ModuleType):
            return UNRESOLVED, "%s is not a module" % ".".join(chain[:chain.index(attribute)])
        namespace = vars(value)
        if attribute not in namespace:
            return UNRESOLVED, "%s has no %s" % (value.__name__, attribute)
        value = namespace[attribute]
    return value, ""


def _resolve_local(name, scopes, context):
    """A local or cell variable: resolved only when every store to it is an import; a free variable of
    the top-level function: its closure cell."""
    for scope in scopes:
        stores = _stores(scope, name)
        if stores:
            values = [_import_binding(scope, position, context) for position in stores]
            first = values[0]
            if any(value is UNRESOLVED for value in values) or any(value is not first for value in values):
                return UNRESOLVED, "local %s is not bound by one import" % name
            return first, ""
        if name in _parameters(scope):
            return UNRESOLVED, "%s is a parameter" % name
        if name not in scope.co_freevars:
            break
    cell = context.free.get(name)
    if cell is not None:
        try:
            return cell.cell_contents, ""
        except ValueError:
            return UNRESOLVED, "free variable %s is empty" % name
    return UNRESOLVED, "local %s has no store" % name


def _parameters(code):
    count = code.co_argcount + code.co_kwonlyargcount  # co_argcount includes positional-only ones
    count += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
    return code.co_varnames[:count]


def _stores(code, name):
    """Indexes (into the filtered instruction list) of every store to ``name`` in ``code``."""
    found = []
    for index, ins in enumerate(_instructions(code)):
        if not (ins.opname.startswith("STORE_FAST") or ins.opname in ("STORE_DEREF", "STORE_NAME")):
            continue
        value = ins.argval
        names = value if isinstance(value, tuple) else (value,)
        if ins.opname == "STORE_FAST_LOAD_FAST":
            names = names[:1]
        if name in names:
            found.append(index)
    return found


_cache = {}


def _instructions(code):
    listed = _cache.get(code)
    if listed is None:
        listed = [ins for ins in dis.get_instructions(code) if ins.opname not in ("CACHE", "EXTENDED_ARG")]
        if len(_cache) > 256:
            _cache.clear()
        _cache[code] = listed
    return listed


def _import_binding(code, position, context):
    """The object the import statement ending at store ``position`` would bind now, or UNRESOLVED.

    ``IMPORT_NAME`` pushes the top-level package (no fromlist) or the named module (with one);
    each ``IMPORT_FROM`` then reads an attribute, or the submodule from ``sys.modules``.
    """
    instructions = _instructions(code)
    if instructions[position].opname not in ("STORE_FAST", "STORE_DEREF", "STORE_NAME"):
        return UNRESOLVED
    attributes, index = [], position - 1
    if index >= 0 and instructions[index].opname == "IMPORT_FROM":
        attributes.append(instructions[index].argval)
        index -= 1
    while index >= 0 and instructions[index].opname != "IMPORT_NAME":
        ops = [instructions[i].opname for i in range(max(index - 2, 0), index + 1)]
        if len(ops) == 3 and ops[0] == "IMPORT_FROM" and ops[1] in ("ROT_TWO", "SWAP") and ops[2] == "POP_TOP":
            attributes.append(instructions[index - 2].argval)  # "import a.b.c as x": a step down the chain
            index -= 3
        elif ops[-1] in ("STORE_FAST", "STORE_DEREF", "STORE_NAME") and ops[-2:-1] == ["IMPORT_FROM"]:
            index -= 2  # "from m import a, x": a sibling name read from the same module
        else:
            return UNRESOLVED  # anything else between the import and the store
    if index < 0:
        return UNRESOLVED
    if index < 2 or instructions[index - 1].opname != "LOAD_CONST" or instructions[index - 2].opname != "LOAD_CONST":
        return UNRESOLVED
    fromlist, level = instructions[index - 1].argval, instructions[index - 2].argval
    dotted = instructions[index].argval
    if level:
        try:
            from importlib.util import resolve_name

            dotted = resolve_name("." * level + dotted, context.package)
        except (ImportError, ValueError):
            return UNRESOLVED
    module = sys.modules.get(dotted if fromlist is not None or level else dotted.split(".")[0])
    if module is None:
        return UNRESOLVED
    value = module
    for attribute in reversed(attributes):
        if not isinstance(value, types.ModuleType):
            return UNRESOLVED
        namespace = vars(value)
        if attribute in namespace:
            value = namespace[attribute]
        else:
            value = sys.modules.get("%s.%s" % (value.__name__, attribute), UNRESOLVED)
            if value is UNRESOLVED:
                return UNRESOLVED
    return value

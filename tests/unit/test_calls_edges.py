"""tpu_closure_fix.calls at its edges: closures, relative imports, submodules, what each unresolved load says,
wrappers that are not functions, and the instruction shapes of other Python versions.

As in test_calls.py (whose stand-in package this file writes too), the code is real code written to
module files and imported, with a stand-in ``xla_model`` whose ``optimizer_step`` is replaced by a guard
object. The bytecode of the Python versions this interpreter does not run (3.8-3.10's first-statement
imports and ``ROT_TWO``, 3.12's ``LOAD_FROM_DICT_OR_DEREF``, 3.13's paired ``LOAD_FAST_LOAD_FAST`` /
``STORE_FAST_LOAD_FAST``) is given as instruction lists of exactly the shape those versions compile.
"""
import importlib
import sys
import types
import uuid

import pytest

from test_calls import forget, write_xla_package
from tpu_closure_fix import calls

XLA = "h4edges_xla"
USER = "h4edges_user"

USER_SOURCE = """
import types
import {xla}.core.xla_model as xm

holder = types.SimpleNamespace(optimizer_step=None)


def make_closure():
    import {xla}.core.xla_model as local_xm

    def step(opt):
        return local_xm.optimizer_step(opt)
    return step


def make_empty_closure():
    def step(opt):
        return later.optimizer_step(opt)
    return step
    later = None


def in_a_class_body():
    import {xla}.core.xla_model as local_xm

    class Holder:
        step = local_xm.optimizer_step
    return Holder


def siblings_in_cells():
    from {xla}.core.xla_model import pin, optimizer_step

    def inner():
        return optimizer_step(pin)
    return inner


def attribute_of_the_call(opt):
    return xm.optimizer_step.__name__


def not_bound_anywhere(opt):
    return nowhere.optimizer_step(opt)


def through_an_object(opt):
    return holder.optimizer_step(opt)


def through_a_module_attribute(opt):
    return xm.pin.optimizer_step(opt)


def missing_attribute(opt):
    return xm.absent.optimizer_step(opt)


def deleted_only(opt):
    del gone
    return gone.optimizer_step(opt)


def assigned_once(opt):
    local = object()
    return local.optimizer_step(opt)


def two_imports(opt):
    if opt:
        import {xla}.core.xla_model as either
    else:
        import {xla}.core as either
    return either.optimizer_step(opt)


def after_another_statement(opt):
    count = 1
    import {xla}.core.xla_model as local_xm
    return local_xm.optimizer_step(opt, count)


def a_local_named_inside_another(opt):
    import {xla}.core.xla_model as xm
    not_xm_at_all = object()
    return xm.optimizer_step(opt, not_xm_at_all)


def from_package_import_submodule(opt):
    from {xla}.core import xla_model as m
    return m.optimizer_step(opt)


def keyword_only(opt, *, xm):
    return xm.optimizer_step(opt)


def star_args(opt, *xm):
    return xm.optimizer_step(opt)


def star_kwargs(opt, **xm):
    return xm.optimizer_step(opt)


class Plain:
    def step(self, opt):
        return xm.optimizer_step(opt)
"""

RELATIVE_SOURCE = """
def relative_import_of_a_sibling(opt):
    from . import xla_model as m
    return m.optimizer_step(opt)


def relative_from_import(opt):
    from .xla_model import optimizer_step
    return optimizer_step(opt)


def relative_beyond_the_top(opt):
    from .... import xla_model as m
    return m.optimizer_step(opt)
"""


@pytest.fixture
def world(tmp_path, monkeypatch):
    """(user module, relative-import module, the guard), the guard in place after the user bound its names."""
    package = write_xla_package(tmp_path, XLA)
    (package / "relative.py").write_text(RELATIVE_SOURCE)
    (tmp_path / ("%s.py" % USER)).write_text(USER_SOURCE.format(xla=XLA))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    user = importlib.import_module(USER)
    relative = importlib.import_module(XLA + ".core.relative")
    xla_model = sys.modules[XLA + ".core.xla_model"]

    def guard(*args, **kwargs):
        return "guard"

    xla_model.optimizer_step = guard
    yield user, relative, guard
    forget(XLA, USER)


def _only(function, name="optimizer_step"):
    (reference,) = calls.references(function, name)
    return reference


# --------------------------------------------------------------------------- free variables and cells
def test_a_closure_over_an_import_reaches_what_the_cell_holds(world):
    """The returned function's only load is of a free variable: its closure cell holds the module."""
    user, _, guard = world
    step = user.make_closure()
    reference = _only(step)
    assert reference == (("local_xm", "optimizer_step"), guard, "")
    assert calls.covers(step, {"optimizer_step": guard}) is True


def test_an_empty_cell_is_unresolved():
    """A free variable whose cell was never filled cannot be read: unresolved, and said so."""
    def make():
        def step(opt):
            return later.optimizer_step(opt)
        return step
        later = None  # noqa: F841  (never runs: the cell stays empty)

    assert _only(make()) == (("later", "optimizer_step"), calls.UNRESOLVED, "free variable later is empty")


def test_a_class_body_inside_a_function_reads_the_function_s_import(world):
    """3.8-3.11 load the free name in a class body with LOAD_CLASSDEREF: still a load of the import."""
    user, _, guard = world
    assert calls.covers(user.in_a_class_body, {"optimizer_step": guard}) is True


def test_sibling_names_of_one_from_import_held_in_cells(world):
    """``from m import pin, optimizer_step`` stored into cells (STORE_DEREF): the sibling is stepped over."""
    user, _, guard = world
    assert calls.covers(user.siblings_in_cells, {"optimizer_step": guard}) is True  # read from the import
    assert calls.covers(user.siblings_in_cells(), {"optimizer_step": guard}) is True  # read from the cell


# --------------------------------------------------------------------------- what each load says
def test_an_attribute_read_of_the_call_is_a_load_of_it(world):
    user, _, guard = world
    assert _only(user.attribute_of_the_call) == (("xm", "optimizer_step"), guard, "")


@pytest.mark.parametrize("name, chain, why", [
    ("not_bound_anywhere", ("nowhere", "optimizer_step"), "global nowhere is not bound"),
    ("through_an_object", ("holder", "optimizer_step"), "holder is not a module"),
    ("through_a_module_attribute", ("xm", "pin", "optimizer_step"), "xm.pin is not a module"),
    ("missing_attribute", ("xm", "absent", "optimizer_step"), XLA + ".core.xla_model has no absent"),
    ("deleted_only", ("gone", "optimizer_step"), "local gone has no store"),
    ("assigned_once", ("local", "optimizer_step"), "local local is not bound by one import"),
    ("keyword_only", ("xm", "optimizer_step"), "xm is a parameter"),
    ("star_args", ("xm", "optimizer_step"), "xm is a parameter"),
    ("star_kwargs", ("xm", "optimizer_step"), "xm is a parameter"),
])
def test_each_unresolved_load_says_why(world, name, chain, why):
    user, _, _ = world
    assert _only(getattr(user, name)) == (chain, calls.UNRESOLVED, why)
    assert repr(calls.UNRESOLVED) == "<unresolved>"  # how an unresolved load reads in a report


def test_a_builtin_name_resolves_to_the_builtin():
    def uses_len(items):
        return len(items)

    assert _only(uses_len, "len") == (("len",), len, "")


def test_two_different_imports_into_one_name_are_not_one_binding(world):
    user, _, guard = world
    assert _only(user.two_imports).why == "local either is not bound by one import"
    assert calls.covers(user.two_imports, {"optimizer_step": guard}) is False


def test_an_import_after_other_statements(world):
    user, _, guard = world
    assert _only(user.after_another_statement) == (("local_xm", "optimizer_step"), guard, "")


def test_stores_of_other_names_are_not_stores_of_this_one(world):
    """``not_xm_at_all`` contains the text ``xm``: only a store of exactly ``xm`` counts."""
    user, _, guard = world
    assert calls.covers(user.a_local_named_inside_another, {"optimizer_step": guard}) is True


# --------------------------------------------------------------------------- relative imports, submodules
def test_relative_imports_resolve_against_the_function_s_package(world):
    _, relative, guard = world
    assert calls.covers(relative.relative_import_of_a_sibling, {"optimizer_step": guard}) is True
    assert calls.covers(relative.relative_from_import, {"optimizer_step": guard}) is True
    reference = _only(relative.relative_beyond_the_top)
    assert reference.resolved is calls.UNRESOLVED and reference.why == "local m is not bound by one import"


def test_a_submodule_missing_from_its_package_is_read_from_sys_modules(world):
    """``from pkg import sub`` binds ``sys.modules['pkg.sub']`` when ``pkg`` has no attribute ``sub``."""
    user, _, guard = world
    del sys.modules[XLA + ".core"].xla_model  # the fixture forgets every module of the package afterwards
    assert calls.covers(user.from_package_import_submodule, {"optimizer_step": guard}) is True
    del sys.modules[XLA + ".core.xla_model"]
    reference = _only(user.from_package_import_submodule)
    assert (reference.resolved, reference.why) == (calls.UNRESOLVED, "local m is not bound by one import")


# --------------------------------------------------------------------------- what is unwrapped
def test_an_object_carrying_the_function_in_func_is_looked_through(world):
    user, _, guard = world
    carrier = types.SimpleNamespace(__func__=user.Plain.step)
    assert calls.covers(carrier, {"optimizer_step": guard}) is True


def test_code_without_globals_or_closure_resolves_only_builtins():
    def uses_len(items):
        return len(items)

    bare = types.SimpleNamespace(__code__=uses_len.__code__)
    assert _only(bare, "len") == (("len",), len, "")


def test_a_cycle_of_wrappers_ends_and_a_long_chain_stops_after_100_hops():
    def first(items):
        return len(items)

    def second(items):
        return len(items) + len(items)

    first.__wrapped__, second.__wrapped__ = second, first
    assert len(calls.references(first, "len")) in (1, 2)  # one of the two, without looping forever

    def end(items):
        return len(items)

    def beyond(items):
        return len(items) + len(items) + len(items)

    end.__wrapped__ = beyond
    chain = end
    for _ in range(100):
        chain = types.SimpleNamespace(__wrapped__=chain)
    assert len(calls.references(chain, "len")) == 1  # 100 hops reach ``end``, never ``beyond``


# --------------------------------------------------------------------------- code read for the first time
def _fresh(source, namespace):
    """Compile ``source`` with its ``MARKER`` replaced by a constant never seen before: a function whose code
    object is equal to none that an earlier call has read."""
    marker = repr("fresh-%s" % uuid.uuid4().hex)
    exec(compile(source.replace("MARKER", marker), "<fresh %s>" % marker, "exec"), namespace)
    return namespace


def test_code_read_for_the_first_time_is_read_whole(world):
    user, _, guard = world
    namespace = _fresh("def step(opt):\n    return xm.optimizer_step(opt, MARKER)\n", {"xm": user.xm})
    assert calls.covers(namespace["step"], {"optimizer_step": guard}) is True
    assert calls.covers(namespace["step"], {"optimizer_step": guard}) is True  # and again, from what was kept


def test_a_long_function_s_extended_arguments_do_not_break_a_chain(world):
    """Past 256 names, LOAD_ATTR carries an EXTENDED_ARG prefix between ``xm`` and ``optimizer_step``."""
    user, _, guard = world
    names = "\n".join("    other.attribute_%d" % i for i in range(300))
    namespace = _fresh("def step(opt, other):\n%s\n    return xm.optimizer_step(opt, MARKER)\n" % names,
                       {"xm": user.xm})
    assert _only(namespace["step"]) == (("xm", "optimizer_step"), guard, "")


# --------------------------------------------------------------------------- other Python versions' bytecode
def _ins(opname, argval=None):
    return types.SimpleNamespace(opname=opname, argval=argval)


@pytest.mark.parametrize("instruction, name", [
    (_ins("LOAD_FROM_DICT_OR_DEREF", "xm"), "xm"),  # 3.12: a free name read in a class body
    (_ins("LOAD_CLASSDEREF", "xm"), "xm"),
    (_ins("LOAD_DEREF", "xm"), "xm"),
    (_ins("LOAD_FAST_LOAD_FAST", ("opt", "xm")), "xm"),  # 3.13: two loads, the second on top
    (_ins("LOAD_FAST", None), None),  # no name at all
    (_ins("LOAD_GLOBAL", 3), None),  # never anything but a name
    (_ins("LOAD_ATTR", "xm"), None),  # not a load of a name
])
def test_the_name_each_load_instruction_pushes(instruction, name):
    assert calls._base_name(instruction) == name


def _binding(monkeypatch, instructions, store, package=""):
    key = object()
    monkeypatch.setattr(calls, "_instructions", lambda code: instructions if code is key else [])
    return calls._import_binding(key, store, types.SimpleNamespace(package=package))


def test_an_import_that_is_a_function_s_first_statement(world, monkeypatch):
    """3.8-3.10 have no RESUME: ``import m as x`` first in a function starts at instruction 0."""
    shape = [_ins("LOAD_CONST", 0), _ins("LOAD_CONST", None), _ins("IMPORT_NAME", XLA), _ins("STORE_FAST", "x")]
    assert _binding(monkeypatch, shape, 3) is sys.modules[XLA]


def test_a_first_statement_that_assigns_another_name_binds_nothing(monkeypatch):
    """3.8-3.10: ``xm = other`` first in a function is LOAD_GLOBAL at instruction 0, then the store."""
    assert _binding(monkeypatch, [_ins("LOAD_GLOBAL", "other"), _ins("STORE_FAST", "xm")], 1) is calls.UNRESOLVED


def test_an_import_of_a_dotted_name_with_rot_two(world, monkeypatch):
    """3.8-3.10 compile ``import a.b.c as x`` with ROT_TWO where 3.11 has SWAP."""
    user, _, guard = world
    shape = [_ins("RESUME"), _ins("LOAD_CONST", 0), _ins("LOAD_CONST", None),
             _ins("IMPORT_NAME", XLA + ".core.xla_model"),
             _ins("IMPORT_FROM", "core"), _ins("ROT_TWO"), _ins("POP_TOP"), _ins("IMPORT_FROM", "xla_model"),
             _ins("STORE_FAST", "x")]
    assert _binding(monkeypatch, shape, 8) is sys.modules[XLA + ".core.xla_model"]


@pytest.mark.parametrize("between", [
    [_ins("LOAD_FAST", "optimizer_step"), _ins("CALL"), _ins("POP_TOP")],  # a call's result discarded
    [_ins("LOAD_CONST", 1), _ins("STORE_FAST", "y")],  # another assignment
    [_ins("IMPORT_FROM", "optimizer_step"), _ins("LOAD_FAST", "y")],  # an import whose value is not stored
], ids=["discarded-call", "other-assignment", "unstored-import"])
def test_anything_else_between_the_import_and_the_store_is_unresolved(world, monkeypatch, between):
    shape = [_ins("RESUME"), _ins("LOAD_CONST", 0), _ins("LOAD_CONST", None),
             _ins("IMPORT_NAME", XLA + ".core.xla_model")] + between + [_ins("STORE_FAST", "x")]
    assert _binding(monkeypatch, shape, len(shape) - 1) is calls.UNRESOLVED


def test_a_store_that_is_not_a_store_instruction_binds_nothing(world, monkeypatch):
    shape = [_ins("RESUME"), _ins("LOAD_CONST", 0), _ins("LOAD_CONST", None), _ins("IMPORT_NAME", XLA),
             _ins("STORE_ATTR", "x")]
    assert _binding(monkeypatch, shape, 4) is calls.UNRESOLVED


def test_paired_stores_of_3_13(monkeypatch):
    """STORE_FAST_STORE_FAST stores both names; STORE_FAST_LOAD_FAST stores the first and loads the second."""
    key = object()
    shape = [_ins("RESUME"), _ins("STORE_FAST_STORE_FAST", ("a", "b")), _ins("STORE_FAST_LOAD_FAST", ("c", "d")),
             _ins("STORE_FAST", "abcd")]
    monkeypatch.setattr(calls, "_instructions", lambda code: shape if code is key else [])
    assert [calls._stores(key, name) for name in ("a", "b", "c", "d", "abcd")] == [[1], [1], [2], [], [3]]

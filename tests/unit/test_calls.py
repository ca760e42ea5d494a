"""tpu_closure_fix.calls: what a function's load of a name reaches now, from bytecode and live objects.

Each case is real code written to a module file and imported (the shapes Lightning, accelerate and a
user's loop use), a stand-in ``xla_model`` module whose ``optimizer_step`` is then replaced by a
"guard" object, exactly as the shim patches torch_xla after (or before) the user's module bound it.
"""
import importlib
import sys
import textwrap

import pytest

from tpu_closure_fix import calls

XLA = "h4calls_xla"
USER = "h4calls_user"

XLA_SOURCE = """
def optimizer_step(optimizer, barrier=False, optimizer_args=None, groups=None, pin_layout=True):
    return "original"
pin = 1
"""

USER_SOURCE = """
import {xla}.core.xla_model as xm
from {xla}.core.xla_model import optimizer_step
from {xla}.core import xla_model

def attribute_of_module_global(opt, **kwargs):
    return xm.optimizer_step(opt, optimizer_args=kwargs)

def name_bound_by_module_from_import(opt, **kwargs):
    return optimizer_step(opt, optimizer_args=kwargs)

def local_import_as(opt, **kwargs):
    import {xla}.core.xla_model as local_xm
    return local_xm.optimizer_step(opt, optimizer_args=kwargs)

def local_from_import_with_a_sibling(opt, **kwargs):
    from {xla}.core.xla_model import pin, optimizer_step
    return optimizer_step(opt, optimizer_args=kwargs)

def local_plain_import(opt, **kwargs):
    import {xla}.core.xla_model
    return {xla}.core.xla_model.optimizer_step(opt, optimizer_args=kwargs)

def from_package_import_module(opt, **kwargs):
    return xla_model.optimizer_step(opt, optimizer_args=kwargs)

def module_passed_in(opt, xm, **kwargs):
    return xm.optimizer_step(opt, optimizer_args=kwargs)

def local_reassigned(opt, **kwargs):
    import {xla}.core.xla_model as local_xm
    if kwargs:
        local_xm = object()
    return local_xm.optimizer_step(opt, optimizer_args=kwargs)

def one_path_through_the_early_binding(opt, **kwargs):
    if kwargs.get("x"):
        return xm.optimizer_step(opt, optimizer_args=kwargs)
    return optimizer_step(opt, optimizer_args=kwargs)

def nested_closure(opt, **kwargs):
    import {xla}.core.xla_model as local_xm
    def inner():
        return local_xm.optimizer_step(opt, optimizer_args=kwargs)
    return (lambda: xm.optimizer_step(opt))() or inner()

def no_call(opt, **kwargs):
    return opt.step(**kwargs)
"""


def write_xla_package(root, name):
    """A stand-in package ``<name>.core.xla_model`` under ``root``; returns its ``core`` folder."""
    package = root / name / "core"
    package.mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "xla_model.py").write_text(XLA_SOURCE)
    return package


def forget(*prefixes):
    """Drop every module whose name starts with one of ``prefixes`` from ``sys.modules``."""
    for name in [n for n in sys.modules if n.startswith(prefixes)]:
        del sys.modules[name]


@pytest.fixture
def modules(tmp_path, monkeypatch):
    write_xla_package(tmp_path, XLA)
    monkeypatch.syspath_prepend(str(tmp_path))

    def load(patch_first):
        """Import the user's module; ``patch_first``: put the guard in place before it binds its names."""
        forget(XLA, USER)
        (tmp_path / ("%s.py" % USER)).write_text(USER_SOURCE.format(xla=XLA))
        importlib.invalidate_caches()
        xla_model = importlib.import_module(XLA + ".core.xla_model")

        def guard(*args, **kwargs):
            return "guard"

        if patch_first:
            xla_model.optimizer_step = guard
        user = importlib.import_module(USER)
        xla_model.optimizer_step = guard
        return user, guard

    yield load
    forget(XLA, USER)


# name -> covered when the shim patched after the module bound its names (enabled late), and before.
CASES = {
    "attribute_of_module_global": (True, True),
    "name_bound_by_module_from_import": (False, True),  # holds the original when bound first
    "local_import_as": (True, True),
    "local_from_import_with_a_sibling": (True, True),  # runs at call time: reads the guard
    "local_plain_import": (True, True),
    "from_package_import_module": (True, True),
    "module_passed_in": (False, False),  # a parameter: cannot be read without running the caller
    "local_reassigned": (False, False),  # one store is not an import
    "one_path_through_the_early_binding": (False, True),  # every path must reach the guard
    "nested_closure": (True, True),
    "no_call": (False, False),  # nothing reaches optimizer_step at all
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("patch_first", [False, True], ids=["enabled-late", "enabled-first"])
def test_covers_follows_what_the_call_resolves_to(modules, name, patch_first):
    user, guard = modules(patch_first)
    assert calls.covers(getattr(user, name), {"optimizer_step": guard}) is CASES[name][patch_first]


def test_a_call_is_judged_by_the_object_and_not_by_its_name(modules):
    """The early from-import's call runs the original function: covers says so, and the call shows it."""
    user, guard = modules(patch_first=False)
    function = user.name_bound_by_module_from_import
    (reference,) = calls.references(function, "optimizer_step")
    assert reference.chain == ("optimizer_step",) and reference.resolved is not guard
    assert function(None) == "original"
    assert user.attribute_of_module_global(None) == "guard"


def test_unresolved_references_say_why(modules):
    user, guard = modules(patch_first=True)
    (reference,) = calls.references(user.module_passed_in, "optimizer_step")
    assert reference.resolved is calls.UNRESOLVED and "parameter" in reference.why


def test_covers_looks_under_functools_wraps(modules):
    import functools

    user, guard = modules(patch_first=False)

    @functools.wraps(user.attribute_of_module_global)
    def wrapper(*args, **kwargs):
        return None

    assert calls.covers(wrapper, {"optimizer_step": guard}) is True


def test_code_without_bytecode_is_not_covered():
    assert calls.covers(len, {"optimizer_step": object()}) is False
    assert calls.references(object(), "optimizer_step") == []


def test_exec_source_is_read_the_same(modules):
    """Code compiled from a string (no file): bytecode is all ``calls`` needs."""
    user, guard = modules(patch_first=False)
    namespace = {"xm": sys.modules[XLA + ".core.xla_model"]}
    exec(compile(textwrap.dedent("""
        def step(opt, **kwargs):
            return xm.optimizer_step(opt, optimizer_args=kwargs)
        """), "<string>", "exec"), namespace)
    assert calls.covers(namespace["step"], {"optimizer_step": guard}) is True

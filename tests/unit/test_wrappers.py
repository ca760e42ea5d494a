"""The shim's wrappers pickle, copy and deep-copy like the functions they replace: by reference.

A plain class stands for a Lightning class whose method the shim wraps (and a subclass that inherits
it, like the bf16 plugin), and a module-level function for a patched function such as torch_xla's.
Every observation is made twice, on the original objects and with the shim's wrappers installed in
their place (exactly what the engine does: ``setattr(owner, name, FunctionWrapper(original, fix))``),
and must be the same; with the wrappers, every result must still call through the wrapper.
"""
import copy
import inspect
import os
import pickle
import subprocess
import sys
import types

import pytest
import wrapt

from tpu_closure_fix import wrappers

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


class Plugin(object):
    def __init__(self, tag=0):
        self.tag = tag

    def step(self, value):
        return ("step", self.tag, value)


class Bf16Plugin(Plugin):
    """Inherits ``step``, like TPUBf16PrecisionPlugin."""


def helper(value):
    return ("helper", value)


ORIGINAL_STEP = vars(Plugin)["step"]
ORIGINAL_HELPER = helper
THROUGH_SHIM = []


def through_shim(wrapped, instance, args, kwargs):
    THROUGH_SHIM.append(getattr(wrapped, "__name__", "?"))
    return wrapped(*args, **kwargs)


def install_shim():
    Plugin.step = wrappers.FunctionWrapper(ORIGINAL_STEP, through_shim)
    globals()["helper"] = wrappers.FunctionWrapper(ORIGINAL_HELPER, through_shim)


def remove_shim():
    Plugin.step = ORIGINAL_STEP
    globals()["helper"] = ORIGINAL_HELPER


def subjects(instance):
    """name -> (object, how to call it, what the name holds now for comparison)."""
    return {
        "Plugin.step": (Plugin.step, lambda f: f(Plugin(7), 1), lambda: Plugin.step),
        "Bf16Plugin.step": (Bf16Plugin.step, lambda f: f(Plugin(7), 1), lambda: Bf16Plugin.step),
        "instance.step": (instance.step, lambda f: f(1), None),
        "helper": (globals()["helper"], lambda f: f(1), lambda: globals()["helper"]),
    }


def describe(result, subject, instance, call, current):
    """What a program can observe of a pickled/copied function or method (not whether a shim wraps it)."""
    bound_to = getattr(result, "__self__", None)
    now = current() if current else getattr(bound_to, "step", None)
    return {
        "bound to": ("the same instance" if bound_to is instance else
                     "a copy of it" if isinstance(bound_to, Plugin) and bound_to.tag == instance.tag else
                     repr(bound_to)),
        "function": inspect.unwrap(getattr(result, "__func__", result)).__qualname__,
        "same object": result is subject,
        "equals what the name holds now": result == now,
        "call": call(result),
    }


def observe(protocols=range(pickle.HIGHEST_PROTOCOL + 1)):
    instance = Plugin(tag=5)
    out = {}
    for name, (subject, call, current) in subjects(instance).items():
        for protocol in protocols:
            loaded = pickle.loads(pickle.dumps(subject, protocol))
            if name == "instance.step":  # the pickled instance is a new one: compare with the one loaded
                instance_seen = loaded.__self__
                out[name, "pickle", protocol] = describe(loaded, subject, instance_seen, call, None)
            else:
                out[name, "pickle", protocol] = describe(loaded, subject, instance, call, current)
        out[name, "copy"] = describe(copy.copy(subject), subject, instance, call, current)
        out[name, "deepcopy"] = describe(copy.deepcopy(subject), subject, instance, call, current)
        holder = {"f": subject, "instance": instance}
        twin = copy.deepcopy(holder)  # in a structure: a bound method follows the deep-copied instance
        out[name, "deepcopy in a dict"] = describe(twin["f"], subject, twin["instance"], call, current)
    return out


def test_original_observations_are_as_python_defines_them():
    """Pins the behaviour being matched, so the shim test below compares against something real."""
    seen = observe()
    assert seen["Plugin.step", "pickle", 4]["same object"] is True
    assert seen["instance.step", "pickle", 2]["bound to"] == "the same instance"  # i.e. the loaded one
    assert seen["instance.step", "copy"]["bound to"] == "the same instance"
    assert seen["instance.step", "deepcopy"]["bound to"] == "a copy of it"
    assert seen["instance.step", "deepcopy in a dict"]["bound to"] == "the same instance"
    assert seen["Bf16Plugin.step", "pickle", 0]["function"] == "Plugin.step"
    assert seen["helper", "deepcopy"]["same object"] is True


def test_wrappers_pickle_copy_and_deepcopy_as_the_originals():
    expected = observe()  # the twin: the originals
    install_shim()
    try:
        seen = observe()
    finally:
        remove_shim()
    # Identity of a class-accessed method cannot match: wrapt binds a new wrapper on every access
    # (``Plugin.step is Plugin.step`` is False with any wrapt wrapper); equality does match.
    for key in seen:
        if key[0] in ("Plugin.step", "Bf16Plugin.step") and key[1] == "pickle":
            assert seen[key]["same object"] is False and expected[key]["same object"] is True
            seen[key]["same object"] = True
    assert seen == expected


def test_every_result_calls_through_the_wrapper():
    install_shim()
    try:
        assert isinstance(vars(Plugin)["step"], wrappers.FunctionWrapper)
        del THROUGH_SHIM[:]
        seen = observe(protocols=[pickle.HIGHEST_PROTOCOL])
    finally:
        remove_shim()
    assert len(THROUGH_SHIM) == len(seen)  # one wrapped call per observation: none bypassed the shim
    del THROUGH_SHIM[:]
    observe(protocols=[pickle.HIGHEST_PROTOCOL])
    assert THROUGH_SHIM == []  # the twin: the originals never call it


def test_wrapt_wrapper_refuses_twin():
    """The bug being fixed: wrapt's own wrapper cannot be pickled, copied or deep-copied."""
    Plugin.step = wrapt.FunctionWrapper(ORIGINAL_STEP, through_shim)
    try:
        for action in (pickle.dumps, copy.copy, copy.deepcopy):
            for subject in (Plugin.step, Plugin(1).step):
                with pytest.raises(NotImplementedError):
                    action(subject)
    finally:
        remove_shim()


def test_the_bound_wrapper_class_is_ours():
    install_shim()
    try:
        assert type(Plugin.step) is wrappers.BoundFunctionWrapper
        assert type(Plugin(1).step) is wrappers.BoundFunctionWrapper
        assert type(vars(Plugin)["step"]) is wrappers.FunctionWrapper
    finally:
        remove_shim()


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickle_never_names_the_shim_and_loads_without_it(protocol):
    install_shim()
    try:
        data = {name: pickle.dumps(subject, protocol) for name, (subject, _, _) in subjects(Plugin(3)).items()}
    finally:
        remove_shim()
    assert not any(b"tpu_closure_fix" in blob for blob in data.values())
    code = ("import pickle, sys, test_wrappers\n"
            "for line in sys.stdin.read().split():\n"
            "    obj = pickle.loads(bytes.fromhex(line))\n"
            "    print(type(obj).__name__, getattr(obj, '__qualname__', '?'))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, REPO]), TPU_CLOSURE_FIX="0")
    proc = subprocess.run([sys.executable, "-c", code], input="\n".join(b.hex() for b in data.values()),
                          capture_output=True, text=True, env=env, timeout=120, cwd=HERE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:4] == ["function Plugin.step", "function Plugin.step", "method Plugin.step",
                                           "function helper"]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_wrapper_installed_under_another_name_pickles_as_the_function(protocol):
    """A module-level wrapper set on another module object (an alias, as a stand-in module is): its
    function's home module still holds the original, which is what pickling the original gives."""
    alias = types.ModuleType("alias_of_test_wrappers")
    alias.helper = wrappers.FunctionWrapper(ORIGINAL_HELPER, through_shim)
    assert pickle.loads(pickle.dumps(ORIGINAL_HELPER, protocol)) is ORIGINAL_HELPER  # the twin
    assert pickle.loads(pickle.dumps(alias.helper, protocol)) is ORIGINAL_HELPER
    assert copy.deepcopy(alias.helper) is alias.helper and copy.copy(alias.helper) is alias.helper


def test_unreachable_function_refuses_like_the_original():
    def local(value):
        return value

    with pytest.raises((pickle.PicklingError, AttributeError)):
        pickle.dumps(local)  # the twin
    with pytest.raises(pickle.PicklingError):
        pickle.dumps(wrappers.FunctionWrapper(local, through_shim))


def _install_module_function_wrapper(module, name, calls):
    original = getattr(module, name)

    def fix(wrapped, instance, args, kwargs):
        calls.append((instance, args, kwargs))
        return wrapped(*args, **kwargs)

    wrapper = wrappers.module_function_wrapper(original, fix)
    setattr(module, name, wrapper)
    return original, wrapper


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_module_function_wrapper_behaves_like_the_function_it_replaces(protocol):
    """The plain wrapper of a module-level function: called with instance None, the original's signature and
    names, pickled by reference as the global its module holds, copied as itself; the twin is the original."""
    module = sys.modules[__name__]
    calls = []
    assert pickle.loads(pickle.dumps(ORIGINAL_HELPER, protocol)) is ORIGINAL_HELPER  # the twin
    original, wrapper = _install_module_function_wrapper(module, "helper", calls)
    try:
        assert wrapper(3) == ("helper", 3) and calls == [(None, (3,), {})]
        assert wrapper(value=4) == ("helper", 4) and calls[-1] == (None, (), {"value": 4})
        assert inspect.signature(wrapper) == inspect.signature(original)
        assert (wrapper.__name__, wrapper.__qualname__, wrapper.__module__) == \
            (original.__name__, original.__qualname__, original.__module__)
        assert wrapper.__wrapped__ is original and inspect.unwrap(wrapper) is original
        assert pickle.loads(pickle.dumps(wrapper, protocol)) is wrapper
        assert copy.copy(wrapper) is wrapper and copy.deepcopy(wrapper) is wrapper
    finally:
        setattr(module, "helper", original)
    # The stated limit: once the module holds the original again, the old reference no longer pickles.
    with pytest.raises(pickle.PicklingError):
        pickle.dumps(wrapper, protocol)


def test_module_function_wrapper_is_not_wrapts_call_path():
    """Why it exists: wrapt's unbound FunctionWrapper probes ``__self__`` on each call; ours is a plain function."""
    wrapper = wrappers.module_function_wrapper(ORIGINAL_HELPER, through_shim)
    assert type(wrapper) is types.FunctionType and not isinstance(wrapper, wrapt.ObjectProxy)

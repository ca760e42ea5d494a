"""The engine over time, in process: enable before or after the import, the import hook, reload, reconcile,
disable -- on a private package imported for real (support/engine_world.py), with wrapt's real hooks."""
import contextlib
import importlib
import sys
import threading
import types
import warnings

import pytest

from support.engine_world import World, world  # noqa: F401 (a fixture)
from tpu_closure_fix import engine, settings, sites
from tpu_closure_fix.config import TPUClosureFixWarning


def _warnings(action):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = action()
    return result, [str(w.message) for w in seen if w.category is TPUClosureFixWarning]


def _hooks(name):
    import wrapt.importer as importer

    return list(importer._post_import_hooks.get(name) or [])


@pytest.fixture
def late_warning(monkeypatch):
    """The integrations are one fake whose late_enable_warning says how often it was asked."""
    asked = []

    def late_enable_warning():
        asked.append(True)
        return "steps already ran unfixed"

    fake = types.SimpleNamespace(NAME="fake", CALL_SITES=(), late_enable_warning=late_enable_warning)
    silent = types.SimpleNamespace(NAME="silent", CALL_SITES=(), late_enable_warning=lambda: None)
    monkeypatch.setattr(engine._integrations, "load", lambda: [types.SimpleNamespace(NAME="none"), silent, fake])
    return asked


def test_enabled_before_the_import_the_hook_patches_it(world, late_warning):
    w = world(import_now=False, arm_reload=True)
    (row,) = w.table(w.row("Base.step"))
    result, messages = _warnings(engine.enable)
    assert result is True and messages == []
    assert engine.is_enabled() and engine._state.pending == {w.mod}
    assert engine.examine(w.key("Base.step")).verdict == engine.NOT_IMPORTED
    assert engine._on_import in _hooks(w.mod)
    _, messages = _warnings(w.load)
    assert engine.examine(w.key("Base.step")) == engine.Finding(engine.PATCHED, "", row, "1.5", None)
    assert engine._state.pending == set() and messages == []
    assert late_warning == []
    assert _hooks(w.mod) == [engine._on_import]  # the fired hook put itself back: a reload patches again  # nothing was imported before enable(): no step can have run unfixed


def test_enable_twice_before_the_import_registers_one_hook(world):
    w = world(import_now=False)
    w.table(w.row("Base.step"))
    engine.enable()
    engine.enable()
    assert _hooks(w.mod).count(engine._on_import) == 1


def test_enabled_after_the_import_patches_now_and_asks_about_steps_already_run(world, late_warning):
    w = world(arm_reload=True)
    w.table(w.row("Base.step"))
    result, messages = _warnings(engine.enable)
    assert engine.examine(w.key("Base.step")).verdict == engine.PATCHED
    assert messages == ["steps already ran unfixed"] and late_warning == [True]
    assert engine._on_import in _hooks(w.mod)  # armed for a reload
    assert engine._state.processed == {w.mod: id(w.module)}
    _, messages = _warnings(engine.enable)  # nothing newly patched: not asked again
    assert late_warning == [True] and messages == []


def test_a_late_enable_that_patches_nothing_asks_nothing(world, late_warning):
    w = world()
    w.table(w.row("Plain.step"))  # skipped: nothing newly patched
    _warnings(engine.enable)
    assert late_warning == []


def test_the_hook_before_enable_patches_nothing(world):
    w = world(import_now=False)
    w.table(w.row("Base.step"))
    engine._state.pending.add(w.mod)
    module = w.load()
    engine._on_import(module)
    assert engine._state.pending == set()
    assert not engine.is_ours(vars(module.Base)["step"])
    assert engine.examine(w.key("Base.step")).verdict == engine.DISABLED


def test_the_hook_patches_once_enabled(world):
    w = world()
    w.table(w.row("Base.step"))
    engine._state.enabled = engine._state.switch.on = True
    engine._on_import(w.module)
    assert engine.is_ours(vars(w.module.Base)["step"])
    assert engine._state.processed[w.mod] == id(w.module)


def test_a_reload_is_patched_again(world):
    w = world(arm_reload=True)
    (row,) = w.table(w.row("Base.step"))
    engine.enable()
    old_class = w.module.Base
    module = importlib.reload(w.module)
    assert module.Base is not old_class
    assert engine.is_ours(vars(module.Base)["step"]), "the reloaded class holds the original"
    assert engine.examine(w.key("Base.step")) == engine.Finding(engine.PATCHED, "", row, "1.5", None)
    assert module.Base().step(types.SimpleNamespace(step=lambda closure: "stepped"), None) == ("fixed", "stepped")


def test_arm_for_reload_puts_the_hook_back_once(world):
    w = world(arm_reload=True)
    engine._arm_for_reload(w.mod)
    engine._arm_for_reload(w.mod)
    assert _hooks(w.mod) == [engine._on_import]
    engine._arm_for_reload("")  # no name: nothing
    assert "" not in __import__("wrapt.importer").importer._post_import_hooks


def test_reconcile_patches_a_module_imported_without_its_hook(world):
    w = world(import_now=False)
    (row, other) = w.table(w.row("Base.step"), w.row("Override.step"))
    engine.enable()
    assert engine.reconcile() == []  # nothing imported yet
    assert engine._state.pending == {w.mod} and engine._state.processed == {}
    import importlib.util

    importlib.import_module(w.top)
    path = sys.modules[w.top].__path__[0]
    spec = importlib.util.spec_from_file_location(w.mod, path + "/mod.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[w.mod] = module  # by hand: no import hook fires
    spec.loader.exec_module(module)
    w.module = module
    assert engine.examine(w.key("Base.step")).verdict == engine.PATCHABLE
    keys, messages = _warnings(engine.reconcile)
    assert keys == [w.key("Base.step"), w.key("Override.step")]
    assert messages == ["tpu-closure-fix: %s was imported without its import hook running (another import hook "
                        "ahead of wrapt's, or a failed hook registration); patched it late, at %s:Base.step, "
                        "%s:Override.step" % (w.mod, w.mod, w.mod)]
    assert engine.examine(w.key("Base.step")) == engine.Finding(engine.PATCHED, "", row, "1.5", None)
    assert w.mod not in engine._state.pending
    assert _warnings(engine.reconcile) == ([], [])  # processed: never again


def test_reconcile_of_a_module_with_nothing_to_patch_says_nothing(world):
    w = world()
    w.table(w.row("Plain.step"))
    engine._state.enabled = engine._state.switch.on = True
    keys, messages = _warnings(engine.reconcile)
    assert keys == [] and not [m for m in messages if "without its import hook" in m]
    assert engine._state.processed[w.mod] == id(w.module)


def test_reconcile_while_disabled_does_nothing(world):
    w = world()
    w.table(w.row("Base.step"))
    assert engine.reconcile() == []
    assert not engine.is_ours(vars(w.module.Base)["step"]) and engine._state.processed == {}


def test_disable_restores_the_exact_original_and_a_second_enable_patches_again(world):
    w = world()
    w.table(w.row("Base.step"))
    original = vars(w.module.Base)["step"]
    engine.enable()
    assert vars(w.module.Base)["step"] is not original
    assert engine.disable("because") is True
    assert vars(w.module.Base)["step"] is original and engine._state.patches == {}
    assert engine.examine(w.key("Base.step")).reason == "because"
    engine.disable()
    assert engine.is_enabled() is False and engine._state.switch.on is False
    assert engine.examine(w.key("Base.step")).reason == "tpu_closure_fix.disable() was called"
    engine.enable()
    assert engine.examine(w.key("Base.step")).verdict == engine.PATCHED


def test_a_wrapper_that_cannot_be_removed_passes_through(world):
    w = world()
    w.table(w.row("Base.step"))
    engine.enable()
    ours = vars(w.module.Base)["step"]
    on_top = lambda self, *args: ours(self, *args)  # noqa: E731 - someone wrapped on top of ours
    w.monkeypatch.setattr(w.module.Base, "step", on_top)
    engine.disable("off")
    assert vars(w.module.Base)["step"] is on_top  # left in place
    optimizer = types.SimpleNamespace(step=lambda closure: "stepped")
    assert w.module.Base().step(optimizer, None) == "stepped"  # the original's result: passed through


def test_set_disabled_reason_only_while_disabled(world):
    w = world()
    w.table(w.row("Base.step"))
    engine.set_disabled_reason("TPU_CLOSURE_FIX=0")
    assert engine.examine(w.key("Base.step")).reason == "TPU_CLOSURE_FIX=0"
    engine.enable()
    engine.set_disabled_reason("ignored")
    assert engine._state.disabled_reason == "TPU_CLOSURE_FIX=0"


def test_without_wrapt_enable_refuses_and_says_why(world, monkeypatch):
    w = world()
    w.table(w.row("Base.step"))
    monkeypatch.setitem(sys.modules, "wrapt", None)
    result, messages = _warnings(engine.enable)
    assert result is False and not engine.is_enabled()
    assert engine._state.disabled_reason.startswith("wrapt is not importable (")
    assert engine._state.disabled_reason.endswith("); pip install 'wrapt>=1.14'")
    assert messages == ["tpu-closure-fix is inactive: %s. Every call site runs unpatched."
                        % engine._state.disabled_reason]


def test_a_hook_that_cannot_be_registered_is_warned_about(world, monkeypatch):
    w = world(import_now=False)
    w.table(w.row("Base.step"))
    import wrapt

    def refuse(hook, name):
        raise RuntimeError("no")

    monkeypatch.setattr(wrapt, "register_post_import_hook", refuse)
    _, messages = _warnings(engine.enable)
    assert messages == ["tpu-closure-fix: cannot watch %s: no" % w.mod]
    assert engine._state.pending == set()


def test_the_integrations_named_by_the_variable_are_read_at_enable(world, monkeypatch):
    w = world()
    w.table(w.row("Base.step"))
    monkeypatch.setenv("TPU_CLOSURE_FIX_DISABLE", "accelerate")
    settings.reload()
    engine.enable()
    assert engine._state.switched_off == {"accelerate": "TPU_CLOSURE_FIX_DISABLE names accelerate"}
    assert sites.CALL_SITES[0].integration == "accelerate"
    assert engine.examine(w.key("Base.step")).verdict == engine.DISABLED


def test_the_hook_never_raises_and_warns_once_per_module(world, monkeypatch):
    w = world()
    w.table(w.row("Base.step"))

    def broken(name):
        raise RuntimeError("hook state broken")

    monkeypatch.setattr(engine, "_arm_for_reload", broken)
    other = types.ModuleType("tcf_rules_other_module")
    _, messages = _warnings(lambda: [engine._on_import(m) for m in (w.module, w.module, other)])
    assert messages == ["tpu-closure-fix: import hook failed for %r: hook state broken" % (m,)
                        for m in (w.module, other)]


def test_the_hook_given_a_nameless_object_does_nothing(world):
    w = world()
    w.table(w.row("Base.step"))
    engine._state.pending.add(w.mod)
    _, messages = _warnings(lambda: engine._on_import(object()))  # not enabled: nothing to patch, nothing said
    assert messages == [] and engine._state.pending == {w.mod} and engine._state.processed == {}


def test_arm_for_reload_installs_wrapts_finder_first_when_missing(world, monkeypatch):
    import wrapt.importer as importer

    w = world(arm_reload=True)
    monkeypatch.setattr(importer, "_post_import_hooks_init", False)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    before = len(sys.meta_path)
    engine._arm_for_reload(w.mod)
    assert importer._post_import_hooks_init is True
    assert isinstance(sys.meta_path[0], importer.ImportHookFinder) and len(sys.meta_path) == before + 1
    engine._arm_for_reload(w.top)  # installed once
    assert len(sys.meta_path) == before + 1


def test_arm_for_reload_keeps_the_other_hooks(world):
    import wrapt.importer as importer

    w = world(arm_reload=True)
    other = lambda module: None  # noqa: E731
    importer._post_import_hooks[w.mod] = [other]
    engine._arm_for_reload(w.mod)
    assert _hooks(w.mod) == [other, engine._on_import]


def test_a_second_enable_patches_a_module_imported_by_hand_after_a_pending_one(world):
    w = world(import_now=False)
    second = types.ModuleType(w.top + ".second")
    exec("def optimizer_step(optimizer, optimizer_args):\n    return optimizer.step(**optimizer_args)\n",
         second.__dict__)
    from support.engine_world import GUARD

    importlib.import_module(w.top)  # the package (its release), not the watched module
    w.table(w.row("Base.step"), w.row("optimizer_step", shape=GUARD, module=second.__name__))
    engine.enable()
    assert engine._state.pending == {w.mod, second.__name__}
    engine._state.pending.discard(second.__name__)  # its hook "fired" without the module: as a failed import
    w.monkeypatch.setitem(sys.modules, second.__name__, second)
    engine.enable()
    assert engine.is_ours(second.optimizer_step) and engine._state.pending == {w.mod}


def test_every_module_that_cannot_be_watched_is_warned_about(world, monkeypatch):
    import wrapt

    w = world(import_now=False)
    w.table(w.row("Base.step"), w.row("Base.step", module="tcf_rules_never_imported_2"))
    monkeypatch.setattr(wrapt, "register_post_import_hook", lambda hook, name: 1 / 0)
    _, messages = _warnings(engine.enable)
    assert messages == ["tpu-closure-fix: cannot watch %s: division by zero" % name
                        for name in (w.mod, "tcf_rules_never_imported_2")]


def test_the_late_warning_skips_integrations_that_cannot_say(world, monkeypatch):
    w = world()
    w.table(w.row("Base.step"))

    def broken():
        raise RuntimeError("cannot tell")

    said = types.SimpleNamespace(NAME="said", CALL_SITES=(), late_enable_warning=lambda: "ran unfixed")
    monkeypatch.setattr(engine._integrations, "load", lambda: [
        types.SimpleNamespace(NAME="quiet"), types.SimpleNamespace(NAME="broken", late_enable_warning=broken), said])
    _, messages = _warnings(engine.enable)
    assert messages == ["ran unfixed"]


# --------------------------------------------------------------------------- fork: the locks a child gets
def test_a_lock_this_thread_holds_is_kept_in_the_child():
    lock = threading.RLock()
    with lock:
        assert engine._fresh_in_child(lock) is lock


@contextlib.contextmanager
def held_by_another_thread(*locks):
    """Run the block while a second thread holds every lock in ``locks`` (as a thread other than the forking
    one may hold them at fork time); the thread releases them and is joined when the block ends."""
    taken, release = threading.Event(), threading.Event()

    def hold():
        with contextlib.ExitStack() as stack:
            for lock in locks:
                stack.enter_context(lock)
            taken.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    taken.wait(10)
    try:
        yield
    finally:
        release.set()
        thread.join(10)


def test_a_lock_another_thread_holds_is_replaced_in_the_child():
    lock = threading.RLock()
    with held_by_another_thread(lock):
        fresh = engine._fresh_in_child(lock)
        assert fresh is not lock and fresh.acquire(blocking=False)
        fresh.release()
        assert type(fresh) is type(lock)
    plain = threading.Lock()  # no _is_owned: always a new lock
    assert engine._fresh_in_child(plain) is not plain


def test_after_fork_the_engine_and_wrapt_locks_are_free(monkeypatch):
    import wrapt.importer as importer

    held_engine, held_wrapt = threading.RLock(), threading.RLock()
    monkeypatch.setattr(engine, "_state", engine._State())
    engine._state.lock = held_engine
    monkeypatch.setattr(importer, "_post_import_hooks_lock", held_wrapt)

    with held_by_another_thread(held_engine, held_wrapt):
        engine._after_fork_in_child()
        assert engine._state.lock is not held_engine and importer._post_import_hooks_lock is not held_wrapt
        assert engine._state.lock.acquire(blocking=False) and importer._post_import_hooks_lock.acquire(blocking=False)
        engine._state.lock.release()
        importer._post_import_hooks_lock.release()
    with engine._state.lock, importer._post_import_hooks_lock:  # held by this (the forking) thread: kept
        kept = engine._state.lock, importer._post_import_hooks_lock
        engine._after_fork_in_child()
        assert (engine._state.lock, importer._post_import_hooks_lock) == kept


def test_reconcile_goes_past_a_module_not_imported_and_warns_for_each_module(world):
    import importlib.util

    w = world(import_now=False)
    second = types.ModuleType(w.top + ".second")
    exec("def optimizer_step(optimizer, optimizer_args):\n    return optimizer.step(**optimizer_args)\n",
         second.__dict__)
    from support.engine_world import GUARD

    top = importlib.import_module(w.top)
    w.table(w.row("Base.step", module="tcf_rules_never_imported_3"), w.row("Base.step"),
            w.row("optimizer_step", shape=GUARD, module=second.__name__))
    engine.enable()
    spec = importlib.util.spec_from_file_location(w.mod, top.__path__[0] + "/mod.py")
    module = importlib.util.module_from_spec(spec)
    w.monkeypatch.setitem(sys.modules, w.mod, module)  # both by hand: no hook fires
    spec.loader.exec_module(module)
    w.monkeypatch.setitem(sys.modules, second.__name__, second)
    keys, messages = _warnings(engine.reconcile)
    assert keys == [(w.mod, "Base.step"), (second.__name__, "optimizer_step")]
    assert [m.split(" was imported")[0] for m in messages] == ["tpu-closure-fix: %s" % w.mod,
                                                               "tpu-closure-fix: %s" % second.__name__]
    assert engine.is_ours(second.optimizer_step) and engine.is_ours(vars(module.Base)["step"])


def test_a_module_registered_under_another_name_is_patched_under_that_name(world):
    """sys.modules["alias"] is the module (whose __name__ differs): the rows name the alias."""
    w = world()
    w.table(w.row("Base.step", module="tcf_rules_alias_name"))
    w.monkeypatch.setitem(sys.modules, "tcf_rules_alias_name", w.module)
    engine.enable()
    assert engine.is_ours(vars(w.module.Base)["step"])
    assert engine._state.processed == {"tcf_rules_alias_name": id(w.module)}


def test_reconcile_patches_a_module_registered_under_another_name(world):
    w = world()
    w.table(w.row("Base.step", module="tcf_rules_alias_name_2"))
    engine._state.enabled = engine._state.switch.on = True
    w.monkeypatch.setitem(sys.modules, "tcf_rules_alias_name_2", w.module)
    keys, _ = _warnings(engine.reconcile)
    assert keys == [("tcf_rules_alias_name_2", "Base.step")] and engine.is_ours(vars(w.module.Base)["step"])


def test_the_hook_given_a_nameless_object_once_enabled_warns_and_never_raises(world):
    w = world()
    w.table(w.row("Base.step"))
    engine._state.enabled = engine._state.switch.on = True
    thing = object()
    _, messages = _warnings(lambda: engine._on_import(thing))
    assert messages == ["tpu-closure-fix: import hook failed for %r: 'object' object has no attribute "
                        "'__name__'" % (thing,)]

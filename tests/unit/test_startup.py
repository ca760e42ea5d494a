"""The start-up watcher (startup/_tpu_closure_fix_startup.py), each case in a fresh interpreter.

The interpreters run with ``-S`` (no site, so no installed .pth arms anything first) and a
PYTHONPATH of: a folder for this test's stand-in ``torch_xla`` (an empty package, only there to be a
watched name), the repository's startup/ and the repository (the real ``tpu_closure_fix``), then
the base venv's site-packages (wrapt, packaging). Each case prints one JSON line that says what
is on ``sys.meta_path`` and what was imported; each armed case has its ``TPU_CLOSURE_FIX=0`` twin.
"""
import json
import os
import subprocess
import sys
import sysconfig

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STARTUP = os.path.join(REPO, "startup")

#: Printed by every case: how often the watcher is on sys.meta_path, whether it is first, and
#: whether the shim's package was imported.
REPORT = """
import json, sys
watcher = sys.modules.get("_tpu_closure_fix_startup")
print(json.dumps({
    "armed": sum(1 for f in sys.meta_path if f is watcher),
    "first": bool(sys.meta_path) and sys.meta_path[0] is watcher,
    "activated": "tpu_closure_fix" in sys.modules,
    "wrapt": "wrapt" in sys.modules,
}))
"""


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    """A folder holding an empty ``torch_xla`` package: a watched top-level name, nothing more."""
    root = tmp_path_factory.mktemp("standin")
    (root / "torch_xla").mkdir()
    (root / "torch_xla" / "__init__.py").write_text("")
    return str(root)


def run(code, standin, switch=None, with_package=True, report=REPORT, **variables):
    """Run ``code`` then ``report`` in a fresh ``python -S``, every inherited ``TPU_CLOSURE_FIX*`` variable
    removed and ``variables`` set; return (report, stderr)."""
    path = [standin, STARTUP] + ([REPO, sysconfig.get_paths()["purelib"]] if with_package else [])
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONSTARTUP") and not k.startswith("TPU_CLOSURE_FIX")}
    env["PYTHONPATH"] = os.pathsep.join(path)
    env.update(variables)
    if switch is not None:
        env["TPU_CLOSURE_FIX"] = switch
    proc = subprocess.run([sys.executable, "-S", "-c", code + report], env=env, capture_output=True, text=True,
                          timeout=120, cwd=standin)  # the working directory is on sys.path: never the repo
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_importing_arms_once_and_first(standin):
    report, stderr = run("import _tpu_closure_fix_startup as s\ns.install()\ns.install()\n", standin)
    assert report == {"armed": 1, "first": True, "activated": False, "wrapt": False}
    assert stderr == ""


def test_importing_arms_nothing_when_switched_off(standin):
    report, _ = run("import _tpu_closure_fix_startup as s\ns.install()\n", standin, switch="0")
    assert report["armed"] == 0 and report["activated"] is False


def test_other_imports_leave_it_armed(standin):
    report, _ = run("import _tpu_closure_fix_startup\nimport json, email.message\n", standin)
    assert report["armed"] == 1 and report["activated"] is False


def test_watched_import_disarms_and_activates(standin):
    report, stderr = run("import _tpu_closure_fix_startup\nimport torch_xla\n", standin)
    assert report == {"armed": 0, "first": False, "activated": True, "wrapt": True}
    assert "Warning" not in stderr


def test_watched_import_switched_off_twin(standin):
    report, _ = run("import _tpu_closure_fix_startup\nimport torch_xla\n", standin, switch="off")
    assert report["armed"] == 0 and report["activated"] is False and report["wrapt"] is False


def test_late_import_with_a_watched_package_loaded_activates_at_once(standin):
    report, _ = run("import torch_xla\nimport _tpu_closure_fix_startup\n", standin)
    assert report["armed"] == 0 and report["activated"] is True
    report, _ = run("import torch_xla\nimport _tpu_closure_fix_startup\n", standin, switch="no")
    assert report["armed"] == 0 and report["activated"] is False


def test_failed_activation_warns_once_and_the_import_goes_on(standin):
    """tpu_closure_fix not importable: the watched import still succeeds, with one warning on stderr."""
    report, stderr = run("import _tpu_closure_fix_startup\nimport torch_xla\nimport torch_xla\n"
                         "import importlib; importlib.invalidate_caches()\n", standin, with_package=False)
    assert report["armed"] == 0 and report["activated"] is False
    assert stderr.count("RuntimeWarning: tpu-closure-fix could not activate (ModuleNotFoundError") == 1, stderr


#: Printed after ``import torch``: what of the package was loaded, and whether torch's live optimizer step
#: hook registry holds the zero-code check's hook.
TORCH_REPORT = """
import json, sys
watcher = sys.modules.get("_tpu_closure_fix_startup")
hook = sys.modules.get("tpu_closure_fix.synccheck.hook")
registry = getattr(sys.modules.get("torch.optim.optimizer"), "_global_optimizer_post_hooks", {})
print(json.dumps({
    "armed": sum(1 for f in sys.meta_path if f is watcher),
    "torch": "torch" in sys.modules,
    "package": sorted(m for m in sys.modules if m == "tpu_closure_fix" or m.startswith("tpu_closure_fix.")) != [],
    "hook": hook is not None and any(h is hook._after_step for h in registry.values()),
    "every": hook._armed["every"] if hook is not None else 0,
}))
"""


def test_importing_torch_with_the_sync_check_asked_activates_and_arms_the_hook(standin):
    """TPU_CLOSURE_FIX_SYNC_CHECK set: torch alone (no framework, no torch_xla) activates the package, and the
    zero-code check's hook is in torch's registry -- every process of a job arms it, whatever it imports."""
    pytest.importorskip("torch", reason="needs torch")
    import importlib

    # torch < 2.0 has no global step hooks: the package still activates and says once that the check is off
    hooks = hasattr(importlib.import_module("torch.optim.optimizer"), "register_optimizer_step_post_hook")
    report, stderr = run("import _tpu_closure_fix_startup\nimport torch\n", standin, report=TORCH_REPORT,
                         TPU_CLOSURE_FIX_SYNC_CHECK="5")
    assert report == {"armed": 0, "torch": True, "package": True, "hook": hooks, "every": 5}, stderr
    assert "could not activate" not in stderr, stderr
    if hooks:
        assert "TPUClosureFixWarning" not in stderr, stderr
    else:
        assert stderr.count("TPU_CLOSURE_FIX_SYNC_CHECK needs torch >= 2.0") == 1, stderr


@pytest.mark.parametrize("value", [None, "", "0"])
def test_importing_torch_without_the_sync_check_loads_nothing_of_the_package(standin, value):
    """The twin: unset, empty or 0, torch is not watched: the watcher stays armed, nothing of the package
    is imported."""
    pytest.importorskip("torch", reason="needs torch")
    variables = {} if value is None else {"TPU_CLOSURE_FIX_SYNC_CHECK": value}
    report, stderr = run("import _tpu_closure_fix_startup\nimport torch\n", standin, report=TORCH_REPORT,
                         **variables)
    assert report == {"armed": 1, "torch": True, "package": False, "hook": False, "every": 0}, stderr


def test_uninstall(standin):
    report, _ = run("import _tpu_closure_fix_startup as s\ns.uninstall()\ns.uninstall()\n", standin)
    assert report["armed"] == 0 and report["activated"] is False


#: Run in a child after the import: every module (or module's globals) reachable from what the watcher
#: put on ``sys.meta_path``, found by walking ``gc.get_referents`` and stopping at each module object and
#: each other module's ``__dict__``. sys, builtins and the import system's own modules (every module's
#: ``__spec__`` and ``__loader__`` lead there) are alive to the very end in any case.
KEPT_ALIVE = """
import gc, json, sys, types
finder = sys.modules[sys.argv[1]]
armed = any(f is finder for f in sys.meta_path)
dicts = {id(m.__dict__): m.__name__ for m in list(sys.modules.values()) if isinstance(m, types.ModuleType)}
seen, stack, kept = set(), [finder], set()
while stack:
    obj = stack.pop()
    if id(obj) in seen:
        continue
    seen.add(id(obj))
    if isinstance(obj, types.ModuleType) and obj is not finder:
        kept.add(obj.__name__)
    elif id(obj) in dicts and obj is not finder.__dict__:
        kept.add(dicts[id(obj)])
    else:
        stack.extend(gc.get_referents(obj))
always = {"sys", "builtins", "_frozen_importlib", "_frozen_importlib_external"}
print(json.dumps({"armed": armed, "kept": sorted(kept - always)}))
"""


def kept_alive(module, folders, switch="1"):
    """Import ``module`` in a fresh ``python -S`` (PYTHONPATH: ``folders``); report whether it armed and
    which modules it keeps alive besides those alive to the end anyway."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TPU_CLOSURE_FIX")}
    env.update(PYTHONPATH=os.pathsep.join(folders), TPU_CLOSURE_FIX=switch)
    code = "import %s\n" % module + KEPT_ALIVE
    proc = subprocess.run([sys.executable, "-S", "-c", code, module], env=env, capture_output=True, text=True,
                          timeout=120, cwd=folders[0])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_finder_keeps_no_other_module_alive_at_exit(standin):
    """What sits on sys.meta_path lives until the interpreter's last clean-up pass, which then clears
    the globals of every module it still refers to, entry by entry (a global ``os`` would add os, stat,
    posixpath...: 0.45 million instructions at every exit). Armed, the watcher refers to no module but
    those alive to the end anyway (sys, builtins, the import system). Twin: with the switch off it is not on sys.meta_path at all."""
    assert kept_alive("_tpu_closure_fix_startup", [standin, STARTUP]) == {"armed": True, "kept": []}
    assert kept_alive("_tpu_closure_fix_startup", [standin, STARTUP], switch="0") == {"armed": False, "kept": []}


def test_the_walk_finds_a_module_a_finder_keeps_alive(tmp_path):
    """The walk above can fail: a finder module with a global ``os`` and a function taken from
    ``os.path`` is reported as keeping both alive."""
    (tmp_path / "leaky_finder.py").write_text(
        "import sys, os\nfrom os.path import join\n"
        "def find_spec(name, path=None, target=None):\n    return None\n"
        "sys.meta_path.insert(0, sys.modules[__name__])\n")
    report = kept_alive("leaky_finder", [str(tmp_path)])
    assert report["armed"] and {"os", os.path.__name__} <= set(report["kept"]), report


def test_the_module_has_no_module_among_its_globals_but_sys():
    import importlib.util
    import types

    spec = importlib.util.spec_from_file_location("_startup_globals_under_test",
                                                  os.path.join(STARTUP, "_tpu_closure_fix_startup.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # outside sys.modules: install() arms nothing
    assert sorted(k for k, v in vars(module).items() if isinstance(v, types.ModuleType)) == ["sys"]
    assert not any(isinstance(v, type) for v in vars(module).values()), "no class: the module is the finder"


# --------------------------------------------------------------------------- where a switch's warning points
#: Runs ``code`` from a file named train.py (as a user's script is), recording every warning it gets.
WARNINGS_REPORT = """
print(json.dumps([[str(w.message), w.filename, w.lineno] for w in caught]))
"""
WARNINGS_CODE = """
import json, warnings
caught = []
warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: caught.append(
    warnings.WarningMessage(message, category, filename, lineno))
warnings.simplefilter("always")
%s
"""


def warnings_of(tmp_path, standin, body, **variables):
    """The warnings of a train.py whose lines are ``body``: [message, filename, lineno] each."""
    script = tmp_path / "train.py"
    script.write_text(WARNINGS_CODE % body + WARNINGS_REPORT)
    path = [standin, STARTUP, REPO, sysconfig.get_paths()["purelib"]]
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONSTARTUP") and not k.startswith("TPU_CLOSURE_FIX")}
    env.update(variables, PYTHONPATH=os.pathsep.join(path))
    proc = subprocess.run([sys.executable, "-S", str(script)], env=env, capture_output=True, text=True,
                          timeout=120, cwd=standin)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), str(script)


BAD_SWITCHES = {"TPU_CLOSURE_FIX": "maybe", "TPU_CLOSURE_FIX_LOG": "loud", "TPU_CLOSURE_FIX_DISABLE": "nope"}


@pytest.mark.parametrize("how, body, line", [
    ("import tpu_closure_fix", "import tpu_closure_fix", 7),
    ("a watched import, through the start-up module",
     "import _tpu_closure_fix_startup as s\ns.install()\nimport torch_xla", 9),
])
def test_a_bad_switch_value_warns_at_the_users_import_line_naming_the_variable(tmp_path, standin, how, body, line):
    caught, script = warnings_of(tmp_path, standin, body, **BAD_SWITCHES)
    # a message names the variable first, on the line after Python's location prefix
    named = {variable: [w for w in caught if w[0].lstrip().startswith(variable + "=")] for variable in BAD_SWITCHES}
    assert all(len(found) == 1 for found in named.values()), caught
    for message, filename, lineno in (found[0] for found in named.values()):
        assert (filename, lineno) == (script, line), (how, message, filename, lineno)
        assert "tpu_closure_fix" not in os.path.dirname(filename) and "importlib" not in filename

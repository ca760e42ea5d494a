"""``status`` and ``check`` answer for a fresh interpreter, not for themselves.

The rules of :func:`tpu_closure_fix.verify.fresh.startup_hook` (is the shim armed when a script starts
there, and why not), of :func:`tpu_closure_fix.outcome.decide.decide` (one outcome, one exit code, for
``status`` and for ``check``), each with its neighbours; then the real thing: a fresh
interpreter asked, the caller's flags reaching it, the JSON object against docs/status.schema.json,
``--version``, and Ctrl-C / SIGTERM ending the children. Target tests (tests/target/test_activation.py)
run a real ``pip install --target`` against a framework.
"""
import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from support.xla_model_source import xla_model_source
from support.outcomes import check_outcome, status_outcome
from tpu_closure_fix import check
from tpu_closure_fix.outcome import payload as outcome_payload
from tpu_closure_fix.outcome import records as report
from tpu_closure_fix.outcome import decide, render
from tpu_closure_fix.verify import fresh

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SITE = "/venv/lib/python3.11/site-packages"


def facts(**changes):
    """The facts of an interpreter whose start-up module armed the watcher (the normal install)."""
    base = {"executable": "/venv/bin/python", "version": "3.11.7", "startup_loaded": True, "startup_armed": True,
            "shim_at_start": False, "switch": None,
            "flags": {"no_site": False, "isolated": False, "ignore_environment": False, "no_user_site": False},
            "shim_origin": SITE + "/tpu_closure_fix/__init__.py", "site_dirs": [SITE], "pth_in": [SITE]}
    base.update(changes)
    return base


def unarmed(**changes):
    return facts(startup_loaded=False, startup_armed=False, **changes)


# --------------------------------------------------------------------------- startup_hook, rule by rule
@pytest.mark.parametrize("given, active, says", [
    # 0. status --here: not asked
    (facts(here=True), None, "not asked"),
    # 1. switched off (the module is loaded, arms nothing); an unknown value is the default, on
    (facts(startup_armed=False, switch="0"), False, "TPU_CLOSURE_FIX=0 switches the shim off"),
    (facts(switch=" OFF "), False, "switches the shim off"),
    (facts(switch="maybe"), True, "armed at interpreter start by the start-up module"),
    # 2. armed, or imported at start by a start-up file; armed with the shim not importable is not active
    (facts(), True, "armed at interpreter start by the start-up module"),
    (facts(shim_origin=None), False, "tpu_closure_fix is not installed for /venv/bin/python"),
    (unarmed(shim_at_start=True), True, "a start-up file importing tpu_closure_fix"),
    # 3. -S
    (unarmed(flags={"no_site": True}), False, "python -S"),
    # 4. not installed for that interpreter
    (unarmed(shim_origin=None), False, "tpu_closure_fix is not installed for /venv/bin/python"),
    # 5. a --target folder / PYTHONPATH entry
    (unarmed(shim_origin="/opt/deps/tpu_closure_fix/__init__.py", pth_in=[]), False,
     "imported from /opt/deps (a --target folder or a PYTHONPATH entry)"),
    # 6. in site-packages without its .pth; the user site under -I/-s; anything else, said as unknown
    (unarmed(pth_in=[]), False, "tpu_closure_fix.pth is missing from " + SITE),
    (unarmed(flags={"isolated": True}), False, "python -I/-s"),
    (unarmed(), False, "the start-up module was not armed"),
])
def test_startup_hook_rules(given, active, says):
    got_active, reason = fresh.startup_hook(given)
    assert got_active is active and says in reason, reason


def test_caller_flags_pass_on_what_changes_a_start_up():
    def flags(**on):
        names = ("isolated", "ignore_environment", "no_user_site", "no_site")
        return SimpleNamespace(**dict({n: 0 for n in names}, **on))

    assert fresh.caller_flags(flags()) == []
    assert fresh.caller_flags(flags(isolated=1, ignore_environment=1, no_user_site=1)) == ["-I"]
    assert fresh.caller_flags(flags(ignore_environment=1, no_user_site=1)) == ["-E", "-s"]
    assert fresh.caller_flags(flags(no_site=1)) == ["-S"]


# --------------------------------------------------------------------------- the outcome, rule by rule
def record(verdict, module="lightning_fabric.plugins.precision.xla", method="XLAPrecision.optimizer_step",
           reason=""):
    return {"distribution": "lightning-fabric", "release": "2.6.6", "module": module, "method": method,
            "verdict": verdict, "reason": reason, "variant": None}


def payload(records, **fact_changes):
    return {"facts": facts(**fact_changes), "records": records, "shim_version": "0.1.0", "shim_path": "/x",
            "sync_check": None}


def test_status_without_a_report_could_not_verify():
    assert status_outcome(None, "boom")[:2] == ("could not verify", 3)
    failed = {"facts": facts(error="ImportError: wrapt")}
    name, code, reason = status_outcome(failed)
    assert (name, code) == ("could not verify", 3), reason
    # its own copy failed to list the sites: the fix installs this release there, files and all
    assert reason.startswith("COULD NOT VERIFY: /venv/bin/python could not list its sites (ImportError: wrapt). "
                             "Fix: install this release of tpu-closure-fix into it: `/venv/bin/python -m pip install "
                             "--force-reinstall "), reason
    lent = {"facts": facts(error="ImportError: wrapt", shim_origin=None)}
    assert "`/venv/bin/python -m pip install /" in status_outcome(lent)[2]  # nothing of its own to replace


def test_status_with_nothing_installed_says_so_and_exits_0():
    name, code, reason = status_outcome(payload([record("not installed"), record("not in this release")]))
    assert (name, code) == ("nothing to protect", 0) and reason.startswith("NOTHING TO PROTECT: ")
    # the neighbour: one installed site makes it a verdict about that site
    assert status_outcome(payload([record("patched"), record("not installed")]))[0] == "protected"


def test_status_with_the_hook_inactive_is_unprotected_naming_why_and_the_fix():
    target = dict(startup_armed=False, shim_origin="/opt/deps/tpu_closure_fix/__init__.py", pth_in=[])
    name, code, reason = status_outcome(payload([record("patched")], **target))
    assert (name, code) == ("unprotected", 1)
    assert "the start-up hook does not run in /venv/bin/python (tpu_closure_fix is imported from /opt/deps" in reason
    assert "runs 1 affected site(s) unpatched" in reason and "Fix: install tpu-closure-fix into" in reason
    # fixed upstream needs no shim: the same interpreter is protected
    assert status_outcome(payload([record("fixed upstream")], **target))[0] == "protected"
    # switched off: the records say "disabled" (rule 4), not a start-up fix
    off = status_outcome(payload([record("disabled", reason="TPU_CLOSURE_FIX=0")], switch="0",
                                        startup_armed=False))
    assert off[:2] == ("unprotected", 1) and "(disabled: TPU_CLOSURE_FIX=0)" in off[2]
    assert off[2].endswith("Fix: `unset TPU_CLOSURE_FIX`.") and "site-packages" not in off[2]


def test_status_with_a_buggy_site_is_unprotected_and_with_none_protected():
    bad = status_outcome(payload([record("patched"), record("skipped", method="Other.step",
                                                                    reason="unknown release 9.9")]))
    assert bad[:2] == ("unprotected", 1) and "Other.step (skipped: unknown release 9.9)" in bad[2]
    good = status_outcome(payload([record("patched"), record("guarded"), record("fixed upstream")]))
    assert good == ("protected", 0, "PROTECTED: every installed affected site is patched, guarded or fixed "
                                    "upstream (3 site(s)); start-up hook active.")
    # only fixed-upstream code, the hook off: protected, and the reason says the hook is off
    upstream = status_outcome(payload([record("fixed upstream")], switch="0", startup_armed=False))
    assert upstream[2].endswith("(1 site(s)); start-up hook inactive, no site needs it.")


# --------------------------------------------------------------------------- check: the same rules, self-tests added
EVENTS_OK = {"sites": [{"site": "m:C.step", "ok": True, "verdict": "patched", "events": []}], "untested": []}


def test_check_with_nothing_installed_is_nothing_to_protect_exit_0_as_status():
    nothing = payload([record("not installed")])
    out = check_outcome(nothing, {"sites": [], "untested": []})
    assert (out.name, out.exit_code) == ("nothing to protect", 0) and out == status_outcome(nothing)
    # the neighbour: one installed site and a self-test that drove nothing: could not verify
    assert check_outcome(payload([record("patched")]), {"sites": [], "untested": []}).exit_code == 3


def test_check_with_a_start_up_gap_is_unprotected_before_any_self_test():
    target = dict(startup_armed=False, shim_origin="/opt/deps/tpu_closure_fix/__init__.py", pth_in=[])
    out = check_outcome(payload([record("patched")], **target), EVENTS_OK)
    assert (out.name, out.exit_code, out.rule) == ("unprotected", 1, 4) and out == status_outcome(
        payload([record("patched")], **target))
    assert check_outcome(payload([record("patched")]), EVENTS_OK).name == "protected"  # the twin: no gap


# --------------------------------------------------------------------------- a real fresh interpreter
def test_this_interpreter_asked_fresh_reports_its_own_start_up():
    got, error = fresh.run_status(flags=[])
    assert error is None and got["facts"]["executable"] == sys.executable
    assert got["facts"]["flags"]["isolated"] is False and "records" in got
    assert got["facts"]["shim_at_start"] is False  # asked before anything imported the shim there


def test_the_caller_flags_reach_the_fresh_interpreter():
    got, error = fresh.run_status(flags=["-I"])
    assert error is None, error
    assert got["facts"]["flags"]["isolated"] is True and got["facts"]["flags"]["ignore_environment"] is True


def test_the_switch_of_the_caller_reaches_the_fresh_interpreter(monkeypatch):
    monkeypatch.setenv("TPU_CLOSURE_FIX", "0")
    got, error = fresh.run_status(flags=[])
    assert error is None and got["facts"]["switch"] == "0"
    assert fresh.startup_hook(got["facts"]) == (False, "TPU_CLOSURE_FIX=0 switches the shim off")


def _validate(value, schema, where="$"):
    """The part of JSON Schema docs/status.schema.json uses: type, const, enum, required, properties, items."""
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None), "integer": int}
    if "const" in schema:
        assert value == schema["const"], where
    if "enum" in schema:
        assert value in schema["enum"], (where, value)
    if "type" in schema:
        names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        assert any(isinstance(value, kinds[n]) for n in names), (where, value, names)
    for key in schema.get("required", []):
        assert key in value, (where, key)
    for key, sub in schema.get("properties", {}).items():
        if isinstance(value, dict) and key in value:
            _validate(value[key], sub, "%s.%s" % (where, key))
    if "items" in schema and isinstance(value, list):
        for i, item in enumerate(value):
            _validate(item, schema["items"], "%s[%d]" % (where, i))


def cli(*args, **kwargs):
    env = dict(os.environ, PYTHONPATH=REPO)
    env.update(kwargs.pop("env", {}))
    return subprocess.run([sys.executable, "-m", "tpu_closure_fix"] + list(args), env=env, capture_output=True,
                          text=True, timeout=600, cwd=kwargs.pop("cwd", REPO), **kwargs)


def test_status_json_is_one_object_of_the_documented_schema():
    with open(os.path.join(REPO, "docs", "status.schema.json")) as handle:
        schema = json.load(handle)
    proc = cli("status", "--json")
    out = json.loads(proc.stdout)
    _validate(out, schema)
    assert out["exit_code"] == proc.returncode == 0 and out["outcome"] == "nothing to protect"
    assert out["command"] == "status" and out["python"]["executable"] == sys.executable
    # the validator can fail: a bare list (the old shape), a wrong outcome
    with pytest.raises(AssertionError):
        _validate(out["sites"], schema)
    with pytest.raises(AssertionError):
        _validate(dict(out, outcome="OK"), schema)


def test_check_json_and_every_outcome_s_json_are_objects_of_the_documented_schema():
    from support.outcomes import evidence

    with open(os.path.join(REPO, "docs", "status.schema.json")) as handle:
        schema = json.load(handle)
    proc = cli("check", "--json", "--no-graph")
    out = json.loads(proc.stdout)
    _validate(out, schema)
    assert out["command"] == "check" and out["rule"] == 3 and out["exit_code"] == proc.returncode == 0, out
    target = dict(startup_armed=False, shim_origin="/opt/deps/tpu_closure_fix/__init__.py", pth_in=[])
    for given, error in ((None, "boom"), (payload([record("not installed")]), None),
                         (payload([record("patched")], **target), None), (payload([record("patched")]), None),
                         (payload([record("failed", reason=report.IMPORT_FAILED + "ImportError: x")]), None)):
        for site in (given or {}).get("records", []):
            site.setdefault("integration", "lightning")
        seen = evidence(given, error)
        result = render.json_object(seen, decide.decide(seen))
        _validate(json.loads(json.dumps(result)), schema)
        assert set(schema["required"]) <= set(result), set(schema["required"]) - set(result)


def test_version():
    from tpu_closure_fix.__about__ import __version__

    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == "tpu-closure-fix %s" % __version__


def _children_of(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the process table from /proc")
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_status_ends_its_child(tmp_path, sig, code):
    """``--python`` names a stand-in interpreter that never answers (it sleeps): the fresh interpreter's
    place. Ctrl-C (SIGINT) or SIGTERM to ``status`` ends it; before, the child lived on in its own session."""
    slow = tmp_path / "python"
    slow.write_text("#!/bin/sh\nexec sleep 300\n")
    slow.chmod(0o755)
    # as from a terminal: SIGINT at its default (a background job or CI runner may have it ignored, and an
    # interpreter started with SIGINT ignored never raises KeyboardInterrupt)
    parent = subprocess.Popen([sys.executable, "-m", "tpu_closure_fix", "status", "--python", str(slow)],
                              env=dict(os.environ, PYTHONPATH=REPO), cwd=str(tmp_path), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline, children = time.monotonic() + 120, []
        while not children and time.monotonic() < deadline:
            children = _children_of(parent.pid)
            time.sleep(0.1)
        assert children, "status started no child"
        time.sleep(0.5)  # the child is the sleeping stand-in by now (exec)
        parent.send_signal(sig)
        _, err = parent.communicate(timeout=60)
    finally:
        if parent.poll() is None:
            parent.kill()
    assert parent.returncode == code, err
    assert [pid for pid in children if _alive(pid)] == []
    if sig == signal.SIGINT:
        assert "tpu-closure-fix status: interrupted" in err and "Traceback" not in err


# --------------------------------------------------------------------------- XLA steps no row covers (verify/scan.py)
#: Excerpts of released code (the shapes the scan must find), and their neighbours it must not.
PL_1_1_8 = '''
class LightningOptimizer:
    def __optimizer_step(self, *args, closure=None, profiler_name=None, **kwargs):
        trainer = self._trainer
        if trainer.on_tpu:
            with trainer.profiler.profile(profiler_name):
                xm.optimizer_step(optimizer, optimizer_args={'closure': closure, **kwargs})
'''
PL_1_0_3 = '''
import torch_xla.core.xla_model as xm
class LightningModule:
    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_idx, second_order_closure=None, on_tpu=False):
        if on_tpu:
            xm.optimizer_step(optimizer)
'''
ACCELERATE_SHAPE = '''
class AcceleratedOptimizer:
    def step(self, closure=None):
        gradients = xm._fetch_gradients(self.optimizer)
        xm.all_reduce("sum", gradients, scale=1.0 / world)
        self.optimizer.step(closure)
'''
FIXED_UPSTREAM_SHAPE = '''
import torch_xla.core.xla_model as xm
class XLAPrecision:
    def optimizer_step(self, optimizer, model, closure, **kwargs):
        closure_result = closure()
        xm.reduce_gradients(optimizer)
        return optimizer.step(**kwargs)
'''


def test_the_scan_finds_each_shape_of_the_bug_class_with_its_method_and_line():
    assert fresh_scan().calls_in_source("import torch_xla.core.xla_model as xm\n" + PL_1_1_8) == \
        [("LightningOptimizer.__optimizer_step", 8)]
    assert fresh_scan().calls_in_source(ACCELERATE_SHAPE) == [("AcceleratedOptimizer.step", 5)]
    from_import = "from torch_xla.core import xla_model\n" + PL_1_1_8.replace("xm.", "xla_model.")
    assert fresh_scan().calls_in_source(from_import) == [("LightningOptimizer.__optimizer_step", 8)]
    positional = "import torch_xla.core.xla_model as xm\ndef f(opt, c):\n    xm.optimizer_step(opt, False, {'closure': c})\n"
    assert fresh_scan().calls_in_source(positional) == [("f", 3)]


def test_the_scan_passes_over_the_neighbours_that_are_not_the_bug():
    scan = fresh_scan()
    assert scan.calls_in_source(PL_1_0_3) == []  # no closure into the step (1.0.0-1.0.3)
    assert scan.calls_in_source(FIXED_UPSTREAM_SHAPE) == []  # closure, then the reduction, then the step
    assert scan.calls_in_source(PL_1_1_8) == []  # xm bound to nothing from torch_xla in this file
    barrier_only = "import torch_xla.core.xla_model as xm\ndef f(opt):\n    xm.optimizer_step(opt, True)\n"
    assert scan.calls_in_source(barrier_only) == []
    step_first = ACCELERATE_SHAPE.replace("        self.optimizer.step(closure)\n", "").replace(
        "    def step(self, closure=None):\n", "    def step(self, closure=None):\n        self.optimizer.step(closure)\n")
    assert scan.calls_in_source(step_first) == []


def test_a_method_is_covered_by_its_row_name_mangled_or_not():
    scan = fresh_scan()
    keys = {("m", "C._C__step"), ("m", "D.step")}
    assert scan._covered("m", "C.__step", keys) and scan._covered("m", "D.step", keys)
    assert not scan._covered("m", "C.step", keys) and not scan._covered("other", "D.step", keys)
    assert not scan._covered("m", "D.__init__", {("m", "D._D__init__")})  # dunder names are not mangled


def fresh_scan():
    from tpu_closure_fix.verify import scan

    return scan


def _package(root, source, name="optimizer"):
    """A folder on the path holding a package named pytorch_lightning whose core/<name>.py is ``source``
    (the scan reads files; the site modules of the table other than that one are absent from it: "not in
    this release")."""
    package = root / "pytorch_lightning"
    (package / "core").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "core" / "__init__.py").write_text("")
    (package / "core" / ("%s.py" % name)).write_text(source)
    return str(root)


#: 1.1.8's step (a site of the table since its row was added) in a method no row names
UNCOVERED = PL_1_1_8.replace("def __optimizer_step(", "def __step_on_tpu(")


def test_a_release_with_an_uncovered_xla_step_could_not_verify_naming_file_and_line(tmp_path):
    folder = _package(tmp_path, "import torch_xla.core.xla_model as xm\n" + UNCOVERED)
    proc = cli("status", "--json", env={"PYTHONPATH": os.pathsep.join([folder, REPO])}, cwd=str(tmp_path))
    out = json.loads(proc.stdout)
    assert (proc.returncode, out["outcome"]) == (3, "could not verify"), out["reason"]
    where = os.path.join(folder, "pytorch_lightning", "core", "optimizer.py")
    assert out["uncovered"] == [{"file": where, "line": 8, "module": "pytorch_lightning.core.optimizer",
                                 "function": "LightningOptimizer.__step_on_tpu"}]
    assert out["reason"].startswith("COULD NOT VERIFY: %s:8 (pytorch_lightning.core.optimizer:LightningOptimizer."
                                    "__step_on_tpu) holds an XLA optimizer step" % where)
    text = cli("status", env={"PYTHONPATH": os.pathsep.join([folder, REPO])}, cwd=str(tmp_path))
    # the text wraps at 120 columns: read with its line breaks as spaces
    assert text.returncode == 3 and "XLA optimizer step no row covers: %s:8" % where in " ".join(text.stdout.split())


def test_the_twin_without_a_closure_into_the_step_has_nothing_to_protect(tmp_path):
    folder = _package(tmp_path, PL_1_0_3, name="hooks")  # a module no row names: nothing of it is imported
    proc = cli("status", "--json", env={"PYTHONPATH": os.pathsep.join([folder, REPO])}, cwd=str(tmp_path))
    out = json.loads(proc.stdout)
    assert (proc.returncode, out["outcome"], out["uncovered"]) == (0, "nothing to protect", []), out["reason"]


def test_status_rules_for_uncovered_steps_and_import_failures():
    found = [{"file": "/x/a.py", "line": 3, "module": "a", "function": "C.step"}]
    nothing = dict(payload([record("not installed")]), uncovered=found)
    assert status_outcome(nothing)[:2] == ("could not verify", 3)  # never "nothing to protect"
    patched = dict(payload([record("patched")]), uncovered=found)
    assert status_outcome(patched)[:2] == ("could not verify", 3)  # never "protected"
    buggy = dict(payload([record("disabled", reason="TPU_CLOSURE_FIX=0")]), uncovered=found)
    assert status_outcome(buggy)[:2] == ("unprotected", 1)  # a known buggy site wins
    failed_scan = dict(payload([record("patched")]), scan_error="OSError: x")
    assert status_outcome(failed_scan)[:2] == ("could not verify", 3)
    broken = payload([record("failed", reason=report.IMPORT_FAILED + "ImportError: numpy")])
    assert status_outcome(broken) == ("could not verify", 3, "COULD NOT VERIFY: lightning_fabric.plugins."
                                             "precision.xla:XLAPrecision.optimizer_step cannot be imported (import "
                                             "failed: ImportError: numpy). Fix: make `/venv/bin/python -c 'import "
                                             "lightning_fabric.plugins.precision.xla'` succeed (it shows the whole "
                                             "error).")
    known = payload([record("failed", reason=report.IMPORT_FAILED + "ImportError: numpy; fix: pip install 'numpy<2'")])
    # the one fix, the known one, installed into the interpreter asked about (a bare pip may be another's)
    assert status_outcome(known)[2].endswith("(import failed: ImportError: numpy). Fix: `/venv/bin/python -m "
                                                    "pip install 'numpy<2'`."), status_outcome(known)[2]
    out = check_outcome(patched, EVENTS_OK)
    assert out == status_outcome(patched) and out.reason.startswith("COULD NOT VERIFY: /x/a.py:3 (a:C.step) holds")


def test_python_names_another_interpreter_and_the_report_is_about_it(tmp_path):
    """A venv with nothing installed: its own interpreter answers (the shim's table read from this copy,
    appended last to its path), and its start-up hook is inactive because the shim is not installed there."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=120)
    other = str(tmp_path / "venv" / "bin" / "python")
    for command in ("status", "check"):
        proc = cli(command, "--python", other, "--json", *(["--no-graph"] if command == "check" else []),
                   env={"PYTHONPATH": ""}, cwd=str(tmp_path))
        out = json.loads(proc.stdout)
        assert out["python"]["executable"] == other, out
        assert out["startup_hook"] == {"active": False, "reason": "tpu_closure_fix is not installed for %s" % other}
        # nothing the shim covers there: said as such, by both commands (check runs no self-test on nothing)
        assert (proc.returncode, out["outcome"]) == (0, "nothing to protect"), out["reason"]
        if command == "check":
            assert out["event_check"]["not_run"] == check.NOT_RUN[3], out["event_check"]
    # the twin: this interpreter, where the shim is installed
    mine = json.loads(cli("status", "--json").stdout)
    assert mine["python"]["executable"] == sys.executable and mine["startup_hook"]["active"] is True



def test_a_child_is_lent_only_the_shim():
    """Not this process's wrapt or packaging: they need not run on the asked interpreter's Python."""
    with fresh._lent_folder() as folder:
        assert sorted(os.listdir(folder)) == ["tpu_closure_fix"]
        assert oct(os.stat(folder).st_mode & 0o777) == "0o700"
    assert not os.path.exists(folder)


def _pythons_38():
    """Interpreters of Python 3.8 on this machine (pyenv's, or python3.8 on PATH), never this one nor a launcher
    script (pyenv's shims); none when this interpreter is a 3.8 itself (the test asks 3.8 from another version)."""
    import glob
    import shutil

    if sys.version_info[:2] == (3, 8):
        return []
    found = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python")))
    on_path = shutil.which("python3.8")
    return [p for p in found + ([on_path] if on_path else []) if os.path.realpath(p) != os.path.realpath(sys.executable)
            and os.sep + "shims" + os.sep not in p]


@pytest.mark.skipif(not _pythons_38(), reason="no Python 3.8 interpreter on this machine other than this one (pyenv "
                    "or python3.8 on PATH)")
def test_python_at_3_8_from_this_interpreter_gets_a_verdict(tmp_path):
    """This interpreter's wrapt and packaging (lent before) do not run on 3.8: the child answered COULD NOT VERIFY
    (TypeError: unsupported operand type(s) for |). Lent the shim alone, a bare 3.8 gets its verdict."""
    other = _pythons_38()[0]
    proc = cli("status", "--python", other, "--json", env={"PYTHONPATH": ""}, cwd=str(tmp_path))
    out = json.loads(proc.stdout)
    assert out["python"]["version"].startswith("3.8."), out["python"]
    assert (proc.returncode, out["outcome"]) == (0, "nothing to protect"), out["reason"]
    assert out["startup_hook"] == {"active": False, "reason": "tpu_closure_fix is not installed for %s" % other}


@pytest.mark.parametrize("version, older", [("3.6.15", True), ("3.7.16", True), ("3.7", True), ("2.7.18", True),
                                            ("3.8.0", False), ("3.13.0", False), ("4.0.1", False), ("", False),
                                            ("unknown", False)])
def test_an_interpreter_before_3_8_is_refused_by_the_version_it_reported(version, older):
    reason = fresh.too_old(facts(version=version, executable="/old/bin/python"))
    if not older:
        assert reason is None  # 3.8 and newer, or no version stated: the other rules decide
        return
    assert reason == ("/old/bin/python is Python %s, which tpu-closure-fix does not run on (it needs Python 3.8 or "
                      "newer; pip installs no release there). Fix: train and check with a Python 3.8 or newer: give "
                      "--python its interpreter (e.g. `--python /path/to/venv/bin/python`)" % version)


def _status_of_a_child_reporting(monkeypatch, version):
    """``run_status`` and ``status_outcome`` over a child that reported ``version`` and one patched site."""
    from tpu_closure_fix.verify import child

    reported = payload([record("patched")], version=version)
    monkeypatch.setattr(child, "run_child", lambda argv, timeout, env=None: child.ChildRun(
        argv, 0, reported, "", "", 0.1, False, None))
    monkeypatch.setattr(fresh, "_beside_script", lambda payload, flags, script: {"directory": "/x", "found": []})
    got, error = fresh.run_status(python="/old/bin/python", flags=[])
    return got, error, status_outcome(got, error)


def test_status_and_check_give_no_verdict_about_a_python_before_3_8(monkeypatch):
    """The rule in the one path both commands take (run_status): the payload comes back without its records
    (check then runs no self-test either), the error naming the version and the fix."""
    got, error, (name, code, reason) = _status_of_a_child_reporting(monkeypatch, "3.7.16")
    assert "records" not in got and got["facts"]["version"] == "3.7.16"
    assert (name, code) == ("could not verify", 3)
    assert reason.startswith("COULD NOT VERIFY: /venv/bin/python is Python 3.7.16, which tpu-closure-fix does not "
                             "run on") and "Fix: train and check with a Python 3.8 or newer" in reason, reason


def test_twin_a_python_3_8_reporting_the_same_gets_its_verdict(monkeypatch):
    got, error, (name, code, reason) = _status_of_a_child_reporting(monkeypatch, "3.8.18")
    assert error is None and got["records"]
    assert (name, code) == ("protected", 0), reason


def _pythons_before_3_8():
    """pyenv's interpreters of Python 3.6 and 3.7 on this machine (never its shims)."""
    import glob

    return sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.[67].*/bin/python")))


@pytest.mark.skipif(not _pythons_before_3_8(), reason="no Python 3.6/3.7 interpreter on this machine (pyenv)")
@pytest.mark.parametrize("command", ["status", "check"])
def test_a_real_python_before_3_8_could_not_verify(command, tmp_path):
    """The shim lent from this checkout (PYTHONPATH) runs there and reports; the verdict is still withheld."""
    for old in _pythons_before_3_8():
        proc = cli(command, "--python", old, "--json", env={"PYTHONPATH": REPO}, cwd=str(tmp_path))
        out = json.loads(proc.stdout)
        assert out["python"]["version"][:3] in ("3.6", "3.7"), out["python"]
        assert (proc.returncode, out["outcome"]) == (3, "could not verify"), out
        assert ("is Python %s, which tpu-closure-fix does not run on" % out["python"]["version"]) in out["reason"]
        assert "Fix: train and check with a Python 3.8 or newer" in out["reason"], out["reason"]
        if command == "check":  # no self-test about a verdict withheld
            assert out["event_check"]["not_run"] == check.NOT_RUN[1] and not out["event_check"]["sites"]


# --------------------------------------------------------------------------- what a script started there runs
@pytest.mark.parametrize("given, off", [
    (facts(), False),  # the hook runs: the shim is activated as it would be
    (facts(switch="0", startup_armed=False), False),  # switched off: the sites say "disabled" themselves
    (unarmed(shim_origin=None), True),  # not installed there: the shim never runs
    (unarmed(flags={"no_site": True}), True),  # -S
    (unarmed(shim_origin="/opt/deps/tpu_closure_fix/__init__.py", pth_in=[]), True),  # --target
    (facts(here=True), False),  # status --here: this process, not asked
])
def test_the_shim_is_left_off_exactly_where_the_start_up_hook_leaves_it_off(given, off):
    assert outcome_payload.leaves_shim_off(given, fresh.startup_hook(given)) is off


def _records_from(monkeypatch, finding, **kwargs):
    """records.status() over a table whose every site is installed and examined as ``finding``."""
    monkeypatch.setattr(report, "_installed", lambda package: True)
    monkeypatch.setattr(report.engine, "reconcile", lambda: [])
    monkeypatch.setattr(report.engine, "examine", lambda key: finding)
    monkeypatch.setattr(report, "_distribution", lambda rows, package: rows[0].distribution)
    return report.status(**kwargs)


def test_a_site_left_off_because_the_hook_does_not_run_is_unpatched_not_disabled(monkeypatch):
    from tpu_closure_fix import engine

    off = engine.Finding(engine.DISABLED, "TPU_CLOSURE_FIX=0", None, "1.8.6", None)
    records = _records_from(monkeypatch, off, unpatched_reason=outcome_payload.HOOK_INACTIVE)
    assert {(r["verdict"], r["reason"]) for r in records} == {("unpatched", "start-up hook inactive")}
    assert all(r in report.unprotected(records) for r in records)
    # the twin: switched off by the user, the records keep saying so
    records = _records_from(monkeypatch, off)
    assert {(r["verdict"], r["reason"]) for r in records} == {("disabled", "TPU_CLOSURE_FIX=0")}
    # a site the shim would leave alone anyway keeps its own verdict
    skipped = engine.Finding(engine.SKIPPED, "unknown release 9.9", None, "9.9", None)
    records = _records_from(monkeypatch, skipped, unpatched_reason=outcome_payload.HOOK_INACTIVE)
    assert {r["verdict"] for r in records} == {"skipped"}


def test_a_hook_gap_never_counts_sites_that_cannot_be_imported():
    """Sites whose module fails to import run nothing: with the hook inactive they are not "run unpatched"; the
    outcome is the import failure's (could not verify)."""
    target = dict(startup_armed=False, shim_origin="/opt/deps/tpu_closure_fix/__init__.py", pth_in=[])
    broken = record("failed", reason=report.IMPORT_FAILED + "ModuleNotFoundError: No module named 'torch'")
    assert status_outcome(payload([broken], **target))[:2] == ("could not verify", 3)
    unpatched = record("unpatched", method="Other.step", reason=outcome_payload.HOOK_INACTIVE)
    name, code, reason = status_outcome(payload([broken, unpatched], **target))
    assert (name, code) == ("unprotected", 1) and "runs 1 affected site(s) unpatched" in reason, reason


def _wrapper(tmp_path, when_versioned):
    """An executable that answers the version question as this Python does and, asked anything else, runs
    ``when_versioned`` (shell)."""
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\nif [ \"$1\" = -S ]; then exec %s \"$@\"; fi\n%s\n" % (sys.executable, when_versioned))
    path.chmod(0o755)
    return str(path)


def test_an_interpreter_that_could_not_report_names_one_fix_for_each_cause(tmp_path):
    """Not a Python: give --python one; a Python too old: train with a newer one; a Python 3.8+ that failed: the
    file holding its whole output (the reason shows only its last error line)."""
    not_python_text = str(tmp_path / "tool")
    with open(not_python_text, "w") as handle:
        handle.write("#!/bin/sh\necho hello\n")
    os.chmod(not_python_text, 0o755)
    reason = json.loads(cli("status", "--python", not_python_text, "--json", cwd=str(tmp_path)).stdout)["reason"]
    assert reason.endswith("Fix: give --python the python of the environment that trains, a Python 3.8 or newer (%s "
                           "states no Python version)." % not_python_text), reason
    run = SimpleNamespace(argv=["x"], stdout="", stderr="")
    assert fresh.unreported_fix("/old/python", run, version=(3, 7)) == (
        "train and check with a Python 3.8 or newer: /old/python is Python 3.7, which tpu-closure-fix does not run on")
    oldest = fresh.unreported_fix("/py38/python", run, version=(3, 8))  # the oldest supported: its output is kept
    assert oldest.startswith("read its whole output"), oldest
    os.remove(oldest.split("`cat ")[1].rstrip("`"))
    failing = _wrapper(tmp_path, "echo 'Traceback (most recent call last):' >&2; echo 'the first line' >&2; "
                                 "echo 'RuntimeError: the cause' >&2; exit 1")
    proc = cli("status", "--python", failing, "--json", cwd=str(tmp_path))
    reason = json.loads(proc.stdout)["reason"]
    assert proc.returncode == 3 and "could not report: exited with code 1: RuntimeError: the cause. Fix: read its " \
        "whole output" in reason, reason
    log = reason.split("`cat ")[1].split("`")[0]
    try:
        with open(log) as handle:
            kept = handle.read()
        assert "the first line" in kept and "RuntimeError: the cause" in kept, kept
        assert os.stat(log).st_mode & 0o077 == 0  # private: it may hold paths of the environment
    finally:
        os.remove(log)


def test_an_interpreter_that_cannot_start_could_not_verify_exit_3(tmp_path):
    broken = tmp_path / "python"
    broken.write_text("#!/nonexistent/interpreter\n")
    broken.chmod(0o755)
    proc = cli("status", "--python", str(broken), "--json", cwd=str(tmp_path))
    out = json.loads(proc.stdout)
    assert (proc.returncode, out["outcome"]) == (3, "could not verify"), out["reason"]
    assert "could not start %s" % broken in out["reason"] and "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- compiled-only distributions
#: torch_xla's ``optimizer_step`` as 2.1-2.9 write it (the guard's shape): reduce, step, barrier.
XLA_MODEL = xla_model_source()


def _enterprise(root, xla_release=None):
    """A folder holding an installed pytorch-lightning-enterprise 2.6.0 as its metadata alone (the shim must
    find it without importing it: no package beside it) and, given ``xla_release``, a stand-in torch_xla."""
    info = root / "pytorch_lightning_enterprise-2.6.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pytorch-lightning-enterprise\nVersion: 2.6.0\n")
    if xla_release:
        (root / "torch_xla" / "core").mkdir(parents=True)
        (root / "torch_xla" / "__init__.py").write_text("__version__ = %r\n" % xla_release)
        (root / "torch_xla" / "core" / "__init__.py").write_text("")
        (root / "torch_xla" / "core" / "xla_model.py").write_text(XLA_MODEL)
    return str(root)


def _status_with_enterprise(tmp_path, xla_release, **env):
    env = dict(env, PYTHONPATH=os.pathsep.join([_enterprise(tmp_path / "site", xla_release), REPO]))
    proc = cli("status", "--json", env=env, cwd=str(tmp_path))
    return proc.returncode, json.loads(proc.stdout)


def test_an_installed_compiled_only_distribution_is_named_covered_by_the_patched_guard(tmp_path):
    code, out = _status_with_enterprise(tmp_path, "2.9.0")
    assert (code, out["outcome"]) == (0, "protected"), out["reason"]
    (item,) = out["compiled_only"]
    assert item == {"distribution": "pytorch-lightning-enterprise", "release": "2.6.0", "integration": "torch_xla",
                    "covered_by": "torch_xla",
                    "call": "XLAPrecision.optimizer_step passes the closure to xm.optimizer_step",
                    "guard": "torch_xla.core.xla_model:optimizer_step patched"}
    (line,) = render.compiled_only_lines(out["compiled_only"])
    assert line.startswith("pytorch-lightning-enterprise 2.6.0 (compiled only") and \
        "covered by the torch_xla guard (torch_xla.core.xla_model:optimizer_step patched)." in line
    with open(os.path.join(REPO, "docs", "status.schema.json")) as handle:
        _validate(out, json.load(handle))
    text = cli("status", env={"PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), REPO])}, cwd=str(tmp_path))
    # the text wraps at 120 columns: the line's words, in order, with its line breaks read as spaces
    assert text.returncode == 0 and " ".join(line.split()) in " ".join(text.stdout.split())


@pytest.mark.parametrize("xla_release, env, guard", [
    ("2.9.0", {"TPU_CLOSURE_FIX_DISABLE": "torch_xla"}, "optimizer_step disabled (TPU_CLOSURE_FIX_DISABLE"),
    ("2.9.0", {"TPU_CLOSURE_FIX": "0"}, "optimizer_step disabled (TPU_CLOSURE_FIX=0"),
    ("2.10.0", {}, "optimizer_step skipped (unknown release 2.10.0"),  # the guard's release is unknown
])
def test_a_compiled_only_distribution_with_the_guard_not_in_place_is_covered_by_nothing(tmp_path, xla_release, env,
                                                                                         guard):
    code, out = _status_with_enterprise(tmp_path, xla_release, **env)
    # the guard's own site runs unguarded: that alone makes the interpreter unprotected
    assert (code, out["outcome"]) == (1, "unprotected"), out["reason"]
    (item,) = out["compiled_only"]
    assert item["covered_by"] is None and guard in item["guard"], item
    (line,) = render.compiled_only_lines(out["compiled_only"])
    assert "NOTHING covers it: the torch_xla guard is not in place (torch_xla.core.xla_model:" + guard in line


def test_a_compiled_only_distribution_without_torch_xla_is_named_and_nothing_covers_it(tmp_path):
    code, out = _status_with_enterprise(tmp_path, None)
    # no torch_xla: its XLA step cannot run here, nothing is affected
    assert (code, out["outcome"]) == (0, "nothing to protect"), out["reason"]
    (item,) = out["compiled_only"]
    assert item["covered_by"] is None and item["guard"] == "torch_xla.core.xla_model:optimizer_step not installed"


def test_without_a_compiled_only_distribution_nothing_is_named():
    assert report.compiled_only([]) == [] and render.compiled_only_lines([]) == []


# --------------------------------------------------------------------------- a PYTHONPATH relative to the working directory
@pytest.mark.parametrize("value, relative", [("deps", ["deps"]), ("/abs" + os.pathsep + "./lib" + os.pathsep + "..",
                                                                    ["./lib", ".."]),
                                             ("/abs", []), ("", []), (os.pathsep + "/abs", [])])
def test_relative_pythonpath_entries_are_named(value, relative):
    from tpu_closure_fix.verify import child

    assert child.relative_pythonpath({"PYTHONPATH": value}) == relative


def test_a_relative_pythonpath_entry_of_this_user_is_given_to_the_child_resolved(monkeypatch, tmp_path):
    """The interpreter that trains, started here, follows ``deps``: so does the child, by its absolute path. One
    naming no folder is left out (the training finds nothing there either)."""
    (tmp_path / "deps").mkdir(mode=0o755)
    monkeypatch.chdir(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([REPO, "deps", "gone"]))
    started = []
    monkeypatch.setattr(fresh.child, "run_child", lambda argv, timeout, env: started.append(env) or SimpleNamespace(
        payload={"facts": {}}, error=None, timed_out=False))
    assert fresh.run_status(flags=[]) == ({"facts": {}}, None)
    assert started[0]["PYTHONPATH"] == os.pathsep.join([REPO, os.path.realpath(str(tmp_path / "deps"))])


def test_a_relative_pythonpath_entry_others_can_write_gives_no_verdict_saying_why(monkeypatch, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.chdir(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([REPO, "shared"]))
    monkeypatch.setattr(fresh.child, "run_child", lambda *a, **k: pytest.fail("a child was started"))
    got, error = fresh.run_status(flags=[])
    assert got is None and error.startswith("PYTHONPATH holds 'shared', relative to the working directory: it "
                                            "names %s, which others can write" % os.path.realpath(str(shared)))
    assert "PYTHONPATH=$PWD/shared" in error
    out = status_outcome(got, error)
    assert out[:2] == ("could not verify", 3)
    # the header says why in words, never "python: ? (?)" nor a bare "unknown"
    header = render.header(outcome_payload.receive(got, error, asked="/venv/bin/python", environ={}))
    assert header == ["python: /venv/bin/python (no report, the outcome below says why)",
                      "start-up hook: not known (no report from /venv/bin/python: the outcome below says why)"], header


@pytest.mark.parametrize("flags", [["-E"], ["-I"]])
def test_a_relative_pythonpath_entry_twin_ignored_by_the_interpreter_does_not_matter(monkeypatch, flags):
    monkeypatch.setenv("PYTHONPATH", "deps")
    started = []
    monkeypatch.setattr(fresh.child, "run_child", lambda *a, **k: started.append(a) or SimpleNamespace(
        payload={"facts": {}}, error=None, timed_out=False))
    assert fresh.run_status(flags=flags) == ({"facts": {}}, None) and len(started) == 1


def test_status_with_a_framework_behind_a_relative_pythonpath_is_judged_as_behind_its_absolute_path(tmp_path):
    folder = _package(tmp_path, "import torch_xla.core.xla_model as xm\n" + UNCOVERED)
    name = os.path.relpath(folder, str(tmp_path))
    proc = cli("status", env={"PYTHONPATH": os.pathsep.join([name, REPO])}, cwd=str(tmp_path))
    assert proc.returncode == 3 and "XLA optimizer step no row covers" in proc.stdout, proc.stdout
    # the twin: the same folder by its absolute path is judged the same (here: an uncovered step)
    proc = cli("status", env={"PYTHONPATH": os.pathsep.join([folder, REPO])}, cwd=str(tmp_path))
    assert proc.returncode == 3 and "XLA optimizer step no row covers" in proc.stdout, proc.stdout


# --------------------------------------------------------------------------- a framework that cannot be imported
def test_known_fixes_of_import_failures_rule_by_rule():
    no_pkg_resources = ModuleNotFoundError("No module named 'pkg_resources'", name="pkg_resources")
    assert report.known_fix(no_pkg_resources) == "pip install 'setuptools<81'"
    assert report.known_fix(ModuleNotFoundError("No module named 'yaml'", name="yaml")) is None
    removed = AttributeError("`np.Inf` was removed in the NumPy 2.0 release. Use `np.inf` instead.")
    assert report.known_fix(removed, numpy_release="2.4.6") == "pip install 'numpy<2'"
    assert report.known_fix(removed, numpy_release="1.26.4") is None  # numpy 1: not the cause
    assert report.known_fix(AttributeError("no attribute 'x'"), numpy_release="2.4.6") is None
    assert report.known_fix(removed, numpy_release="") is None  # numpy not installed


#: A pytorch-lightning 1.8.6 as it fails with setuptools >= 81: its __init__ imports some of its modules, then
#: ``pkg_resources`` (what lightning_lite's __init__ does), which is not there.
FAILING_INIT = '''
__version__ = "1.8.6"
from pytorch_lightning.plugins.precision import tpu  # a submodule that stays imported after the failure
raise ModuleNotFoundError(%r, name=%r)
'''


def _unimportable(root, missing):
    package = root / "pytorch_lightning"
    (package / "plugins" / "precision").mkdir(parents=True)
    (package / "__init__.py").write_text(FAILING_INIT % ("No module named %r" % missing, missing))
    (package / "plugins" / "__init__.py").write_text("")
    (package / "plugins" / "precision" / "__init__.py").write_text("")
    (package / "plugins" / "precision" / "tpu.py").write_text(
        "class TPUPrecisionPlugin:\n    def optimizer_step(self, optimizer, model, closure, **kwargs):\n"
        "        return optimizer.step(closure=closure, **kwargs)\n")
    return str(root)


@pytest.mark.parametrize("missing, fix", [("pkg_resources", "pip install 'setuptools<81'"), ("yaml", None)])
def test_a_framework_that_cannot_be_imported_could_not_verify_naming_the_error_and_the_fix(tmp_path, missing, fix):
    """Before, its leftover submodule read as a release without __version__: "skipped", UNPROTECTED (exit 1)."""
    folder = _unimportable(tmp_path / "site", missing)
    proc = cli("status", "--json", env={"PYTHONPATH": os.pathsep.join([folder, REPO])}, cwd=str(tmp_path))
    out = json.loads(proc.stdout)
    assert (proc.returncode, out["outcome"]) == (3, "could not verify"), out["reason"]
    rows = [r for r in out["sites"] if r["verdict"] not in ("not installed", "not in this release")]
    error = "import failed: ModuleNotFoundError: No module named %r" % missing
    assert rows and all(r["verdict"] == "failed" and r["reason"].startswith(error) for r in rows), rows
    assert ("pytorch_lightning.plugins.precision.tpu:TPUPrecisionPlugin.optimizer_step" in
            ["%s:%s" % (r["module"], r["method"]) for r in rows])
    assert error in out["reason"]
    # a site module whose file the release does not hold is not in it (its neighbour's file is there)
    xla = [r for r in out["sites"] if r["module"] == "pytorch_lightning.plugins.precision.xla"]
    assert xla and {r["verdict"] for r in xla} == {"not in this release"}, xla
    if fix:  # the rows say the fix; the outcome names it once, for the interpreter asked about
        assert all(r["reason"].endswith("; fix: %s" % fix) for r in rows), rows
        assert out["reason"].endswith("Fix: `%s -m %s`." % (sys.executable, fix)), out["reason"]
        assert out["reason"].count("setuptools<81") == 1, out["reason"]
    else:  # no known cause: the import that shows the whole error, in the interpreter asked about
        assert "fix:" not in out["reason"], out["reason"]
        assert out["reason"].endswith("Fix: make `%s -c 'import pytorch_lightning.plugins.precision.tpu'` succeed (it shows "
                                      "the whole error)." % sys.executable), out["reason"]


@pytest.mark.parametrize("given, activated", [(facts(), True), (facts(switch="0", startup_armed=False), True),
                                              (unarmed(shim_origin=None), False)])
def test_the_child_activates_the_shim_only_where_the_start_up_hook_would(monkeypatch, given, activated):
    """The fresh child imported the shim held back; switched off it still activates (the switch's reason, as the
    start-up module does), with the hook inactive it never does."""
    from tpu_closure_fix import activation

    calls = []
    monkeypatch.setattr(activation, "activate", lambda: calls.append("activate"))
    monkeypatch.setattr(outcome_payload, "build", lambda f, hook: {"facts": f})
    monkeypatch.setattr(fresh.child, "emit", lambda value: calls.append("emit"))
    outcome_payload.child_main(given)
    assert calls == (["activate", "emit"] if activated else ["emit"])


def test_a_site_module_is_told_apart_by_its_file_without_importing(tmp_path, monkeypatch):
    package = tmp_path / "pytorch_lightning"
    (package / "plugins" / "precision").mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('never imported')\n")
    (package / "plugins" / "precision" / "tpu.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert report._source_exists("pytorch_lightning.plugins.precision.tpu")
    assert not report._source_exists("pytorch_lightning.plugins.precision.xla")
    assert report._may_hold("pytorch_lightning", "pytorch_lightning.plugins.precision.tpu")
    assert not report._may_hold("pytorch_lightning", "pytorch_lightning.plugins.precision.xla")
    (package / "plugins" / "precision" / "tpu.py").unlink()  # no site file at all: nothing tells, so each may be
    assert report._may_hold("pytorch_lightning", "pytorch_lightning.plugins.precision.xla")


def test_an_interpreter_without_packaging_is_told_the_fix(monkeypatch):
    """An interpreter asked with --python lends its own packaging; without one, the comparison says what to do."""
    from tpu_closure_fix import releases

    monkeypatch.setitem(sys.modules, "packaging.version", None)
    with pytest.raises(ImportError, match="pip install packaging"):
        releases.in_range("1.8.6", ">=1.5.0,<1.9.0")
    monkeypatch.undo()
    assert releases.in_range("1.8.6", ">=1.5.0,<1.9.0")  # the twin: packaging there, the release compared


def test_status_read_by_a_reader_that_leaves_early_prints_no_traceback(tmp_path):
    """``tpu-closure-fix status | head -1``: the reader closes the pipe before the table is written. No traceback
    on stderr (it was a BrokenPipeError's), and the exit a shell reports for SIGPIPE (128 + 13)."""
    proc = subprocess.Popen([sys.executable, "-m", "tpu_closure_fix", "status", "--all"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=REPO), cwd=str(tmp_path))
    proc.stdout.close()  # the reader is gone before the first line
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=600) == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr

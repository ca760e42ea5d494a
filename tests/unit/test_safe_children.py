"""Every Python the tool starts searches neither the working directory nor a relative path.

``tpu-closure-fix check`` is run from a shared directory (like ``cd /tmp``) in which the second local user
planted ``torch.py``, ``tpu_closure_fix.py``, ``json.py`` and ``runpy.py``: none of them may run (each
would append its name to a marker file).  The parent is started as the console script is (its own
directory, never the working directory, on ``sys.path``); its self-test child is what is under test.
The twin starts that child the way check started it before (``python -m``): the planted files run.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from support.local_users import plant_markers, ran, second_user, shared_directory
from support.xla_model_source import xla_model_source

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLANTED = ("torch", "tpu_closure_fix", "json", "runpy")


@pytest.fixture
def planted():
    shared = shared_directory()
    marker = os.path.join(shared, "ran.txt")
    plant_markers(shared, PLANTED, marker)
    yield shared, marker
    shutil.rmtree(shared, ignore_errors=True)


def environment(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TPU_CLOSURE_FIX", "PYTHONSAFEPATH")}
    env["PYTHONPATH"] = REPO
    env.update(extra)
    return env


def tool(tmp_path, *args, pythonpath_for_children=None):
    """``tpu-closure-fix ARGS`` of this checkout, started as the console script is: a script file in its own
    directory, which Python puts first on ``sys.path`` (never the working directory).

    ``pythonpath_for_children``: the PYTHONPATH the tool's children inherit, set once the tool has started
    (the tool itself never searches it)."""
    script = tmp_path / "tpu-closure-fix"
    script.write_text("import os, sys\nsys.path.insert(0, %r)\n%sfrom tpu_closure_fix.cli import main\n"
                      "sys.exit(main(%r))\n" % (REPO, "" if pythonpath_for_children is None else
                                               "os.environ['PYTHONPATH'] = %r\n" % pythonpath_for_children,
                                               list(args)))
    return [sys.executable, str(script)]


@second_user
def test_check_never_runs_a_module_planted_in_the_working_directory(planted, tmp_path):
    shared, marker = planted
    proc = subprocess.run(tool(tmp_path, "check", "--timeout", "300"), cwd=shared, env=environment(), capture_output=True,
                          text=True, timeout=400)
    assert ran(marker) == [], "check ran the planted %s" % ran(marker)
    # the self-test really ran (it imported the real torch): an outcome line, not a crash
    assert proc.returncode in (0, 1, 3) and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "Event-order self-test" in proc.stdout and "self-test process" not in proc.stdout, proc.stdout


@second_user
def test_a_relative_pythonpath_entry_is_not_searched_by_any_child(planted, tmp_path):
    """``PYTHONPATH=.`` (or an entry split off at a colon) would name the working directory again: no child
    searches it, and with nothing known of what it holds, no verdict is given (exit 3, naming it)."""
    shared, marker = planted
    proc = subprocess.run(tool(tmp_path, "check", "--no-graph", "--timeout", "300",
                               pythonpath_for_children=REPO + os.pathsep + "."),
                          cwd=shared, capture_output=True, text=True, timeout=400, env=environment())
    assert ran(marker) == [] and proc.returncode == 3, (ran(marker), proc.stdout[-2000:], proc.stderr[-2000:])
    assert "COULD NOT VERIFY: PYTHONPATH holds '.'" in proc.stdout, proc.stdout[-2000:]


@second_user
def test_the_self_test_child_started_with_dash_m_runs_them_twin(planted):
    shared, marker = planted
    subprocess.run([sys.executable, "-m", "tpu_closure_fix.verify.events", "--child"], cwd=shared,
                   env=environment(), capture_output=True, text=True, timeout=300)
    assert ran(marker) in (["tpu_closure_fix"], ["runpy"])  # Python < 3.9 imports runpy from there first


@pytest.fixture(scope="module")
def other_python(tmp_path_factory):
    """Another interpreter (a venv with nothing installed), as given to ``check --xla-python``."""
    root = tmp_path_factory.mktemp("other")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    return str(root / "venv" / "bin" / "python")


@second_user
def test_the_xla_python_probe_never_runs_a_module_planted_in_the_working_directory(planted, tmp_path,
                                                                                    other_python):
    """``--xla-python``: a child of that interpreter asks whether it can import torch_xla (it cannot here). The
    interpreter asked has a stand-in torch_xla installed, so that check has a site to test and runs its
    self-tests (with none installed, it answers "nothing to protect" before any)."""
    shared, marker = planted
    site = tmp_path / "site"
    (site / "torch_xla" / "core").mkdir(parents=True)
    (site / "torch_xla" / "__init__.py").write_text("__version__ = '2.1.0'\n")
    (site / "torch_xla" / "core" / "__init__.py").write_text("")
    (site / "torch_xla" / "core" / "xla_model.py").write_text(xla_model_source())
    proc = subprocess.run(tool(tmp_path, "check", "--xla-python", other_python, "--timeout", "300",
                               pythonpath_for_children=REPO + os.pathsep + str(site)), cwd=shared,
                          env=environment(), capture_output=True, text=True, timeout=400)
    assert ran(marker) == [], "the probe ran the planted %s" % ran(marker)
    assert proc.returncode == 3 and "--xla-python %s cannot import torch_xla" % other_python in proc.stdout, \
        proc.stdout[-2000:] + proc.stderr[-2000:]


# --------------------------------------------------------------------------- --python NAME: looked up on PATH only
def test_a_bare_interpreter_name_is_looked_up_in_the_absolute_path_entries_only(tmp_path):
    from tpu_closure_fix.verify.child import interpreter_path

    planted = tmp_path / "python3"
    planted.write_text("#!/bin/sh\nexit 0\n")
    planted.chmod(0o755)
    bin_dir = os.path.dirname(sys.executable)
    here = os.getcwd()
    try:
        os.chdir(str(tmp_path))
        # '', '.' and a relative entry all name the working directory: never searched
        assert interpreter_path("python3", {"PATH": os.pathsep.join(["", ".", "sub", "/nonexistent"])}) is None
        assert interpreter_path("python3", {"PATH": os.pathsep.join([".", bin_dir])}) == os.path.join(bin_dir,
                                                                                                   "python3")
        assert interpreter_path("./python3", {"PATH": bin_dir}) == str(planted)  # a path is that file
    finally:
        os.chdir(here)


@pytest.mark.parametrize("command", ["status", "check"])
def test_python_python3_never_runs_a_planted_python3_in_the_working_directory(tmp_path, command):
    """``--python python3`` ran ``./python3``: a name is looked up on PATH as a shell does. The twin: asked for by
    its path, the planted file is what runs (the marker shows a run)."""
    marker = tmp_path / "ran.txt"
    planted = tmp_path / "python3"
    planted.write_text("#!/bin/sh\necho planted >> %s\nexit 1\n" % marker)
    planted.chmod(0o755)
    bin_dir = os.path.dirname(sys.executable)
    env = environment(PATH=os.pathsep.join([".", bin_dir, os.environ.get("PATH", "")]))
    args = [command, "--python", "python3", "--json"] + (["--no-graph"] if command == "check" else [])
    proc = subprocess.run(tool(tmp_path, *args), cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=600)
    assert not marker.exists(), "the planted ./python3 ran"
    out = json.loads(proc.stdout)
    assert out["python"]["executable"] == os.path.join(bin_dir, "python3"), out["python"]
    twin = subprocess.run(tool(tmp_path, "status", "--python", "./python3", "--json"), cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=600)
    assert marker.exists() and json.loads(twin.stdout)["exit_code"] == 3

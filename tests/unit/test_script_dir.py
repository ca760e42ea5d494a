"""A framework in the training script's directory: no verdict is about it, and nothing of it runs.

``python train.py`` imports a ``pytorch_lightning/`` beside ``train.py`` before site-packages; the fresh
interpreter of ``status`` never searches that directory. The rules of :mod:`tpu_closure_fix.verify.script_dir`
one by one, the outcome rule of ``tpu_closure_fix.outcome.decide``, then the real command run from such a directory (and
with ``--script``): COULD NOT VERIFY (exit 3) naming the package, the release and the directory, and the planted
package never runs. Before, the same run said NOTHING TO PROTECT, exit 0.
"""
import json
import os
import subprocess
import sys

import pytest

from support.outcomes import status_outcome
from tpu_closure_fix.verify import script_dir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("pytorch_lightning", "lightning", "optimum.neuron", "torch_xla")


def write(path, text=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# --------------------------------------------------------------------------- the rules
@pytest.mark.parametrize("flags, version, environ, searched", [
    ([], "3.11.7", {}, True),
    (["-I"], "3.11.7", {}, False),  # isolated: the script's directory is not on sys.path
    ([], "3.11.7", {"PYTHONSAFEPATH": "1"}, False),  # 3.11+ honours PYTHONSAFEPATH
    ([], "3.10.13", {"PYTHONSAFEPATH": "1"}, True),  # before 3.11 it is ignored
    (["-E"], "3.12.1", {"PYTHONSAFEPATH": "1"}, True),  # -E ignores it
])
def test_where_the_script_directory_is_searched(flags, version, environ, searched):
    assert script_dir.searched(flags, version, environ) is searched


def test_what_counts_as_a_framework_in_the_directory(tmp_path):
    write(tmp_path / "pytorch_lightning" / "__init__.py", "__version__ = '1.0.8'\n")
    write(tmp_path / "torch_xla.py")  # a module file shadows too
    write(tmp_path / "lightning" / "README.md")  # a folder without __init__: a namespace portion, shadows nothing
    write(tmp_path / "optimum" / "neuron" / "__init__.py")  # inside a namespace folder: optimum.neuron
    found = script_dir.packages_in(str(tmp_path), PACKAGES)
    assert found == [("optimum.neuron", str(tmp_path / "optimum" / "neuron")),
                     ("pytorch_lightning", str(tmp_path / "pytorch_lightning")),
                     ("torch_xla", str(tmp_path / "torch_xla.py"))]
    assert script_dir.packages_in(str(tmp_path / "lightning"), PACKAGES) == []


def test_a_regular_top_package_shadows_its_dotted_framework(tmp_path):
    write(tmp_path / "optimum" / "__init__.py")  # a regular optimum hides the installed optimum.neuron
    assert script_dir.packages_in(str(tmp_path), ["optimum.neuron"]) == [("optimum.neuron", str(tmp_path / "optimum"))]


def test_the_release_is_read_from_a_literal_never_run(tmp_path):
    marker = tmp_path / "ran"
    write(tmp_path / "a" / "__init__.py", "open(%r, 'w').close()\n__version__ = '1.0.8'\n" % str(marker))
    write(tmp_path / "b" / "__init__.py", "from .__about__ import *\n")
    write(tmp_path / "b" / "__about__.py", "__version__ = \"1.8.6\"\n")
    write(tmp_path / "c" / "__init__.py", "__version__ = compute()\n")
    assert script_dir.release_of(str(tmp_path / "a")) == "1.0.8" and not marker.exists()
    assert script_dir.release_of(str(tmp_path / "b")) == "1.8.6"
    assert script_dir.release_of(str(tmp_path / "c")) is None
    assert script_dir.release_of(str(tmp_path / "missing")) is None


def test_the_files_the_fresh_interpreter_imported_are_judged_already(tmp_path):
    write(tmp_path / "pytorch_lightning" / "__init__.py")
    path = str(tmp_path / "pytorch_lightning")
    assert script_dir.shadowing(str(tmp_path), PACKAGES, {"pytorch_lightning": [path]}) == []
    assert script_dir.shadowing(str(tmp_path), PACKAGES, {"pytorch_lightning": ["/venv/site/pytorch_lightning"]}) == \
        [{"package": "pytorch_lightning", "path": path, "release": None}]


def test_the_directory_is_the_script_s_resolved_or_the_working_directory(tmp_path, monkeypatch):
    write(tmp_path / "real" / "train.py")
    os.symlink(str(tmp_path / "real" / "train.py"), str(tmp_path / "train.py"))
    assert script_dir.directory_of(str(tmp_path / "train.py")) == os.path.realpath(str(tmp_path / "real"))
    monkeypatch.chdir(str(tmp_path))
    assert script_dir.directory_of() == os.getcwd()


def _payload(found):
    facts = {"executable": "/venv/bin/python", "version": "3.11.7", "startup_armed": True, "startup_loaded": True,
             "shim_at_start": False, "switch": None, "flags": {}, "site_dirs": ["/s"], "pth_in": ["/s"],
             "shim_origin": "/s/tpu_closure_fix/__init__.py"}
    return {"facts": facts, "records": [], "beside_script": {"directory": "/work", "found": found}}


def test_the_outcome_with_a_framework_beside_the_script_is_could_not_verify():
    found = [{"package": "pytorch_lightning", "path": "/work/pytorch_lightning", "release": "1.0.8"}]
    name, code, reason = status_outcome(_payload(found))
    assert (name, code) == ("could not verify", 3)
    assert reason.startswith("COULD NOT VERIFY: pytorch_lightning 1.0.8 at /work/pytorch_lightning is what a script "
                             "run from /work imports"), reason
    # one fix, runnable as printed: that release installed into the interpreter asked about, the folder moved away
    assert reason.endswith(" Fix: install it into the interpreter, `/venv/bin/python -m pip install "
                           "pytorch-lightning==1.0.8`, and move /work/pytorch_lightning out of /work."), reason
    unknown = [dict(found[0], release=None)]  # no release read: the newest verified range of its rows
    assert "`/venv/bin/python -m pip install 'pytorch-lightning>=" in status_outcome(_payload(unknown))[2]
    # the twin: nothing there, and nothing installed: nothing to protect
    assert status_outcome(_payload([]))[:2] == ("nothing to protect", 0)


# --------------------------------------------------------------------------- the real command
def vendored(root):
    """A project directory: train.py and a vendored pytorch_lightning 1.0.8 whose import would leave a marker."""
    marker = root / "imported"
    write(root / "train.py", "import pytorch_lightning\n")
    write(root / "pytorch_lightning" / "__init__.py", "open(%r, 'w').close()\n__version__ = '1.0.8'\n" % str(marker))
    return marker


def tool(*args, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TPU_CLOSURE_FIX")}
    return subprocess.run([sys.executable, os.path.join(os.path.dirname(sys.executable), "tpu-closure-fix")] +
                          list(args), env=env, capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.mark.parametrize("command", ["status", "check"])
def test_run_from_the_script_s_directory_could_not_verify_naming_the_framework(tmp_path, command):
    project = tmp_path / "project"
    marker = vendored(project)
    args = [command, "--json"] + (["--no-graph"] if command == "check" else [])
    proc = tool(*args, cwd=str(project))
    out = json.loads(proc.stdout)
    assert (proc.returncode, out["outcome"]) == (3, "could not verify"), out["reason"]
    assert out["beside_script"] == [{"package": "pytorch_lightning", "path": str(project / "pytorch_lightning"),
                                     "release": "1.0.8"}]
    assert "pytorch_lightning 1.0.8 at %s" % (project / "pytorch_lightning") in out["reason"]
    assert not marker.exists(), "the vendored package ran"


def test_script_names_the_directory_wherever_status_runs_from(tmp_path):
    project = tmp_path / "project"
    marker = vendored(project)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = tool("status", "--script", str(project / "train.py"), cwd=str(elsewhere))
    said = " ".join(proc.stdout.split())  # status wraps its lines at 120 columns
    assert proc.returncode == 3 and "pytorch_lightning 1.0.8 at %s" % (project / "pytorch_lightning") in said
    assert not marker.exists()
    # the twin: a script in a directory without a framework, run from the project: nothing to protect here
    write(elsewhere / "train.py")
    proc = tool("status", "--script", str(elsewhere / "train.py"), cwd=str(project))
    assert proc.returncode == 0 and "NOTHING TO PROTECT" in proc.stdout, proc.stdout


def test_script_must_name_a_file(tmp_path):
    proc = tool("status", "--script", str(tmp_path / "missing.py"), cwd=str(tmp_path))
    said = " ".join(proc.stderr.split())  # wrapped to the terminal's width where the path is long
    assert proc.returncode == 2 and "is not a file (give the training script, e.g. --script train.py)" in said, said


# --------------------------------------------------------------------------- a scan that fails
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def plant_unreadable(directory):
    """A ``pytorch_lightning`` entry in ``directory`` that cannot be examined: a folder of mode 000 (another user
    cannot enter it); as root, whom no mode stops, a symbolic link to itself (a loop stops every user). Returns
    the exception type the scan meets, and a function restoring the mode (for the clean-up)."""
    entry = directory / "pytorch_lightning"
    if IS_ROOT:
        os.symlink("pytorch_lightning", str(entry))
        return OSError, lambda: None
    write(entry / "__init__.py", "__version__ = '1.0.8'\n")
    entry.chmod(0o000)
    return PermissionError, lambda: entry.chmod(0o755)


def test_a_path_that_cannot_be_examined_fails_the_scan_instead_of_reading_as_absent(tmp_path):
    failure, restore = plant_unreadable(tmp_path)
    try:
        with pytest.raises(failure):
            script_dir.packages_in(str(tmp_path), PACKAGES)
    finally:
        restore()
    # the twin: a name that is simply not there reads as absent
    assert script_dir.packages_in(str(tmp_path / "empty"), PACKAGES) == []


@pytest.mark.parametrize("exc, fix", [
    (PermissionError(13, "Permission denied"), "Fix: run this command as a user who can read /work/proj (the one "
                                               "that trains; `ls -ld /work/proj` shows its owner and mode)"),
    (OSError(40, "Too many levels of symbolic links"), "Fix: repair or remove the path named there "
                                                       "(`ls -l /work/proj`)"),
])
def test_a_failed_scan_names_what_failed_the_path_and_the_fix_for_that_failure(exc, fix):
    reason = script_dir.scan_failure("/work/proj", exc)
    assert reason.startswith("the scan of /work/proj, ") and "(%s: %s)" % (type(exc).__name__, exc) in reason
    assert fix in reason and reason.endswith("for a training script elsewhere, name it: `--script PATH`"), reason


def test_a_working_directory_gone_names_the_fix_of_running_from_the_script_s_directory():
    reason = script_dir.scan_failure(None, FileNotFoundError(2, "No such file or directory"))
    assert reason.startswith("the working directory, ") and "FileNotFoundError" in reason
    assert reason.endswith("Fix: run this command from the directory the training script is run from, or name the "
                           "script: `--script PATH`"), reason


def test_the_outcome_after_a_failed_scan_is_could_not_verify():
    failed = _payload([])
    failed["beside_script"]["error"] = script_dir.scan_failure("/work", PermissionError(13, "Permission denied"))
    name, code, reason = status_outcome(failed)
    assert (name, code) == ("could not verify", 3)
    assert reason == "COULD NOT VERIFY: %s." % failed["beside_script"]["error"]
    # the twin: the same payload scanned without a failure has its verdict
    assert status_outcome(_payload([]))[:2] == ("nothing to protect", 0)


@pytest.mark.parametrize("command", ["status", "check"])
def test_run_from_a_directory_that_cannot_be_scanned_could_not_verify_naming_it(tmp_path, command):
    from tpu_closure_fix import check

    project = tmp_path / "project"
    write(project / "train.py", "import pytorch_lightning\n")
    failure, restore = plant_unreadable(project)
    try:
        args = [command, "--json"] + (["--no-graph"] if command == "check" else [])
        proc = tool(*args, cwd=str(project))
    finally:
        restore()
    out = json.loads(proc.stdout)
    assert (proc.returncode, out["outcome"]) == (3, "could not verify"), out["reason"]
    assert out["reason"].startswith("COULD NOT VERIFY: the scan of %s, " % project), out["reason"]
    assert "(%s: " % failure.__name__ in out["reason"] and "`--script PATH`" in out["reason"], out["reason"]
    if command == "check":  # no self-test about what is unknown
        assert out["event_check"]["not_run"] == check.NOT_RUN[2]

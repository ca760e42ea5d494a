"""Issue #6, faults: each injected in a fresh subprocess against the real pytorch-lightning 1.8.6.

Faults: the target method renamed (attribute missing); its signature changed; a
shim hook that raises; wrapt missing; the oldest supported wrapt (1.14.1);
``importlib.reload`` of the call-site module; Lightning imported from a zip;
``python -S``; a read-only site-packages; enabling after a Trainer has stepped.

"Missing attribute" and "changed signature" edit a *copy* of the installed
Lightning package (the real code, modified as a local patch would be) that is
put first on PYTHONPATH. Only torch_xla is the stand-in.

In every case: Lightning imports and ``Trainer.fit`` trains, ``status()`` says
what happened and why, and the user sees exactly one ``tpu-closure-fix``
warning (none for the supported configurations: wrapt 1.14.1, zip, reload,
read-only site-packages). Where a fault leaves Lightning's own code in place
while the shim is on, that code's ``xm.optimizer_step(optimizer_args={"closure":
...})`` call still goes through the torch_xla guard (the stand-in takes
torch_xla's place after Lightning is imported, and the guard is patched then),
so the recorded order is the guard's, never the bug; the shim-off twin shows
the release's own order.

Each scenario is a function of support/fault_scenarios.py, run as
``python -m support.fault_scenarios NAME`` in the fault's environment.
"""
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

import pytest

from conftest import REPO, TARGET, base_purelib, run_module, target_dir, warnings_of
from support.package_copy import copy_package, write_source

# These tests inject faults into one concrete release; the other matrix targets skip them.
pytestmark = pytest.mark.skipif(TARGET != "pytorch-lightning==1.8.6", reason="fault tests run on PL 1.8.6 only")

TIMEOUT = 240

FIXED = ["forward", "backward", "reduce_gradients", "mark_step"]   # one step, reduction after backward
BUGGY = ["reduce_gradients", "forward", "backward"]                # one step, reduction first (the bug)
PLAIN = ["forward", "backward"]                                    # plain PrecisionPlugin step: no xm at all
# Lightning's unpatched code passing its closure to xm.optimizer_step (barrier=False), through the torch_xla guard:
GUARDED = ["forward", "backward", "reduce_gradients"]


def scenario(tmp_path, name="standard", args=(), pythonpath=None, env=None, python=None, python_args=(),
             prefix=()):
    """Run support.fault_scenarios ``name`` in a fresh interpreter; return (probe output, stderr, warnings)."""
    out, proc = run_module("fault_scenarios", [name] + list(args), cwd=tmp_path, pythonpath=pythonpath, env=env,
                           python=python, python_args=python_args, prefix=prefix, timeout=TIMEOUT)
    return out, proc.stderr, warnings_of(proc.stderr)


def by_method(status):
    return {r["method"]: r for r in status}


def overlay(tmp_path, edit):
    """A copy of the installed pytorch_lightning with ``edit(text)`` applied to the call-site module."""
    root = tmp_path / "overlay"
    copy_package(os.path.join(target_dir(), "pytorch_lightning"), root / "pytorch_lightning")
    path = root / "pytorch_lightning" / "plugins" / "precision" / "tpu.py"
    original = path.read_text()
    edited = edit(original)
    assert edited != original
    write_source(path, edited)
    return [str(root), REPO, target_dir()]


# --------------------------------------------------------------------------- faults in Lightning's code
def test_method_renamed(tmp_path):
    path = overlay(tmp_path, lambda s: s.replace("def optimizer_step(", "def optimizer_step_renamed(", 1))
    (tmp_path / "run").mkdir()
    out, stderr, warned = scenario(tmp_path / "run", pythonpath=path)
    assert out["global_step"] == 2 and out["events"] == PLAIN * 2  # the inherited PrecisionPlugin step
    status = by_method(out["status"])
    site = status["TPUPrecisionPlugin.optimizer_step"]
    assert site["verdict"] == "skipped" and "defines no optimizer_step" in site["reason"], site
    assert status["TPUBf16PrecisionPlugin.optimizer_step"]["verdict"] == "skipped"
    assert len(warned) == 1 and "defines no optimizer_step" in warned[0], stderr[-3000:]


def test_signature_changed(tmp_path):
    # A new optional parameter after ``closure`` (Lightning's strategy passes these by keyword, so it still runs).
    path = overlay(tmp_path, lambda s: s.replace("closure: Callable[[], Any],\n", "closure: Callable[[], Any],\n"
                                                 "        scale: float = 1.0,\n", 1))
    (tmp_path / "run").mkdir()
    out, stderr, warned = scenario(tmp_path / "run", pythonpath=path)
    assert out["global_step"] == 2 and out["depth"] == 0  # Lightning's own code, untouched ...
    assert out["events"] == GUARDED * 2  # ... whose xm.optimizer_step(closure) call the torch_xla guard fixes
    site = by_method(out["status"])["TPUPrecisionPlugin.optimizer_step"]
    assert site["verdict"] == "guarded" and "unexpected code shape" in site["reason"], site
    assert "parameters" in site["reason"] and "torch_xla guard" in site["reason"], site
    assert len(warned) == 1 and "unexpected code shape" in warned[0], stderr[-3000:]
    # The twin: the same edited release with the shim off runs its own order (the bug).
    (tmp_path / "off").mkdir()
    out, stderr, warned = scenario(tmp_path / "off", pythonpath=path, env={"TPU_CLOSURE_FIX": "0"})
    assert out["depth"] == 0 and out["events"] == BUGGY * 2
    assert by_method(out["status"])["TPUPrecisionPlugin.optimizer_step"]["verdict"] == "skipped"
    assert warned == [], stderr[-3000:]


# --------------------------------------------------------------------------- faults in the shim
def test_shim_hook_raises(tmp_path):
    out, stderr, warned = scenario(tmp_path, "hook-raises")
    # The site keeps Lightning's function; its xm.optimizer_step(closure) call goes through the torch_xla guard.
    assert out["global_step"] == 2 and out["depth"] == 0 and out["events"] == GUARDED * 2
    site = by_method(out["status"])["TPUPrecisionPlugin.optimizer_step"]
    # Protected, and said so: the site's own fix failed, but its call goes through the patched guard.
    assert site["verdict"] == "guarded" and "its fix failed: RuntimeError: injected fault" in site["reason"], site
    assert "torch_xla guard" in site["reason"], site
    assert len(warned) == 1 and "injected fault" in warned[0], stderr[-3000:]


def test_wrapt_missing(tmp_path):
    # Auto-enable through the .pth of the base venv: the shim activates on the Lightning import.
    out, stderr, warned = scenario(tmp_path, "wrapt-missing")
    assert out["global_step"] == 2 and out["depth"] == 0 and out["events"] == BUGGY * 2
    site = by_method(out["status"])["TPUPrecisionPlugin.optimizer_step"]
    assert site["verdict"] == "disabled" and "wrapt is not importable" in site["reason"], site
    assert len(warned) == 1 and "wrapt" in warned[0], stderr[-3000:]


@pytest.mark.parametrize("wrapt_version", ["installed", "1.14.1"])
def test_reload_of_the_call_site_module(tmp_path, wrapt_version):
    """Also the oldest supported wrapt (matrix target pytorch-lightning==1.8.6+wrapt-1.14.1): patched, no warning."""
    wrapt_dir = []
    if wrapt_version == "1.14.1":
        wrapt_dir = [oldest_wrapt(tmp_path / "wrapt")]
    out, stderr, warned = scenario(tmp_path, "reload", pythonpath=[REPO] + wrapt_dir + [target_dir()])
    if wrapt_version == "1.14.1":
        assert out["wrapt"] == "1.14.1"
    out = out["result"]
    assert out["first"]["events"] == FIXED * 2
    assert out["after_reload"]["depth"] == 1, out
    assert by_method(out["after_reload"]["status"])["TPUPrecisionPlugin.optimizer_step"]["verdict"] == "patched"
    assert out["global_step"] == 2 and out["events"] == FIXED * 2
    # a Trainer built before the reload keeps the old class, whose wrapper stays in place and active
    assert out["old_class_step"] == ["closure", "reduce_gradients", "mark_step"]
    assert warned == [], stderr[-3000:]


def oldest_wrapt(folder):
    """The oldest supported wrapt alone, installed into ``folder`` from the wheels of the matrix target that pins it
    (over the same Lightning 1.8.6 pins): what that target puts before the venv's wrapt, without a second copy of
    Lightning and its dependencies. Its own folder: the matrix deletes the target's after its tests (--prune)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_targets", os.path.join(REPO, "scripts", "targets.py"))
    targets = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(targets)
    wheels = targets.fetch("pytorch-lightning==1.8.6+" + targets.WRAPT_OLDEST)  # a no-op once fetched
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile",
                    "--disable-pip-version-check", "--find-links", str(wheels), "--target", str(folder),
                    targets.WRAPT_OLDEST], check=True, timeout=600)
    return str(folder)


def test_lightning_from_a_zip(tmp_path):
    archive = tmp_path / "lightning.zip"
    with zipfile.ZipFile(str(archive), "w") as zf:
        for package in ("pytorch_lightning", "lightning_lite"):
            top = os.path.join(target_dir(), package)
            for folder, dirs, files in os.walk(top):
                dirs[:] = [d for d in dirs if d != "__pycache__"]
                for name in files:
                    full = os.path.join(folder, name)
                    zf.write(full, os.path.relpath(full, target_dir()))
    (tmp_path / "run").mkdir()
    out, stderr, warned = scenario(tmp_path / "run", "from-zip", pythonpath=[str(archive), REPO, target_dir()])
    assert out["origin"].startswith(str(archive)), out["origin"]
    assert out["events"] == FIXED * 2 and out["depth"] == 1
    assert by_method(out["status"])["TPUPrecisionPlugin.optimizer_step"]["verdict"] == "patched"
    assert warned == [], stderr[-3000:]


# --------------------------------------------------------------------------- start-up conditions
def test_python_dash_S(tmp_path):
    # -S: no site-packages start-up files, so the .pth auto-enable does not run. Everything else is found
    # through PYTHONPATH (the base venv's site-packages included, where the .pth sits unread).
    out, stderr, warned = scenario(tmp_path, "no-site", pythonpath=[REPO, target_dir(), base_purelib()],
                                   python_args=["-S"])
    assert out["loaded_before"] is False and out["events"] == BUGGY * 2 and out["global_step"] == 2
    assert out["depth"] == 1 and out["next_step"] == ["closure", "reduce_gradients", "mark_step"]
    assert by_method(out["status"])["TPUPrecisionPlugin.optimizer_step"]["verdict"] == "patched"
    assert len(warned) == 1 and "already taken 2 optimizer step" in warned[0], stderr[-3000:]


def test_enable_after_a_trainer_stepped(tmp_path):
    out, stderr, warned = scenario(tmp_path, "late", env={"TPU_CLOSURE_FIX": "0"})
    assert out["events"] == BUGGY * 2
    off = by_method(out["off"])["TPUPrecisionPlugin.optimizer_step"]
    assert off["verdict"] == "disabled" and "TPU_CLOSURE_FIX=0" in off["reason"]
    assert out["depth"] == 1 and out["next_step"] == ["closure", "reduce_gradients", "mark_step"]
    assert by_method(out["status"])["TPUPrecisionPlugin.optimizer_step"]["verdict"] == "patched"
    assert len(warned) == 1 and "already taken 2 optimizer step" in warned[0], stderr[-3000:]


@pytest.mark.parametrize("steps, subclass, dropped", [(2, True, False), (0, False, False), (2, False, True)],
                         ids=["trainer-subclass-stepped", "not-stepped", "stepped-then-dropped"])
def test_enable_late_warns_only_after_steps(tmp_path, steps, subclass, dropped):
    # The late-enable check finds Trainer instances through their class (gc.get_referrers), subclasses
    # included; a Trainer that has not stepped yet is no reason to warn. Only live Trainers count: one the
    # program dropped is still uncollected garbage in its reference cycles at enable() (asserted), and
    # counting it would make the warning depend on when the collector last ran.
    args = ["--steps", str(steps)] + (["--subclass"] if subclass else []) + (["--dropped"] if dropped else [])
    out, stderr, warned = scenario(tmp_path, "late-any-trainer", args=args, env={"TPU_CLOSURE_FIX": "0"})
    assert out["global_step"] == steps and out["events"] == BUGGY * steps
    assert out["depth"] == 1 and out["uncollected_before_enable"] is True
    assert by_method(out["status"])["TPUPrecisionPlugin.optimizer_step"]["verdict"] == "patched"
    if steps and not dropped:
        assert len(warned) == 1 and "already taken %d optimizer step" % steps in warned[0], stderr[-3000:]
    else:
        assert warned == [], stderr[-3000:]


def test_read_only_site_packages(shim_wheel):
    """A wheel install into a fresh venv whose site-packages is then made read-only (the .pth still works)."""
    root = tempfile.mkdtemp(prefix="tcf-readonly-")
    try:
        _read_only_scenario(pathlib.Path(root), shim_wheel)
    finally:
        for folder, dirs, files in os.walk(root):
            os.chmod(folder, 0o755)
        shutil.rmtree(root, ignore_errors=True)


def _read_only_scenario(tmp_path, wheel):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=120)
    python = str(tmp_path / "venv" / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with zipfile.ZipFile(wheel) as zf:  # a pure wheel: installing it is unpacking it into site-packages
        zf.extractall(site)
    with open(os.path.join(site, "zz_base_venv.pth"), "w") as handle:  # torch, wrapt... after our own files
        handle.write(base_purelib() + "\n")
    if os.geteuid() == 0:
        # root ignores permission bits: give the scenario a private mount namespace where site-packages
        # is a read-only bind mount (writes fail with EROFS, for root too).
        if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
            pytest.skip("running as root without unshare -m: cannot make site-packages read-only")
        prefix = ("unshare", "-m", "sh", "-c", 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && '
                  'exec "$@"', site)
    else:
        prefix = ()
        for folder, dirs, files in os.walk(site):
            for name in files:
                os.chmod(os.path.join(folder, name), 0o444)
            for name in dirs:
                os.chmod(os.path.join(folder, name), 0o555)
        os.chmod(site, 0o555)
    run = tmp_path / "run"
    run.mkdir()
    out, stderr, warned = scenario(run, "read-only", pythonpath=[target_dir()], python=python, prefix=prefix)
    assert out["site_packages_writable"] is False
    assert out["events"] == FIXED * 2 and out["depth"] == 1
    assert by_method(out["status"])["TPUPrecisionPlugin.optimizer_step"]["verdict"] == "patched"
    assert warned == [], stderr[-3000:]

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
read-only site-packages).
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import zipfile

import pytest

from conftest import REPO, TARGET, TESTS
from tpu_closure_fix.verify.child import run_child

# These tests inject faults into one concrete release; the other matrix targets skip them.
pytestmark = pytest.mark.skipif(TARGET != "pytorch-lightning==1.8.6", reason="fault tests run on PL 1.8.6 only")

TIMEOUT = 240
MODULE = "pytorch_lightning.plugins.precision.tpu"

# Written next to the scenario as tcf_probe.py: the real Trainer on the torch_xla stand-in.
PROBE = textwrap.dedent(
    '''
    """Probe: a real Lightning 1.8.6 Trainer on the torch_xla stand-in."""
    import json
    import os
    import sys

    sys.path.append(os.environ["TCF_TESTS"])  # after Lightning's own path entries
    from support import xla_standin as xm  # noqa: E402

    MODULE = "pytorch_lightning.plugins.precision.tpu"


    def lightning():
        import importlib

        import pytorch_lightning as pl

        xm.install()
        module = importlib.import_module(MODULE)
        module.xm = xm
        module._XLA_AVAILABLE = True
        return pl, module


    def depth(obj):
        n = 0
        while type(obj).__name__ == "FunctionWrapper":
            n += 1
            obj = obj.__wrapped__
        return n


    def site_depth():
        return depth(vars(sys.modules[MODULE].TPUPrecisionPlugin).get("optimizer_step"))


    def train(steps=2, subclass=False):
        """Trainer.fit for ``steps`` optimizer steps (no fit for 0; a Trainer subclass if asked);
        returns (trainer, model, stand-in events)."""
        import torch

        pl, module = lightning()

        class Model(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(2, 1)

            def training_step(self, batch, batch_idx):
                xm.record("forward")
                return self.layer(batch).pow(2).mean()

            def on_after_backward(self):
                xm.record("backward")

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        class UserTrainer(pl.Trainer):
            pass

        model = Model()
        trainer_class = UserTrainer if subclass else pl.Trainer
        trainer = trainer_class(max_steps=max(steps, 1), accelerator="cpu", devices=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                num_sanity_val_steps=0, plugins=[module.TPUPrecisionPlugin()])
        xm.clear()
        if steps:
            trainer.fit(model, train_dataloaders=torch.utils.data.DataLoader(torch.randn(2 * steps, 2), batch_size=2))
        return trainer, model, xm.names()


    def step_once(trainer, model, closure=None, **kwargs):
        """One optimizer_step through the fitted trainer's plugin; returns the stand-in events."""
        import torch

        def default_closure():
            xm.record("closure")
            return torch.tensor(1.0)

        xm.clear()
        trainer.strategy.precision_plugin.optimizer_step(trainer.optimizers[0], model, 0,
                                                         closure or default_closure, **kwargs)
        return xm.names()


    def site_status():
        import tpu_closure_fix

        return [r for r in tpu_closure_fix.status() if r["module"] in (MODULE, MODULE + "_bf16")]


    def emit(**out):
        print("PROBE " + json.dumps(out, default=str))
        sys.stdout.flush()
    '''
)

FIXED = ["forward", "backward", "reduce_gradients", "mark_step"]   # one step, reduction after backward
BUGGY = ["reduce_gradients", "forward", "backward"]                # one step, reduction first (the bug)
PLAIN = ["forward", "backward"]                                    # plain PrecisionPlugin step: no xm at all

STANDARD = textwrap.dedent(
    """
    import tcf_probe as p
    trainer, model, events = p.train(2)
    p.emit(global_step=trainer.global_step, events=events, depth=p.site_depth(), status=p.site_status())
    """
)


def base_purelib():
    return sysconfig.get_paths()["purelib"]


def target_dir():
    (path,) = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
               if p and os.path.abspath(p) != REPO and "targets" in p]
    return path


def warnings_of(stderr):
    """Lines of tpu-closure-fix warnings as the user sees them (warnings module's default format)."""
    return [line for line in stderr.splitlines() if re.search(r"\w+Warning: .*tpu-closure-fix", line)]


def scenario(tmp_path, code=STANDARD, pythonpath=None, env=None, python=None, args=(), prefix=()):
    """Run ``code`` with the probe in a fresh interpreter; return (probe output, stderr, warnings)."""
    (tmp_path / "tcf_probe.py").write_text(PROBE)
    (tmp_path / "scenario.py").write_text(code)
    environ = {k: v for k, v in os.environ.items() if k not in ("TPU_CLOSURE_FIX", "PYTHONWARNINGS")}
    environ["TCF_TESTS"] = TESTS
    environ["PYTHONPATH"] = os.pathsep.join([str(tmp_path)] + list(pythonpath or [REPO, target_dir()]))
    environ.update(env or {})
    cmd = list(prefix) + [python or sys.executable] + list(args) + [str(tmp_path / "scenario.py")]
    run = run_child(cmd, TIMEOUT, env=environ, cwd=str(tmp_path), marker="PROBE ")
    assert run.ok, "scenario %s:\n%s%s" % (run.error, run.stdout[-2000:], run.stderr_tail())
    return run.payload, run.stderr, warnings_of(run.stderr)


def by_method(status):
    return {r["method"]: r for r in status}


def overlay(tmp_path, edit):
    """A copy of the installed pytorch_lightning with ``edit(text)`` applied to the call-site module."""
    root = tmp_path / "overlay"
    shutil.copytree(os.path.join(target_dir(), "pytorch_lightning"), str(root / "pytorch_lightning"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    path = root / "pytorch_lightning" / "plugins" / "precision" / "tpu.py"
    original = path.read_text()
    edited = edit(original)
    assert edited != original
    path.write_text(edited)
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
    assert out["global_step"] == 2 and out["depth"] == 0
    assert out["events"] == BUGGY * 2  # Lightning's own (buggy) code runs, untouched
    site = by_method(out["status"])["TPUPrecisionPlugin.optimizer_step"]
    assert site["verdict"] == "skipped" and "unexpected code shape" in site["reason"], site
    assert "parameters" in site["reason"], site
    assert len(warned) == 1 and "unexpected code shape" in warned[0], stderr[-3000:]


# --------------------------------------------------------------------------- faults in the shim
HOOK_RAISES = textwrap.dedent(
    """
    import tpu_closure_fix.fixes as fixes   # activates the shim (hooks registered, Lightning not imported)

    def broken_prepare(self, site, original, switch):
        raise RuntimeError("injected fault in prepare()")

    fixes.TrainerClosureFix.prepare = broken_prepare
    """
) + STANDARD


def test_shim_hook_raises(tmp_path):
    out, stderr, warned = scenario(tmp_path, HOOK_RAISES)
    assert out["global_step"] == 2 and out["depth"] == 0 and out["events"] == BUGGY * 2
    site = by_method(out["status"])["TPUPrecisionPlugin.optimizer_step"]
    assert site["verdict"] == "failed" and "RuntimeError: injected fault" in site["reason"], site
    assert len(warned) == 1 and "injected fault" in warned[0], stderr[-3000:]


WRAPT_MISSING = "import sys\nsys.modules['wrapt'] = None  # what Python does for a module that is not installed\n" \
    + STANDARD


def test_wrapt_missing(tmp_path):
    # Auto-enable through the .pth of the base venv: the shim activates on the Lightning import.
    out, stderr, warned = scenario(tmp_path, WRAPT_MISSING)
    assert out["global_step"] == 2 and out["depth"] == 0 and out["events"] == BUGGY * 2
    site = by_method(out["status"])["TPUPrecisionPlugin.optimizer_step"]
    assert site["verdict"] == "disabled" and "wrapt is not importable" in site["reason"], site
    assert len(warned) == 1 and "wrapt" in warned[0], stderr[-3000:]


RELOAD = STANDARD.replace("p.emit(", "first = dict(") + textwrap.dedent(
    """
    import importlib, sys
    old_class, old_trainer, old_model = sys.modules[p.MODULE].TPUPrecisionPlugin, trainer, model
    importlib.reload(sys.modules[p.MODULE])
    assert sys.modules[p.MODULE].TPUPrecisionPlugin is not old_class
    after_reload = {"depth": p.site_depth(), "status": p.site_status()}
    trainer, model, events = p.train(2)          # a new Trainer, built from the reloaded class
    import wrapt
    p.emit(wrapt=wrapt.__version__, result=dict(first=first, after_reload=after_reload, events=events, global_step=trainer.global_step,
                       old_class_step=p.step_once(old_trainer, old_model)))
    """
)


@pytest.mark.parametrize("wrapt_version", ["installed", "1.14.1"])
def test_reload_of_the_call_site_module(tmp_path, wrapt_version):
    """Also the oldest supported wrapt (matrix target pytorch-lightning==1.8.6+wrapt-1.14.1): patched, no warning."""
    wrapt_dir = []
    if wrapt_version == "1.14.1":
        # the matrix target with the oldest supported wrapt: installed here if the run has not yet
        import importlib.util

        spec = importlib.util.spec_from_file_location("_targets", os.path.join(REPO, "scripts", "targets.py"))
        targets = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(targets)
        wrapt_dir = [str(targets.install("pytorch-lightning==1.8.6+wrapt==1.14.1"))]
    out, stderr, warned = scenario(tmp_path, RELOAD, pythonpath=[REPO] + wrapt_dir + [target_dir()])
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
    code = STANDARD.replace("p.emit(", "import pytorch_lightning as _pl; p.emit(origin=_pl.__file__, ")
    (tmp_path / "run").mkdir()
    out, stderr, warned = scenario(tmp_path / "run", code, pythonpath=[str(archive), REPO, target_dir()])
    assert out["origin"].startswith(str(archive)), out["origin"]
    assert out["events"] == FIXED * 2 and out["depth"] == 1
    assert by_method(out["status"])["TPUPrecisionPlugin.optimizer_step"]["verdict"] == "patched"
    assert warned == [], stderr[-3000:]


# --------------------------------------------------------------------------- start-up conditions
NO_SITE = textwrap.dedent(
    """
    import sys
    assert sys.flags.no_site
    import tcf_probe as p
    trainer, model, events = p.train(2)
    loaded = "tpu_closure_fix" in sys.modules
    import tpu_closure_fix          # e.g. to ask status(): activates now, after training started
    p.emit(global_step=trainer.global_step, events=events, loaded_before=loaded, depth=p.site_depth(),
           status=p.site_status(), next_step=p.step_once(trainer, model))
    """
)


def test_python_dash_S(tmp_path):
    # -S: no site-packages start-up files, so the .pth auto-enable does not run. Everything else is found
    # through PYTHONPATH (the base venv's site-packages included, where the .pth sits unread).
    out, stderr, warned = scenario(tmp_path, NO_SITE, pythonpath=[REPO, target_dir(), base_purelib()],
                                   args=["-S"])
    assert out["loaded_before"] is False and out["events"] == BUGGY * 2 and out["global_step"] == 2
    assert out["depth"] == 1 and out["next_step"] == ["closure", "reduce_gradients", "mark_step"]
    assert by_method(out["status"])["TPUPrecisionPlugin.optimizer_step"]["verdict"] == "patched"
    assert len(warned) == 1 and "already taken 2 optimizer step" in warned[0], stderr[-3000:]


LATE = textwrap.dedent(
    """
    import tcf_probe as p
    trainer, model, events = p.train(2)
    import tpu_closure_fix
    off = p.site_status()
    tpu_closure_fix.enable()
    p.emit(global_step=trainer.global_step, events=events, off=off, depth=p.site_depth(),
           status=p.site_status(), next_step=p.step_once(trainer, model))
    """
)


def test_enable_after_a_trainer_stepped(tmp_path):
    out, stderr, warned = scenario(tmp_path, LATE, env={"TPU_CLOSURE_FIX": "0"})
    assert out["events"] == BUGGY * 2
    off = by_method(out["off"])["TPUPrecisionPlugin.optimizer_step"]
    assert off["verdict"] == "disabled" and "TPU_CLOSURE_FIX=0" in off["reason"]
    assert out["depth"] == 1 and out["next_step"] == ["closure", "reduce_gradients", "mark_step"]
    assert by_method(out["status"])["TPUPrecisionPlugin.optimizer_step"]["verdict"] == "patched"
    assert len(warned) == 1 and "already taken 2 optimizer step" in warned[0], stderr[-3000:]


LATE_ANY_TRAINER = textwrap.dedent(
    """
    import tcf_probe as p
    trainer, model, events = p.train(STEPS, subclass=SUBCLASS)
    import tpu_closure_fix
    tpu_closure_fix.enable()
    p.emit(global_step=trainer.global_step, events=events, depth=p.site_depth(), status=p.site_status())
    """
)


@pytest.mark.parametrize("steps, subclass", [(2, True), (0, False)], ids=["trainer-subclass-stepped", "not-stepped"])
def test_enable_late_warns_only_after_steps(tmp_path, steps, subclass):
    # The late-enable check finds Trainer instances through their class (gc.get_referrers), subclasses
    # included; a Trainer that has not stepped yet is no reason to warn.
    code = LATE_ANY_TRAINER.replace("STEPS", str(steps)).replace("SUBCLASS", str(subclass))
    out, stderr, warned = scenario(tmp_path, code, env={"TPU_CLOSURE_FIX": "0"})
    assert out["global_step"] == steps and out["events"] == BUGGY * steps
    assert out["depth"] == 1
    assert by_method(out["status"])["TPUPrecisionPlugin.optimizer_step"]["verdict"] == "patched"
    if steps:
        assert len(warned) == 1 and "already taken %d optimizer step" % steps in warned[0], stderr[-3000:]
    else:
        assert warned == [], stderr[-3000:]


def test_read_only_site_packages():
    """A wheel install into a fresh venv whose site-packages is then made read-only (the .pth still works)."""
    root = tempfile.mkdtemp(prefix="tcf-readonly-")
    try:
        _read_only_scenario(pathlib.Path(root))
    finally:
        for folder, dirs, files in os.walk(root):
            os.chmod(folder, 0o755)
        shutil.rmtree(root, ignore_errors=True)


def _read_only_scenario(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True, timeout=120)
    python = str(tmp_path / "venv" / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    wheel_dir = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheel_dir), REPO], check=True,
                   timeout=300)
    (wheel,) = list(wheel_dir.glob("tpu_closure_fix-*.whl"))
    with zipfile.ZipFile(str(wheel)) as zf:  # a pure wheel: installing it is unpacking it into site-packages
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
    check = STANDARD + "import os, sysconfig; assert not os.access(sysconfig.get_paths()['purelib'], os.W_OK)\n"
    out, stderr, warned = scenario(run, check, pythonpath=[target_dir()], python=python, prefix=prefix)
    assert out["events"] == FIXED * 2 and out["depth"] == 1
    assert by_method(out["status"])["TPUPrecisionPlugin.optimizer_step"]["verdict"] == "patched"
    assert warned == [], stderr[-3000:]

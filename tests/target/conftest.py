"""Fixtures for tests that run against one installed Lightning target.

The matrix runner (scripts/matrix.py) runs ``pytest tests/target`` once per
target with the target's folder on PYTHONPATH and TPU_CLOSURE_FIX_TARGET set to
its name. Without that variable these tests are not collected (they need a
Lightning release); with it, a target that does not import is a failure.
"""
import functools
import json
import os
import re
import subprocess
import sys
import sysconfig

import pytest

# The lifecycle contract's tests are inherited from a module that is not a test module: have pytest
# rewrite its asserts too, so a failure shows the values compared.
pytest.register_assert_rewrite("lifecycle_contract")

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
REPO = os.path.dirname(TESTS)
TARGET = os.environ.get("TPU_CLOSURE_FIX_TARGET")
if TESTS not in sys.path:  # ``support`` is importable however pytest is started (repo root or tests/)
    sys.path.insert(0, TESTS)

REPLICAS = 2
TIMEOUT = 600


#: Where the target tests run, in one table. A key is a test module ("test_x.py": the module is not even
#: collected elsewhere) or one test function of it ("test_x.py::test_y", every parametrization: collected,
#: then deselected elsewhere, and counted as "deselected" in pytest's summary, never as passed or skipped).
#: A module without a row runs on every Lightning target; a function without a row, wherever its module runs.
#: What does not depend on the release beyond the import machinery runs on a few targets that can tell:
REPRESENTATIVE = ("pytorch-lightning==1.8.6", "pytorch-lightning==1.8.6+wrapt==1.14.1", "lightning-fabric==2.6.6")
START_UP = ("pytorch-lightning==1.8.6",)  # start-up files, switch parsing, locales: no release, no wrapt in it
WRAPT_HOOKS = ("pytorch-lightning==1.8.6", "pytorch-lightning==1.8.6+wrapt==1.14.1")  # wrapt's hooks, any release
#: one target per call-site family: the 1.0 module hook, the 1.1 LightningOptimizer, accelerator, Trainer
#: plugin + Lite, fixed Trainer, Fabric XLAPrecision
FAMILIES = ("pytorch-lightning==1.0.8", "pytorch-lightning==1.1.8", "pytorch-lightning==1.4.9",
            "pytorch-lightning==1.8.6", "pytorch-lightning==2.6.6", "lightning-fabric==2.6.6")
ONLY_ON = {
    # the main affected Trainer+Lite release, the oldest supported wrapt, the newest Fabric
    "test_activation.py": REPRESENTATIVE,
    "test_faults.py": ("pytorch-lightning==1.8.6",),
    "test_unhooked.py": ("pytorch-lightning==1.8.6",),
    "test_concurrency.py": ("pytorch-lightning==1.8.6",),
    "test_pickle_patched.py": ("pytorch-lightning==1.8.6", "pytorch-lightning==1.8.6+wrapt==1.14.1"),
    # SyncCheck supports Lightning >= 1.5: the oldest and newest Trainer lines and the newest Fabric.
    "test_synccheck.py": ("pytorch-lightning==1.5.10", "pytorch-lightning==1.8.6", "lightning==2.6.6",
                          "lightning-fabric==2.6.6"),
    "test_demo.py": ("pytorch-lightning==1.8.6",),
    # Lightning's own mock.patch("torch_xla.core.xla_model") style: the Trainer plugin + Lite 1.8, and Fabric.
    "test_mock_style.py": ("pytorch-lightning==1.8.6", "lightning-fabric==2.6.6"),
    # A Fabric release newer than the table: the newest Fabric, presented as 2.6.7 / 2.9.0.
    "test_code_identity.py": ("lightning-fabric==2.6.6",),
    # The newest Trainer, presented as 2.7.0: classes kept for old import paths judged as what they inherit.
    "test_next_release.py": ("pytorch-lightning==2.6.6",),
    # one target per call-site family: the 1.0 module hook, the 1.1 LightningOptimizer, accelerator, Trainer
    # plugin + Lite, fixed TPUPrecisionPlugin + vendored Fabric, fixed Trainer + Fabric XLAPrecision
    "test_check.py": ("pytorch-lightning==1.0.8", "pytorch-lightning==1.1.8",
                      "pytorch-lightning==1.4.9", "pytorch-lightning==1.5.10", "pytorch-lightning==1.8.6",
                      "pytorch-lightning==1.9.5", "pytorch-lightning==2.6.6",
                      "lightning-fabric==2.6.6"),
    "test_accelerate.py": ("accelerate==0.27.2", "accelerate==0.28.0", "accelerate==1.0.1", "accelerate==1.15.0",
                           "accelerate==1.16.0"),
    # the LBFGS lockstep rule, through each kind of fix: Fabric's precision plugin and accelerate's step
    "test_lockstep.py": ("lightning-fabric==2.6.6", "accelerate==1.15.0"),
    # optimum-neuron (Trainium): one target per row of NeuronAcceleratedOptimizer.step
    # (0.0.28: no row, the torch_xla guard's call: guarded)
    "test_optimum_neuron.py": ("optimum-neuron==0.0.28", "optimum-neuron==0.2.2", "optimum-neuron==0.3.0",
                               "optimum-neuron==0.4.5"),
    # the zero-code SyncCheck: the affected Trainer (and a plain xm.optimizer_step loop), the newest Fabric and accelerate
    "test_sync_zero_code.py": ("pytorch-lightning==1.8.6", "lightning-fabric==2.6.6", "accelerate==1.15.0"),
    # status's protection claims against the recorded order: one target per site family, constructed releases
    "test_verdicts.py": ("pytorch-lightning==1.8.6", "pytorch-lightning==2.6.6", "lightning-fabric==2.6.6",
                         "accelerate==1.15.0"),
    # single tests: the import and .pth cases of test_activation hook the release's modules and stay on
    # REPRESENTATIVE; these hook none of them (or only wrapt's machinery)
    "test_activation.py::test_wheel_ships_startup_files": START_UP,
    "test_activation.py::test_pth_idle_interpreter_pays_nothing": START_UP,
    "test_activation.py::test_pythonstartup_interactive_only": START_UP,
    "test_activation.py::test_switch_values": START_UP,
    # where Python reads .pth files from is the interpreter's rule, the same under every release and wrapt
    "test_activation.py::test_a_target_install_is_unprotected_naming_the_reason_and_the_fix": START_UP,
    "test_activation.py::test_the_twin_in_site_packages_is_protected_with_the_hook_active": START_UP,
    "test_activation.py::test_python_S_reads_every_site_unpatched_and_the_twin_without_S_patched": START_UP,
    "test_activation.py::test_python_at_an_interpreter_without_the_shim_reads_every_site_unpatched": START_UP,
    "test_activation.py::test_a_unicode_space_in_the_switch_is_a_bad_value_under_every_locale": START_UP,
    "test_activation.py::test_a_line_break_in_the_switch_is_quoted_on_one_row": START_UP,
    "test_activation.py::test_pth_plus_import_one_layer": WRAPT_HOOKS,
    "test_activation.py::test_autowrapt_entry_point": WRAPT_HOOKS,
    "test_activation.py::test_autowrapt_twins": WRAPT_HOOKS,
    "test_activation.py::test_sitecustomize_example": WRAPT_HOOKS,
    # the CLI's exit codes and output: the verdicts behind them are test_status_records' on every target
    "test_engine.py::test_cli_status_exit_codes_and_json": FAMILIES,
    "test_engine.py::test_unknown_release_is_left_untouched_and_reported": FAMILIES,
    "test_engine.py::test_cli_table_via_console_script": START_UP,
    # the text layout of check's report; its verdicts are the JSON tests' on every target of the module
    "test_check.py::test_text_output_ends_with_the_reason_and_has_no_empty_heading": ("pytorch-lightning==2.6.6",),
}

#: Targets without Lightning: only the modules that list them in ONLY_ON run there.
NOT_LIGHTNING = ("accelerate==", "optimum-neuron==")


def pytest_sessionstart(session):
    """The checkout compiled once for the children (:mod:`support.compiled`)."""
    if TARGET:
        from support.compiled import compile_checkout

        compile_checkout()


def pytest_ignore_collect(collection_path, config):
    if not TARGET:
        return True
    name = os.path.basename(str(collection_path))
    targets = ONLY_ON.get(name)
    if targets is None:
        return name.startswith("test_") and TARGET.startswith(NOT_LIGHTNING)
    return TARGET not in targets


def pytest_collection_modifyitems(config, items):
    """Deselect the test functions whose ONLY_ON row does not list this target."""
    kept, left_out = [], []
    for item in items:
        key = "%s::%s" % (os.path.basename(str(item.fspath)), getattr(item, "originalname", None) or item.name)
        targets = ONLY_ON.get(key)
        (left_out if targets is not None and TARGET not in targets else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


def defined_where(condition):
    """Decorator: define a test only where it applies to the target, so a target it does not apply to
    has no entry for it at all (never a skip counted in the results)."""
    def decorate(test):
        return test if condition else None
    return decorate


def target_dir():
    """The folder of the target under test (the PYTHONPATH entry scripts/matrix.py set)."""
    (path,) = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
               if p and os.path.abspath(p) != REPO and "targets" in p]
    return path


def base_purelib():
    """The base venv's site-packages (torch, wrapt...), for children started with ``python -S``."""
    return sysconfig.get_paths()["purelib"]


def warnings_of(stderr):
    """Lines of tpu-closure-fix warnings as the user sees them (warnings module's default format)."""
    return [line for line in stderr.splitlines() if re.search(r"\w+Warning: .*tpu-closure-fix", line)]


PROBE_MARK = "PROBE "


def run_module(module, args=(), cwd=None, pythonpath=None, env=None, python=None, python_args=(), prefix=(),
               argv=None, timeout=TIMEOUT):
    """Run ``python -m support.<module> args`` in a fresh interpreter; return (probe output, completed process).

    The child sees ``pythonpath`` (default: the repo, then the target) and, last, the ``tests`` folder, so
    ``support`` is importable without shadowing anything. TPU_CLOSURE_FIX and PYTHONWARNINGS are dropped
    (the scenario or ``env`` decides them). ``argv`` replaces the whole command line (a launcher in front
    of the interpreter). The probe output is the JSON of the last ``PROBE`` line on stdout.
    """
    environ = {k: v for k, v in os.environ.items() if k not in ("TPU_CLOSURE_FIX", "PYTHONWARNINGS")}
    environ["PYTHONPATH"] = os.pathsep.join(list(pythonpath or [REPO, target_dir()]) + [TESTS])
    environ.update(env or {})
    command = argv or [python or sys.executable] + list(python_args) + ["-m", "support." + module] + list(args)
    proc = subprocess.run(list(prefix) + list(command), env=environ, capture_output=True, text=True,
                          timeout=timeout, cwd=str(cwd or TESTS))
    assert proc.returncode == 0, "support.%s %s failed:\n%s%s" % (module, " ".join(args), proc.stdout[-2000:],
                                                                   proc.stderr[-4000:])
    lines = [line for line in proc.stdout.splitlines() if line.startswith(PROBE_MARK)]
    assert lines, "support.%s printed no result:\n%s" % (module, proc.stdout[-2000:] + proc.stderr[-4000:])
    return json.loads(lines[-1][len(PROBE_MARK):]), proc


def child_env(shim, extra=None, path_first=()):
    """The environment of a child: the shim on or off, the repo and ``tests`` on the path after
    ``path_first`` (a modified copy of a package that must shadow the target's)."""
    env = dict(os.environ)
    env["TPU_CLOSURE_FIX"] = "1" if shim else "0"
    # absolute: children run with another working directory
    paths = [str(p) for p in path_first] + [REPO, TESTS] + [
        os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(extra or {})
    return env


def run_replicas(scenarios, shim, tmp_path, world=REPLICAS, path_first=(), module="support.replica", extra_env=None):
    """Run ``world`` replica processes (``module``: support.replica, or another driver with its command
    line; hard timeout) through the one rank harness and return rank -> result JSON.

    ``path_first``: folders put before everything else on the replicas' path (see child_env)."""
    from support import ranks

    return ranks.run_replicas(module, scenarios, world, tmp_path, child_env(shim, extra_env, path_first=path_first),
                              TIMEOUT)


@pytest.fixture(scope="session")
def target():
    assert TARGET, "TPU_CLOSURE_FIX_TARGET is not set"
    return TARGET


@pytest.fixture(scope="session")
def replica_scenarios(request):
    """What the shared replica launch runs: every replica scenario of the target, then SyncCheck's where
    test_synccheck.py is collected (the same processes, settings and shim modes as its own launch would be)."""
    from support import expectations

    synccheck = any(os.path.basename(str(item.fspath)) == "test_synccheck.py" for item in request.session.items)
    return expectations.all_replica_scenarios(TARGET) + (expectations.synccheck_scenarios(TARGET) if synccheck else [])


@pytest.fixture(scope="session")
def replica_runs(tmp_path_factory, replica_scenarios):
    """{shim: {rank: result}} for every replica scenario of the target, one launch per shim mode.

    Shared by test_replicas.py, test_event_order.py and test_synccheck.py so the 2 x 2 replica processes
    (each importing Lightning) start once per target.
    """
    return {shim: run_replicas(replica_scenarios, shim, tmp_path_factory.mktemp("replicas")) for shim in (True, False)}


@pytest.fixture(scope="session")
def shim_wheel(tmp_path_factory):
    """This checkout's wheel, built once per session for every test that installs or unpacks it."""
    import glob

    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), REPO], check=True,
                   timeout=600)
    (built,) = glob.glob(str(out / "tpu_closure_fix-*.whl"))
    return built


@functools.lru_cache(maxsize=None)
def cli_status_json(shim):
    """``python -m tpu_closure_fix status --json`` with the shim on or off, run once per session: several modules
    read the same child's output (a completed process; each reader parses its stdout afresh)."""
    return subprocess.run([sys.executable, "-m", "tpu_closure_fix", "status", "--json"], env=child_env(shim),
                          capture_output=True, text=True, timeout=300, cwd=TESTS)

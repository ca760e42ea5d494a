"""The zero-code SyncCheck (tpu_closure_fix/synchook.py): parsing, arming, counting, acting, failing safely.

In-process tests use the real torch optimizers and torch's real global hook registry; the comparison
itself (a collective) is replaced only where a test needs a given verdict on one process. The
start-up path runs in fresh ``python -S`` interpreters (as tests/unit/test_startup.py), and one
2-process gloo run shows the whole path: divergent replicas warn at step 10, reduced ones do not.
"""
import gc
import importlib
import json
import os
import subprocess
import sys
import sysconfig
import warnings

import pytest

torch = pytest.importorskip("torch", reason="SyncCheck hooks torch optimizers: no torch here")
if not hasattr(importlib.import_module("torch.optim.optimizer"), "register_optimizer_step_post_hook"):
    pytest.skip("the zero-code SyncCheck needs torch >= 2.0 (its global step post-hook); torch %s here"
                % torch.__version__, allow_module_level=True)

from support import ports  # noqa: E402  (after the skip: needs torch)
from test_startup import standin  # noqa: E402,F401  (the fixture: a folder with an empty torch_xla package)
from tpu_closure_fix import config, synccheck, synchook  # noqa: E402  (after the skip: needs torch)
from tpu_closure_fix.config import TPUClosureFixWarning  # noqa: E402  (after the skip: needs torch)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(REPO, "tests")


@pytest.fixture(autouse=True)
def disarmed():
    """Every test starts and ends with the check disarmed and no warning remembered."""
    synchook.disarm()
    synchook._warned.clear()
    yield
    synchook.disarm()
    synchook._warned.clear()


def sgd(n=2):
    return torch.optim.SGD([torch.nn.Parameter(torch.ones(n))], lr=0.1)


def step(optimizer):
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = torch.ones_like(p)
    optimizer.step()


def diverged_report(step_number):
    return synccheck.SyncReport(step_number, 2, "torch.distributed", ["w"], [0.5], [0.1], 1e-6)


# --------------------------------------------------------------------------- parsing
@pytest.mark.parametrize("raw, every", [(None, 0), ("", 0), ("0", 0), (" 10 ", 10), ("1", 1), ("007", 7),
                                        ("999999999999", 999999999999)])
def test_accepted_step_counts(raw, every):
    assert synchook.parse_every(raw) == (every, None)


@pytest.mark.parametrize("raw", ["-1", "+5", "1.5", "ten", "10 steps", "\u0661\u0660", "\uff11\uff10",
                                 "9" * 13, "1e3"])
def test_refused_step_counts_name_the_accepted_values(raw):
    every, problem = synchook.parse_every(raw)
    assert every == 0
    assert problem.startswith("TPU_CLOSURE_FIX_SYNC_CHECK=") and "ASCII digits" in problem and "off" in problem
    assert len(problem) < 300


@pytest.mark.parametrize("raw, action", [(None, "warn"), ("", "warn"), ("warn", "warn"), (" RAISE ", "raise")])
def test_accepted_actions(raw, action):
    assert synchook.parse_action(raw) == (action, None)


@pytest.mark.parametrize("raw", ["stop", "warn!", "r\u0430ise", "1"])  # \u0430: a Cyrillic a
def test_refused_actions_fall_back_to_warn(raw):
    action, problem = synchook.parse_action(raw)
    assert action == "warn" and "accepted: warn (the default) or raise" in problem


def test_a_bad_value_warns_once_and_stays_off():
    environ = {"TPU_CLOSURE_FIX_SYNC_CHECK": "ten"}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert synchook.arm_from_environment(environ) == 0
        assert synchook.arm_from_environment(environ) == 0
    assert [w.category for w in seen] == [TPUClosureFixWarning]
    assert synchook.armed_every() == 0


def test_a_bad_action_warns_and_arms_with_warn():
    environ = {"TPU_CLOSURE_FIX_SYNC_CHECK": "4", "TPU_CLOSURE_FIX_SYNC_CHECK_ON_DIVERGENCE": "halt"}
    with pytest.warns(TPUClosureFixWarning, match="ON_DIVERGENCE='halt'"):
        assert synchook.arm_from_environment(environ) == 4
    assert synchook.armed_every() == 4 and synchook._armed["action"] == "warn"


def test_startup_module_names_the_same_variable():
    from test_config import load_startup

    assert load_startup().SYNC_CHECK_VAR == config.SYNC_CHECK_VAR == synchook.SYNC_CHECK_VAR


# --------------------------------------------------------------------------- arming
def test_arm_puts_one_hook_in_torchs_registry_and_disarm_takes_it_out():
    from torch.optim.optimizer import _global_optimizer_post_hooks as registry

    before = len(registry)
    synchook.arm(3)
    synchook.arm(3)
    assert synchook.armed_every() == 3 and len(registry) == before + 1
    assert "armed, every 3 optimizer steps, on divergence: warn" in synchook.status_line({})
    synchook.disarm()
    assert synchook.armed_every() == 0 and len(registry) == before
    assert synchook.status_line({}) == "zero-code sync check: off (TPU_CLOSURE_FIX_SYNC_CHECK unset or 0)"


def test_torch_without_the_global_hook_gets_one_warning():
    class OldTorchOptim(object):
        pass

    synchook._armed["every"] = 5
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        synchook._register(OldTorchOptim())
        synchook._register(OldTorchOptim())
    assert len(seen) == 1 and "needs torch >= 2.0" in str(seen[0].message)
    assert synchook._armed["handles"] is None


# --------------------------------------------------------------------------- counting
@pytest.fixture
def checks(monkeypatch):
    """Record (optimizer, step) of every check instead of comparing."""
    seen = []
    monkeypatch.setattr(synchook, "_check", lambda optimizer, n: seen.append((optimizer, n)))
    return seen


def test_every_nth_step_of_each_optimizer_is_checked(checks):
    synchook.arm(3)
    first, second = sgd(), sgd()
    for _ in range(7):
        step(first)
    for _ in range(3):
        step(second)
    assert [(o is first, n) for o, n in checks] == [(True, 3), (True, 6), (False, 3)]


def test_unset_no_step_is_counted(checks):
    optimizer = sgd()
    for _ in range(6):
        step(optimizer)
    assert checks == [] and synchook._counts == {}


def test_a_step_inside_another_optimizers_step_is_not_counted(checks):
    class Wrapper(torch.optim.Optimizer):  # like ZeroRedundancyOptimizer: steps an inner optimizer
        def __init__(self, inner):
            self.inner = inner
            super().__init__([p for g in inner.param_groups for p in g["params"]], {})

        def step(self, closure=None):
            self.inner.step(closure)

    synchook.arm(2)
    inner = sgd()
    outer = Wrapper(inner)
    for _ in range(4):
        step(outer)
    assert [(o is outer, n) for o, n in checks] == [(True, 2), (True, 4)]
    assert id(inner) not in synchook._counts


def test_a_step_that_raised_does_not_stop_the_counting(checks):
    synchook.arm(2)
    optimizer = sgd()

    def failing():
        raise ValueError("closure failed")

    with pytest.raises(ValueError):
        optimizer.step(failing)
    step(optimizer)
    step(optimizer)
    assert [n for _, n in checks] == [2]


def test_a_collected_optimizer_is_forgotten(checks):
    synchook.arm(5)
    optimizer = sgd()
    step(optimizer)
    key = id(optimizer)
    assert synchook._counts == {key: 1}
    del optimizer
    gc.collect()
    assert key not in synchook._counts


# --------------------------------------------------------------------------- acting
def test_warn_points_at_the_line_that_stepped(monkeypatch):
    monkeypatch.setattr(synccheck, "compare_replicas", lambda named, n: diverged_report(n))
    synchook.arm(2)
    optimizer = sgd()
    step(optimizer)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        step(optimizer)
    assert len(seen) == 1 and seen[0].category is TPUClosureFixWarning
    assert "at step 2" in str(seen[0].message)
    assert seen[0].filename == os.path.abspath(__file__) and "optimizer.step()" in open(__file__).readlines()[
        seen[0].lineno - 1]
    assert synchook.seen["last_report"].step == 2


def test_raise_stops_the_step(monkeypatch):
    monkeypatch.setattr(synccheck, "compare_replicas", lambda named, n: diverged_report(n))
    synchook.arm(1, "raise")
    with pytest.raises(synccheck.ReplicaDivergenceError, match="at step 1"):
        step(sgd())


def test_replicas_in_sync_no_warning(monkeypatch):
    monkeypatch.setattr(synccheck, "compare_replicas",
                        lambda named, n: synccheck.SyncReport(n, 2, "torch.distributed", ["w"], [0.0], [0.0], 1e-6))
    synchook.arm(1, "raise")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(sgd())
    assert synchook.seen["last_report"].diverged is False


def test_a_failure_in_the_check_warns_once_disarms_and_training_goes_on(monkeypatch):
    def broken(named, n):
        raise RuntimeError("collective unavailable")

    monkeypatch.setattr(synccheck, "compare_replicas", broken)
    synchook.arm(1)
    optimizer = sgd()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            step(optimizer)
    assert len(seen) == 1 and "failed (RuntimeError: collective unavailable) and is now off" in str(seen[0].message)
    assert synchook.armed_every() == 0
    assert optimizer.param_groups[0]["params"][0].tolist() == pytest.approx([0.7, 0.7])  # all 3 steps taken


def test_shards_are_left_out_of_the_comparison():
    shard = torch.nn.Parameter(torch.ones(2))
    shard._is_sharded = True
    whole = torch.nn.Parameter(torch.ones(3, 2))
    optimizer = torch.optim.SGD([shard, whole], lr=0.1)
    assert [(name, p is whole) for name, p in synchook.compared_parameters(optimizer)] == [
        ("param_groups[0][1] 3x2", True)]


# --------------------------------------------------------------------------- start-up and processes
#: What a start-up case prints; torch (slow to import) is imported only where the check's module is loaded.
REPORT = """
import json, sys
synchook = sys.modules.get("tpu_closure_fix.synchook")
if synchook is not None and synchook._armed["every"]:  # asked for: torch's live registry says whether it is in
    import torch.optim
    from torch.optim.optimizer import _global_optimizer_post_hooks as registry
armed = synchook is not None and synchook._armed["every"] > 0 and any(
    hook is synchook._after_step for hook in registry.values())
print(json.dumps({"activated": "tpu_closure_fix" in sys.modules, "loaded": synchook is not None, "armed": armed}))
"""


def startup_run(standin, **variables):
    path = [standin, os.path.join(REPO, "startup"), REPO, sysconfig.get_paths()["purelib"]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_CLOSURE_FIX") and k != "PYTHONPATH"}
    env.update(variables, PYTHONPATH=os.pathsep.join(path))
    code = "import _tpu_closure_fix_startup\nimport torch_xla\n" + REPORT
    proc = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          cwd=standin)
    assert proc.returncode == 0, proc.stderr
    ours = [line for line in proc.stderr.splitlines() if "TPUClosureFixWarning" in line]
    return json.loads(proc.stdout.strip().splitlines()[-1]), ours


def test_the_watcher_arms_it_with_the_fix_off(standin):
    assert startup_run(standin, TPU_CLOSURE_FIX="0", TPU_CLOSURE_FIX_SYNC_CHECK="5") == (
        {"activated": True, "loaded": True, "armed": True}, [])


def test_the_watcher_twin_unset_imports_nothing(standin):
    assert startup_run(standin, TPU_CLOSURE_FIX="0") == ({"activated": False, "loaded": False, "armed": False}, [])
    assert startup_run(standin) == ({"activated": True, "loaded": False, "armed": False}, [])


def test_the_watcher_with_a_bad_value_warns_once(standin):
    report, ours = startup_run(standin, TPU_CLOSURE_FIX="0", TPU_CLOSURE_FIX_SYNC_CHECK="often")
    assert report["armed"] is False and len(ours) == 1 and "accepted" in ours[0]


def test_two_replicas_without_reduction_warn_at_step_10_and_reduced_ones_do_not(tmp_path):
    """2 gloo processes of support.zero_code's plain torch loop (different data), TPU_CLOSURE_FIX=0, a check
    every 10 steps: first without the gradient all-reduce, then (a new model and optimizer) with it."""
    from tpu_closure_fix.verify.child import run_children

    port = ports.free_port()
    outs = [str(tmp_path / ("rank%d.json" % rank)) for rank in range(2)]
    scenarios = json.dumps([{"api": "torch", "steps": 12, "reduce": reduce} for reduce in (False, True)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_CLOSURE_FIX")}
    env.update(TPU_CLOSURE_FIX="0", TPU_CLOSURE_FIX_SYNC_CHECK="10", PYTHONPATH=os.pathsep.join([REPO, TESTS]))
    commands = [[sys.executable, "-m", "support.zero_code", "--rank", str(rank), "--world", "2", "--port",
                 str(port), "--scenarios", scenarios, "--out", out] for rank, out in enumerate(outs)]
    runs = run_children(commands, 120, env=env, cwd=TESTS, result_files=outs)
    assert all(run.ok for run in runs), [run.error + run.stderr_tail() for run in runs]
    for run in runs:
        diverging, reduced = run.payload["runs"]
        assert len(diverging["warnings"]) == 1 and "at step 10" in diverging["warnings"][0]["message"], diverging
        assert diverging["warnings"][0]["filename"] == os.path.join(TESTS, "support", "zero_code.py")
        assert diverging["zero_code"]["last_report"]["backend"] == "torch.distributed"
        assert reduced["warnings"] == [] and reduced["zero_code"]["checks"] == 2, reduced
        assert reduced["zero_code"]["last_report"]["max_divergence"] == 0.0


# --------------------------------------------------------------------------- command line
def test_run_sets_the_variables_for_the_command():
    from tpu_closure_fix import cli

    parser = cli.build_parser()
    args = parser.parse_args(["run", "--sync-check", "25", "--sync-check-on-divergence", "raise", "--", "python"])
    from tpu_closure_fix.launcher import sync_check_environment

    assert sync_check_environment(args) == {"TPU_CLOSURE_FIX_SYNC_CHECK": "25",
                                            "TPU_CLOSURE_FIX_SYNC_CHECK_ON_DIVERGENCE": "raise"}
    assert sync_check_environment(parser.parse_args(["run", "--", "python"])) == {}


@pytest.mark.parametrize("argv", [["--sync-check", "ten"], ["--sync-check", "-3"], ["--sync-check", ""],
                                  ["--sync-check-on-divergence", "stop"]])
def test_run_refuses_bad_values_with_the_accepted_ones(argv, capsys):
    from tpu_closure_fix import cli

    with pytest.raises(SystemExit) as info:
        cli.build_parser().parse_args(["run"] + argv + ["--", "python"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "whole number of optimizer steps" in err or "choose from 'warn', 'raise'" in err, err


def test_status_line(monkeypatch):
    from tpu_closure_fix import cli

    monkeypatch.delenv("TPU_CLOSURE_FIX_SYNC_CHECK", raising=False)
    assert cli._sync_check_line() == "zero-code sync check: off (TPU_CLOSURE_FIX_SYNC_CHECK unset)"
    monkeypatch.setenv("TPU_CLOSURE_FIX_SYNC_CHECK", "30")
    assert cli._sync_check_line().startswith("zero-code sync check: NOT armed although TPU_CLOSURE_FIX_SYNC_CHECK=30")
    synchook.arm_from_environment()
    assert cli._sync_check_line().startswith("zero-code sync check: armed, every 30 optimizer steps")

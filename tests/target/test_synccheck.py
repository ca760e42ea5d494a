"""Issue #5: SyncCheck on the simulated replicas (support.replica, real Lightning, torch_xla stand-in).

Two replica processes train with SyncCheck attached (in the launch conftest.replica_runs shares; scenario key
``"synccheck": N``: the Trainer gets a ``SyncCheck(every=N)`` callback, the Lite/Fabric loop calls
``check_sync(model, step, every=N)``). The comparison goes through the backend SyncCheck picks:
torch.distributed (a gloo group of its own), since a process group is initialised there -- even though
torch_xla (the stand-in) is imported with world size 2. The callback checks when training starts (step 0),
after step 1 and every N steps; ``check_sync``, called after each step, at step 1 and every N steps.

* Without the shim (TPU_CLOSURE_FIX=0), where the release is affected: the replicas start identical
  (step 0), then every check reports divergence and warns, naming the step, the worst parameter, the
  divergence and which rank holds which version.
* With the shim: every check runs and finds the replicas bitwise identical (outcome "identical",
  divergence exactly 0); no warning.
* One device: nothing to compare, no check runs.
"""
import os
import re
import subprocess
import sys

import pytest

from conftest import REPLICAS, REPO, TARGET, TIMEOUT, child_env, defined_where, target_dir
from support import expectations, ranks

EVERY = expectations.SYNCCHECK_EVERY
STEPS = expectations.SYNCCHECK_STEPS
SCENARIOS = expectations.synccheck_scenarios(TARGET)
AFFECTED = {"synccheck-trainer": expectations.trainer_affected(TARGET),
            "synccheck-lite": expectations.lite_affected(TARGET)}


def test_target_has_synccheck_scenarios():
    # conftest.ONLY_ON runs this module on SyncCheck's releases only (Lightning 1.5 and later), so every
    # test below has scenarios to check; an empty list would make them pass vacuously.
    assert SCENARIOS, "no SyncCheck scenario for %s" % TARGET


def run_replicas(shim, tmp_path, world=REPLICAS):
    """rank -> result of ``world`` Lightning replicas training every scenario, the shim on or off."""
    return ranks.run_replicas("support.replica", SCENARIOS, world, tmp_path, child_env(shim), TIMEOUT)


@pytest.fixture(scope="module")
def runs(replica_runs, replica_scenarios):
    """The shared replica launch (conftest.replica_runs), which runs these scenarios after the others."""
    assert [s["name"] for s in replica_scenarios[-len(SCENARIOS):]] == [s["name"] for s in SCENARIOS]
    return replica_runs


def _sync(runs, shim, rank, name):
    return runs[shim][rank]["scenarios"][name]["synccheck"]


def _checked_steps(scenario):
    """The callback: at the start (0), after step 1, every N; check_sync after each step: 1, every N."""
    start = [0] if scenario["api"] == "trainer" else []
    return start + [1] + list(range(EVERY, STEPS + 1, EVERY))


def test_checks_run_at_the_first_step_and_every_n_steps_on_every_replica(runs):
    for shim in (True, False):
        for rank in (0, 1):
            for s in SCENARIOS:
                reports = _sync(runs, shim, rank, s["name"])["reports"]
                assert [r["step"] for r in reports] == _checked_steps(s), (shim, s["name"])
                assert all(r["world_size"] == 2 and r["backend"] == "torch.distributed" for r in reports)
                assert reports[0]["first_check"] and not any(r["first_check"] for r in reports[1:])


def test_fires_without_the_shim(runs):
    for s in SCENARIOS:
        if not AFFECTED[s["name"]]:
            continue
        for rank in (0, 1):
            result = _sync(runs, False, rank, s["name"])
            trained = [r for r in result["reports"] if r["step"] > 0]
            assert all(r["outcome"] == "identical" for r in result["reports"] if r["step"] == 0), result
            assert all(r["diverged"] and r["outcome"] == "differ" for r in trained), result
            assert all(r["max_divergence"] > r["tolerance"] for r in trained)
            assert all(r["versions"] == [[0], [1]] for r in trained)
            # on_divergence is a callable here: called on every rank (only "warn" is rank 0's alone)
            assert len(result["warnings"]) == len(trained)
            first = result["warnings"][0]
            worst = trained[0]["worst_parameter"]
            assert "step 1" in first and repr(worst) in first and "divergence" in first, first
            assert "rank 0 holds one version; rank 1 holds another" in first, first
            assert "tpu-closure-fix" in first and "missing or misplaced gradient reduction?" in first
        # MAX all-reduce: every replica reaches the same verdict, so a "raise" stops them all together.
        assert (_sync(runs, False, 0, s["name"])["reports"] == _sync(runs, False, 1, s["name"])["reports"])


def test_silent_with_the_shim(runs):
    for s in SCENARIOS:
        for rank in (0, 1):
            result = _sync(runs, True, rank, s["name"])
            assert result["reports"] and not result["warnings"], result
            assert all(r["outcome"] == "identical" and not r["diverged"] and r["max_divergence"] == 0.0
                       for r in result["reports"])


def test_does_nothing_on_a_single_device(tmp_path):
    results = run_replicas(False, tmp_path, world=1)
    for s in SCENARIOS:
        assert _sync({False: results}, False, 0, s["name"]) == {"reports": [], "warnings": []}


# --------------------------------------------------------------------------- in-process
def test_report_message_warn_and_raise():
    from support.said import fresh, spoken
    from tpu_closure_fix import synccheck
    from tpu_closure_fix.synccheck.report import act

    fresh()
    report = synccheck.SyncReport(300, 8, "xla", ["a.weight", "b.bias"], [0.5, 0.0], [1e-2, 0.0], 1e-6,
                                  outcome="differ", differing=[0], versions=[[0, 1, 2, 3, 4, 5, 6], [7]])
    assert report.diverged and report.worst_parameter == "a.weight" and report.diverged_count == 1
    with spoken() as seen:
        act(report, "warn")
    assert len(seen) == 1 and re.search(r"step 300.*ranks 0-6 hold one version; rank 7 holds another.*"
                                        r"'a\.weight'.*0\.01", seen[0].message), seen
    with spoken() as seen:  # rank 0 speaks for the job; the others log at debug level
        act(report, "warn", rank=3)
    assert seen == []
    with pytest.raises(synccheck.ReplicaDivergenceError, match="step 300") as info:
        act(report, "raise", rank=3)
    assert info.value.report is report
    ok = synccheck.SyncReport(300, 8, "xla", ["a.weight"], [0.0], [0.0], 1e-6)
    with spoken() as seen:
        act(ok, "raise")
    assert seen == [] and ok.in_sync


def test_single_process_is_a_no_op():
    import torch

    from tpu_closure_fix import synccheck

    model = torch.nn.Linear(3, 2)
    assert synccheck.check_sync(model, 100) is None
    assert synccheck.compare_replicas(model) is None
    with pytest.raises(ValueError):
        synccheck.check_sync(model, 1, every=0)
    if SCENARIOS and expectations.has_trainer(TARGET):
        with pytest.raises(ValueError):
            synccheck.SyncCheck(on_divergence="ignore")
    else:  # Lite/Fabric only: the callback says what to use instead
        with pytest.raises(ImportError, match="check_sync"):
            synccheck.SyncCheck()


@defined_where(expectations.has_trainer(TARGET))  # the callback needs a Trainer; Fabric-only: the test above
def test_callback_is_a_lightning_callback_made_lazily():
    code = (
        "import sys\n"
        "import tpu_closure_fix\n"
        "assert 'torch' not in sys.modules, 'importing the package imported torch'\n"
        "cls = tpu_closure_fix.SyncCheck\n"
        "assert 'torch' not in sys.modules, 'looking SyncCheck up imported torch'\n"
        "import importlib\n"
        "for name in ('pytorch_lightning', 'lightning.pytorch'):\n"
        "    try:\n"
        "        pl = importlib.import_module(name); break\n"
        "    except ImportError:\n"
        "        pass\n"
        "cb = cls(every=5)\n"
        "assert isinstance(cb, pl.Callback) and isinstance(cb, cls), type(cb).__mro__\n"
        "assert cb.every == 5 and type(cls()) is type(cb)\n"
        "import pickle; assert pickle.loads(pickle.dumps(cb)).every == 5\n"
        "assert tpu_closure_fix.check_sync.__module__ == 'tpu_closure_fix.synccheck.compare'\n"
        "assert type(cb).__module__ == 'tpu_closure_fix.synccheck.callback'\n"
        "print('ok')\n"
    )
    env = child_env(True)
    env.pop("TPU_CLOSURE_FIX_TARGET", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout


# --------------------------------------------------------------------------- the framework's DDP: a declared layout
FRAMEWORK_DDP = {"pytorch-lightning==1.8.6": "trainer-ddp", "lightning-fabric==2.6.6": "fabric-ddp"}.get(TARGET)
TWIN = {"trainer-ddp": "single", "fabric-ddp": "bare"}.get(FRAMEWORK_DDP)


def run_framework_ddp(tmp_path, variant=""):
    """Two pod ranks (tests/support/pod_scenarios.py) running the target's framework with its DDP strategy."""
    path = os.pathsep.join([REPO, ranks.STARTUP, ranks.TESTS, target_dir()])
    return ranks.run_ranks(FRAMEWORK_DDP, REPLICAS, tmp_path, env={"PYTHONPATH": path}, timeout=TIMEOUT,
                           args=["--variant", variant] if variant else None)


@defined_where(FRAMEWORK_DDP)
def test_under_the_frameworks_ddp_replicas_that_started_different_are_raised_on_every_rank(tmp_path):
    runs = run_framework_ddp(tmp_path)
    ranks.assert_all_ok(runs)
    for run in runs:
        assert run.result["raised"] is True and run.result["strategy"] == "DDPStrategy", run.describe()
        report = run.reports[0]
        assert report["step"] == 0 and report["outcome"] == "differ" and report["started_different"], report
        assert report["versions"] == [[0], [1]]


@defined_where(FRAMEWORK_DDP)
def test_without_ddp_the_explicit_call_declares_the_replicas_started_different_is_raised_too(tmp_path):
    """No DDP around the model (one device per process): calling the check (``check_sync`` / the ``SyncCheck``
    callback) is the user's declaration that the parameters are replicas, so a rank that starts different is raised
    as under DDP (never set aside as a pipeline stage would be by the zero-code check)."""
    runs = run_framework_ddp(tmp_path, TWIN)
    ranks.assert_all_ok(runs)
    for run in runs:
        assert run.result.get("raised") is True, run.describe()
        report = run.reports[0]
        assert (report["step"], report["outcome"], report["in_sync"]) == (0, "differ", False), report
        assert report["set_aside"] == [] and report["versions"] == [[0], [1]]

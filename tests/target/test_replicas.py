"""Issue #3: numerical equivalence on a simulated data-parallel run, release by release.

Two replica processes joined over gloo run the target's real Lightning
(``Trainer.fit`` with the TPU precision plugin; the LightningLite / Lite /
Fabric loop with ``optimizer.step(closure)``) and, on a few targets, a plain
PyTorch loop calling ``xm.optimizer_step(opt, optimizer_args={"closure": ...})``
(the torch_xla guard's site); only torch_xla is the stand-in
(tests/support/xla_standin.py). One session-scoped run per shim mode covers
every scenario that applies to the target, to keep the process count low.

Which scenarios apply to which target is data: ``expectations.scenarios`` /
``expectations.not_applicable`` (every scenario is either run or listed with
its reason), and the test asserts the replicas ran exactly that list.

With the shim: every replica's parameters are bitwise identical after every
step, and bitwise equal to ``reference`` (plain PyTorch: backward on every
replica's shard, mean all-reduce, clip, step) -- no tolerance is needed
because both sides do the same float operations in the same order.
Without the shim (TPU_CLOSURE_FIX=0): on an affected call site the replicas
diverge; manual optimization cannot show the bug (the user's backward runs
before ``opt.step()``, whose closure does nothing) so it must be right in both
modes; where the Trainer is fixed upstream (>= 1.9) the Trainer trajectories
are identical with and without the shim and its call site is never wrapped.

Where a release cannot run from the top:

* pytorch-lightning 1.2-1.4: the buggy call is ``TPUAccelerator.run_optimizer_step``,
  reached by the Trainer only with a real XLA device; the replica calls that
  installed method directly, with a closure built like those releases' training
  loop (``support.lightning_api._run_accelerator``). In these releases clipping
  runs inside Lightning's closure, i.e. before the shim's reduction (a
  documented limitation the shim cannot change), so the clipping scenario there
  is held to a reference that clips each replica's local gradients and then
  averages (``expectations.clips_before_reduce``).

Each run writes ``results/<target slug>.json`` (or into $TPU_CLOSURE_FIX_RESULTS),
aggregated by scripts/matrix.py.
"""
import json
import os
import re

import pytest

from conftest import REPO, TARGET, defined_where
from support import expectations

SCENARIOS = expectations.scenarios(TARGET)
NAMES = [s["name"] for s in SCENARIOS]
BY_NAME = {s["name"]: s for s in SCENARIOS}
RANKS = (0, 1)


def slug(name):
    return re.sub(r"[^A-Za-z0-9.+_-]+", "-", name)


def results_dir():
    return os.environ.get("TPU_CLOSURE_FIX_RESULTS") or os.path.join(REPO, "results")


# --------------------------------------------------------------------------- metrics
def max_abs_diff(a, b):
    """Largest |a - b| over every step and parameter (trajectories of equal shape)."""
    assert len(a) == len(b), "trajectories of different length: %d vs %d" % (len(a), len(b))
    worst = 0.0
    for step_a, step_b in zip(a, b):
        assert len(step_a) == len(step_b)
        for x, y in zip(step_a, step_b):
            worst = max(worst, abs(x - y))
    return worst


def trajectory(runs, shim, rank, name):
    return runs[shim][rank]["scenarios"][name]["params"]


def reference(runs, name):
    return runs[True][0]["scenarios"][name]["reference"]


def divergence(runs, shim, name):
    """Max parameter difference between replicas, over all steps."""
    base = trajectory(runs, shim, 0, name)
    return max(max_abs_diff(base, trajectory(runs, shim, r, name)) for r in RANKS[1:])


def event_names(runs, shim, name, rank=0):
    return [ev for ev, _ in runs[shim][rank]["scenarios"][name]["events"]]


def summarize(runs):
    scenarios = {}
    for name in NAMES:
        steps = len(trajectory(runs, True, 0, name))
        scenarios[name] = {
            "steps": steps,
            "bug_can_occur": expectations.bug_can_occur(TARGET, name),
            "divergence_with_shim": divergence(runs, True, name),
            "divergence_without_shim": divergence(runs, False, name),
            "reference_diff_with_shim": max_abs_diff(trajectory(runs, True, 0, name), reference(runs, name)),
            "reference_diff_without_shim": max_abs_diff(trajectory(runs, False, 0, name), reference(runs, name)),
            "reductions_with_shim": event_names(runs, True, name).count("reduce_gradients"),
        }
    return {
        "target": TARGET,
        "lightning": runs[True][0]["lightning"],
        "scenarios_run": NAMES,
        "not_applicable": expectations.not_applicable(TARGET),
        "accelerator_path": expectations.accelerator_path(TARGET),
        "replicas": len(RANKS),
        "steps_compared": sum(s["steps"] for s in scenarios.values()),
        "max_divergence_with_shim": max([s["divergence_with_shim"] for s in scenarios.values()] or [0.0]),
        "max_divergence_without_shim": max([s["divergence_without_shim"] for s in scenarios.values()] or [0.0]),
        "max_reference_diff_with_shim": max([s["reference_diff_with_shim"] for s in scenarios.values()] or [0.0]),
        "scenarios": scenarios,
        "sites": {"with_shim": runs[True][0]["sites"], "without_shim": runs[False][0]["sites"]},
    }


@pytest.fixture(scope="session")
def runs(replica_runs):
    out = replica_runs  # the shared launch (conftest.replica_runs): these scenarios, then the event-order ones
    summary = summarize(out)
    os.makedirs(results_dir(), exist_ok=True)
    with open(os.path.join(results_dir(), slug(TARGET) + ".json"), "w") as handle:
        json.dump(summary, handle, indent=1, sort_keys=True)
    return out


# --------------------------------------------------------------------------- the scenario list
def test_every_scenario_is_run_or_explained():
    assert NAMES, "no scenario applies to %s" % TARGET
    assert set(NAMES) | set(expectations.not_applicable(TARGET)) == set(expectations.SCENARIOS)
    assert not set(NAMES) & set(expectations.not_applicable(TARGET))


def test_replicas_ran_exactly_the_applicable_scenarios(runs, replica_scenarios):
    launched = [s["name"] for s in replica_scenarios]  # these, the event-order ones, then SyncCheck's if it runs
    assert launched[:len(expectations.all_replica_scenarios(TARGET))] == [
        s["name"] for s in expectations.all_replica_scenarios(TARGET)]
    for shim in (True, False):
        for rank in RANKS:
            result = runs[shim][rank]
            assert result["shim"] is shim
            assert list(result["scenarios"]) == launched
            assert list(result["scenarios"])[:len(NAMES)] == NAMES


# --------------------------------------------------------------------------- with the shim
@pytest.mark.parametrize("name", NAMES)
def test_with_shim_replicas_bitwise_identical_after_every_step(runs, name):
    base = trajectory(runs, True, 0, name)
    assert len(base) == BY_NAME[name]["steps"]
    for rank in RANKS[1:]:
        other = trajectory(runs, True, rank, name)
        assert len(other) == len(base)
        for step, (a, b) in enumerate(zip(base, other)):
            assert a == b, "replica %d differs from replica 0 after step %d" % (rank, step + 1)


@pytest.mark.parametrize("name", NAMES)
def test_with_shim_bitwise_equal_to_reference(runs, name):
    ref = reference(runs, name)
    got = trajectory(runs, True, 0, name)
    assert len(got) == len(ref) == BY_NAME[name]["steps"]
    for step, (a, b) in enumerate(zip(got, ref)):
        assert a == b, "step %d differs from the reference by %g" % (step + 1, max_abs_diff([a], [b]))


# --------------------------------------------------------------------------- without the shim
@pytest.mark.parametrize("name", NAMES)
def test_without_shim(runs, name):
    if expectations.bug_can_occur(TARGET, name):
        # The twin that proves the check can fail: the bug makes replicas drift apart.
        assert divergence(runs, False, name) > 0
        assert trajectory(runs, False, 0, name) != reference(runs, name)
    else:
        # Manual optimization (any release) and Trainers fixed upstream: right without the shim,
        # and the shim changes nothing.
        assert divergence(runs, False, name) == 0
        assert trajectory(runs, False, 0, name) == reference(runs, name)
        for rank in RANKS:
            assert trajectory(runs, False, rank, name) == trajectory(runs, True, rank, name)


def test_manual_optimization_cannot_show_the_bug():
    if "trainer-manual" in NAMES:
        assert not expectations.bug_can_occur(TARGET, "trainer-manual")


# --------------------------------------------------------------------------- call sites
def test_call_sites_wrapped_only_where_affected(runs):
    """A fixed-upstream site is never wrapped; a patched site is wrapped only with the shim on."""
    with_shim = runs[True][0]["sites"]
    without = runs[False][0]["sites"]
    assert with_shim, "no call-site module was loaded"
    for key, state in with_shim.items():
        if state["verdict"] == "fixed upstream":
            assert not state["wrapped"], key
        assert not without[key]["wrapped"], key
    for key, state in without.items():
        assert state["verdict"] not in ("patched",), key
    patched = [key for key, state in with_shim.items() if state["wrapped"]]
    fixed = [key for key, state in with_shim.items() if state["verdict"] == "fixed upstream"]
    if expectations.has_trainer(TARGET):
        if expectations.trainer_affected(TARGET):
            # 1.0: the module's default hook; 1.1: LightningOptimizer; 1.2-1.4: the accelerator; 1.5+: the plugin
            assert any(part in key for part in (".core.lightning:", ".core.optimizer:", ".accelerators.tpu:",
                                                ".plugins.precision.tpu:") for key in patched), patched
        else:
            assert fixed, "the Trainer is fixed upstream in %s: its site must be verified, not wrapped" % TARGET
            assert not any(".pytorch.plugins." in key or key.startswith("pytorch_lightning.plugins")
                           for key in patched), patched
    if expectations.has_lite(TARGET) and any(BY_NAME[n]["api"] == "lite" for n in NAMES):
        assert any(key.split(":")[1] in ("TPUPrecision.optimizer_step", "XLAPrecision.optimizer_step",
                                         "TPUPrecisionPlugin.optimizer_step") for key in patched), patched


# --------------------------------------------------------------------------- scenario specifics
def for_scenario(name):
    """Define a scenario-specific test only where the scenario applies to the target (no skip entries);
    where it does not, expectations.not_applicable(TARGET) says why (checked above)."""
    return defined_where(name in NAMES)


@for_scenario("trainer-accumulate")
def test_accumulation_reduces_exactly_once_per_stepping_batch(runs):
    scenario = BY_NAME["trainer-accumulate"]
    evs = event_names(runs, True, "trainer-accumulate")
    assert evs.count("reduce_gradients") == scenario["steps"]
    assert evs.count("backward") == scenario["steps"] * scenario["accumulate"]
    # every reduction follows the last backward of its accumulation window
    backwards = 0
    for ev in evs:
        if ev == "backward":
            backwards += 1
        elif ev == "reduce_gradients":
            assert backwards == scenario["accumulate"], evs
            backwards = 0


@for_scenario("trainer-adam-clip")
def test_clipping_acts_on_reduced_gradients(runs):
    """With the shim, clipping by norm sees the averaged gradients (PL >= 1.5)."""
    from support import replica

    scenario = BY_NAME["trainer-adam-clip"]
    got = trajectory(runs, True, 0, "trainer-adam-clip")
    on_reduced = replica.reference(dict(scenario, clip_local=False), len(RANKS))
    on_local = replica.reference(dict(scenario, clip_local=True), len(RANKS))
    assert on_reduced != on_local, "the clip threshold must make the order observable"
    if expectations.clips_before_reduce(TARGET):
        # PL 1.2-1.4: Lightning clips inside its closure, before any reduction (documented limitation).
        assert got == on_local
    else:
        assert got == on_reduced


def assert_reduced_after_every_evaluation(runs, name):
    """With the shim, every closure evaluation (one backward each, more evaluations than steps: LBFGS) is
    followed at once by its gradient reduction."""
    evs = event_names(runs, True, name)
    assert evs.count("backward") > BY_NAME[name]["steps"]
    assert evs.count("reduce_gradients") == evs.count("backward")
    for i, ev in enumerate(evs):
        if ev == "backward":
            assert evs[i + 1] == "reduce_gradients"


@for_scenario("lite-lbfgs")
def test_lbfgs_reduces_after_every_closure_evaluation(runs):
    assert_reduced_after_every_evaluation(runs, "lite-lbfgs")


GUARD_SITE = "torch_xla.core.xla_model:optimizer_step"


@for_scenario("xla-sgd")
def test_plain_loop_goes_through_the_torch_xla_guard(runs):
    """xm.optimizer_step itself is the patched site; the twin runs torch_xla's own order."""
    with_shim, without = runs[True][0]["sites"][GUARD_SITE], runs[False][0]["sites"][GUARD_SITE]
    assert (with_shim["wrapped"], with_shim["verdict"]) == (True, "patched"), with_shim
    assert (without["wrapped"], without["verdict"]) == (False, "disabled"), without
    steps = BY_NAME["xla-sgd"]["steps"]
    assert event_names(runs, True, "xla-sgd") == ["zero_grad", "forward", "backward", "reduce_gradients",
                                                  "step"] * steps
    assert event_names(runs, False, "xla-sgd") == ["reduce_gradients", "zero_grad", "forward", "backward",
                                                   "step"] * steps


@for_scenario("xla-lbfgs")
def test_plain_loop_lbfgs_reduces_after_every_closure_evaluation(runs):
    assert_reduced_after_every_evaluation(runs, "xla-lbfgs")


def test_summary_written(runs):
    path = os.path.join(results_dir(), slug(TARGET) + ".json")
    with open(path) as handle:
        summary = json.load(handle)
    assert summary["target"] == TARGET and summary["scenarios_run"] == NAMES

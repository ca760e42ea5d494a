"""accelerate's ``AcceleratedOptimizer.step(closure)`` on 2 replicas: right with the shim, the bug without.

Real released accelerate (the target), torch 2.13 CPU; only torch_xla is stood
in (support.accelerate_xla over support.xla_standin). accelerate takes its XLA
branch the honest way: the stand-in is importable *before* accelerate is
imported, so accelerate's own ``is_torch_xla_available()`` / ``is_tpu_available()``
finds torch_xla and ``AcceleratorState`` picks ``DistributedType.TPU``
(<= 0.27) or ``DistributedType.XLA`` (>= 0.28) -- asserted below, from the
``Accelerator`` the scenario trained with. Nothing of accelerate is patched
or configured by hand; the stand-in's ``torch_xla.runtime.device_type()`` says
``"CPU"``, as PJRT_DEVICE=CPU does, so no TPU-only branch runs.

Each scenario runs on 2 gloo replicas with different data shards, once with
the shim (TPU_CLOSURE_FIX=1) and once without (TPU_CLOSURE_FIX=0, the twin).
With the shim the parameters after every step are bitwise equal to the
plain-PyTorch reference (support.accelerate_replica.reference: each replica's
gradients, mean all-reduced where the fixed release reduces them); without
it, closure scenarios diverge. The no-closure path (``accelerator.backward``
then ``step()``) was right already and must be identical in both runs.
"""
import json
import subprocess
import sys

import pytest
from packaging.version import Version

from conftest import REPO, TARGET, child_env, defined_where
from support import replica_tests

RELEASE = Version(TARGET.split("==", 1)[1])
#: accelerate <= 0.27 refuses gradient accumulation on TPU ("Gradient accumulation is not
#: supported on TPU"): the accumulation scenario exists from 0.28 on.
ACCUMULATION = RELEASE >= Version("0.28.0")
#: The row each target's release must be patched by.
EXPECTED_VARIANT = ("accelerate-0.11" if RELEASE < Version("0.28.0") else
                    "accelerate-0.28" if RELEASE < Version("1.7.0") else "accelerate-1.7")

CLOSURE_SCENARIOS = [
    {"name": "sgd", "optimizer": "sgd", "steps": 3},
    {"name": "adam", "optimizer": "adam", "steps": 3},
    {"name": "lbfgs", "optimizer": "lbfgs", "steps": 2},
    {"name": "clip", "optimizer": "sgd", "steps": 3, "clip": 0.05},
] + ([{"name": "accumulate", "optimizer": "sgd", "steps": 2, "accumulate": 2}] if ACCUMULATION else [])
NO_CLOSURE = {"name": "no-closure", "optimizer": "sgd", "steps": 3, "closure": False}
NAMES = [s["name"] for s in CLOSURE_SCENARIOS]
#: SGD with a closure and tpu_closure_fix.check_sync(model, step, every=1) after each step.
SYNCCHECK = {"name": "synccheck", "optimizer": "sgd", "steps": 3, "synccheck": 1}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{shim: {rank: result}}: one launch of 2 replicas per shim mode, every scenario in it; the
    summary scripts/matrix.py aggregates is written from it."""
    out = replica_tests.run_both("support.accelerate_replica", CLOSURE_SCENARIOS + [NO_CLOSURE, SYNCCHECK],
                                 tmp_path_factory, child_env)
    replica_tests.write_summary(REPO, summarize(out))
    return out


def summarize(runs):
    """The matrix summary (the keys test_replicas writes for Lightning targets)."""
    not_applicable = {} if ACCUMULATION else {
        "accelerate-accumulate": "accelerate < 0.28 raises 'Gradient accumulation is not supported on TPU'"}
    return replica_tests.summarize(runs, TARGET, "accelerate %s" % runs[True][0]["accelerate"], "accelerate-",
                                   CLOSURE_SCENARIOS + [NO_CLOSURE, SYNCCHECK], not_applicable)


def test_summary_written(runs):
    replica_tests.assert_summary_written(REPO, TARGET)


def test_accelerate_takes_its_xla_branch(runs):
    expected = "DistributedType.TPU" if RELEASE < Version("0.28.0") else "DistributedType.XLA"
    for shim in (True, False):
        assert runs[shim][0]["accelerate"] == str(RELEASE)
        for rank in (0, 1):
            for name, entry in runs[shim][rank]["scenarios"].items():
                assert entry["distributed_type"] == expected, (shim, rank, name)


def test_site_patched_with_shim_and_original_without(runs):
    assert runs[True][0]["shim"] is True and runs[False][0]["shim"] is False
    assert runs[True][0]["site"] == {"wrapped": True, "verdict": "patched"}
    assert runs[False][0]["site"] == {"wrapped": False, "verdict": "disabled"}


test_with_shim_equals_reference_bitwise, test_without_shim_replicas_diverge = \
    replica_tests.trajectory_tests(CLOSURE_SCENARIOS)


def _reductions_after_each_evaluation(events):
    """For every closure evaluation, the number of gradient reductions before the next evaluation or step."""
    counts = []
    for name, info in events:
        if name == "closure":
            counts.append(0)
        elif name in ("step", "micro_step"):
            counts.append(None)  # separates evaluations of different steps
        elif counts and counts[-1] is not None and (
                name == "reduce_gradients" or (name == "all_reduce" and "tensors" in info)):
            counts[-1] += 1
    return [c for c in counts if c is not None]


@pytest.mark.parametrize("name", NAMES)
def test_each_closure_evaluation_is_reduced_exactly_once(runs, name):
    """With the shim, one gradient reduction per evaluation (clip inside the closure: its own, not a
    second one); without it, none."""
    replica_tests.assert_each_evaluation_reduced_once(
        lambda shim, rank: _reductions_after_each_evaluation(runs[shim][rank]["scenarios"][name]["events"]))


def test_lbfgs_replicas_evaluate_the_closure_equally_often(runs):
    """The lockstep rule: each evaluation also reduces the loss (one scalar all_reduce), so both
    replicas' LBFGS take the same branches."""
    counts = []
    for rank in (0, 1):
        events = runs[True][rank]["scenarios"]["lbfgs"]["events"]
        evaluations = sum(1 for name, _ in events if name == "closure")
        scalars = sum(1 for name, info in events if name == "all_reduce" and info.get("numel") == 1)
        assert evaluations == scalars > 0
        counts.append(evaluations)
    assert counts[0] == counts[1]


def test_no_closure_path_is_untouched(runs):
    """``accelerator.backward`` then ``step()``: the release was right; with or without the shim the
    same events and the same bitwise parameters, equal to the reference."""
    replica_tests.assert_untouched(runs, NO_CLOSURE["name"])


def test_check_sync_in_an_accelerate_loop_finds_replicas_in_sync_with_the_shim(runs):
    for rank in (0, 1):
        checks = runs[True][rank]["scenarios"]["synccheck"]["synccheck"]
        assert [c["report"]["step"] for c in checks] == [1, 2, 3]
        # a process group is initialised (the stand-in's collectives run on it): torch.distributed, even with torch_xla
        assert all(c["report"]["world_size"] == 2 and c["report"]["backend"] == "torch.distributed" for c in checks)
        assert not any(c["report"]["diverged"] or c["warnings"] for c in checks)


def test_check_sync_in_an_accelerate_loop_reports_divergence_without_the_shim(runs):
    """The twin: the first step already applied each replica's own gradients."""
    for rank in (0, 1):
        checks = runs[False][rank]["scenarios"]["synccheck"]["synccheck"]
        assert [c["report"]["step"] for c in checks] == [1, 2, 3]
        assert all(c["report"]["diverged"] and len(c["warnings"]) == 1 for c in checks)


@defined_where(ACCUMULATION)
def test_accumulation_micro_step_keeps_the_release_reduction(runs):
    """On the micro-step (``sync_gradients`` False) the release reduces the existing gradients at
    ``step()`` and does not step; the shim adds nothing there."""
    for shim in (True, False):
        events = runs[shim][0]["scenarios"]["accumulate"]["events"]
        first_step = [name for name, _ in events].index("step")
        assert events[:first_step] == [["micro_step", {}], ["all_reduce", {"tensors": 4}]], events[:first_step]


def _status(shim, *extra):
    env = child_env(shim)
    env.pop("TPU_CLOSURE_FIX_RESULTS", None)
    proc = subprocess.run([sys.executable, "-W", "ignore", "-m", "tpu_closure_fix", "status"] + list(extra),
                          env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=600)
    return proc


def _accelerate_record(proc):
    records = json.loads(proc.stdout[proc.stdout.index("{"):])["sites"]
    rows = [r for r in records if r["module"] == "accelerate.optimizer"]
    assert len(rows) == 1, rows
    return rows[0]


def test_status_reports_the_row_patched():
    proc = _status(True, "--json")
    record = _accelerate_record(proc)
    assert (record["verdict"], record["variant"], record["release"]) == ("patched", EXPECTED_VARIANT, str(RELEASE))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = _status(True)
    assert table.returncode == 0
    assert "accelerate.optimizer" in table.stdout and "patched" in table.stdout


def test_status_without_shim_reports_disabled_and_fails():
    """The twin: TPU_CLOSURE_FIX=0 leaves accelerate's buggy step in place; status says so, exit 1."""
    proc = _status(False, "--json")
    record = _accelerate_record(proc)
    assert record["verdict"] == "disabled"
    assert proc.returncode == 1
    table = _status(False)
    assert table.returncode == 1
    assert "UNPROTECTED" in table.stdout


# --------------------------------------------------------------------------- self-test driver
_DRIVER_PRELUDE = r"""
import json, sys, types, warnings
warnings.simplefilter("ignore")
import torch
import accelerate.optimizer  # before the stand-in: accelerate sees no torch_xla, as on a CPU machine
import tpu_closure_fix
from tpu_closure_fix import _simulated_xla as sim, engine
from tpu_closure_fix.integrations.accelerate import verify
events = []
def record(name, **info):
    events.append("reduce_gradients(no grads)" if name == "reduce_gradients" and not info.get("grads") else name)
sim.configure(1, 0)
sim.recorder = record
xm = sim.install()
module = accelerate.optimizer
"""


def _driver_events(shim):
    code = replica_tests.event_step_child(_DRIVER_PRELUDE, ("accelerate.optimizer", "AcceleratedOptimizer.step"))
    return replica_tests.run_child_json(code, child_env(shim), REPO)


def test_self_test_driver_sees_the_fixed_order_with_the_shim():
    """integrations/accelerate/verify.event_step drives the row's step: closure, then the reduction."""
    result = _driver_events(True)
    assert result["verdict"] == "patched"
    assert result["events"] == ["forward", "backward", "reduce_gradients", "step"]


def test_self_test_driver_sees_the_bug_without_the_shim():
    """The twin: the release's order -- a reduction before the gradients exist (<= 0.27), or none of
    the closure's gradients at all (>= 0.28)."""
    result = _driver_events(False)
    assert result["verdict"] == "disabled"
    if RELEASE < Version("0.28.0"):
        assert result["events"] == ["reduce_gradients(no grads)", "forward", "backward", "step"]
    else:
        assert result["events"] == ["forward", "backward", "step"]

"""optimum-neuron's ``NeuronAcceleratedOptimizer.step(closure)`` on 2 replicas: right with the shim, the bug without.

Real released optimum-neuron (the target: its ``optimum/neuron/accelerate/optimizer.py``,
with the optimum, transformers and accelerate its wheel requires), torch 2.13
CPU; only torch_xla and the Neuron SDK (neuronx-distributed) are stood in
(support.neuron_sdk, following neuronx-distributed's published
``parallel_layers`` source: ``bucket_allreduce_gradients`` divides by the
data-parallel size and sums over the data-parallel group -- here the 2 gloo
replicas). ``optimum.neuron.accelerate``'s package ``__init__`` is not run (it
imports ``NeuronAccelerator``, which needs the whole SDK); its optimizer module
is imported from the wheel.

Each scenario runs on 2 replicas with different data shards, once with the
shim (TPU_CLOSURE_FIX=1) and once without (TPU_CLOSURE_FIX=0, the twin). With
the shim the parameters after every step are bitwise equal to the plain-PyTorch
reference (support.neuron_replica.reference) and every closure evaluation is
followed by exactly one data-parallel reduction of the gradients it produced;
without it, the release reduces before the closure and the replicas diverge.

0.0.x (the 0.0.28 target) has no row: its XLA branch passes the closure to
``xm.optimizer_step``, and the torch_xla guard is what protects it (``status``:
``guarded``). The same scenarios show it: its reduction is torch_xla's
``reduce_gradients`` (over every replica: data parallelism only on that branch).
"""
import json
import subprocess
import sys

import pytest
from packaging.version import Version

from conftest import REPO, TARGET, TESTS, child_env, defined_where
from support import replica_tests

RELEASE = Version(TARGET.split("==", 1)[1])
#: 0.0.x: no row; the torch_xla guard protects its xm.optimizer_step call.
GUARDED = RELEASE < Version("0.1.0")
#: The row each target's release must be patched by.
EXPECTED_VARIANT = (None if GUARDED else "optimum-neuron-0.1" if RELEASE < Version("0.3.0") else
                    "optimum-neuron-0.3" if RELEASE < Version("0.4.0") else "optimum-neuron-0.4")
#: What status says with the shim, and without it (the twin).
EXPECTED_VERDICTS = ("guarded", "skipped") if GUARDED else ("patched", "disabled")

CLOSURE_SCENARIOS = [
    {"name": "sgd", "optimizer": "sgd", "steps": 3},
    {"name": "lbfgs", "optimizer": "lbfgs", "steps": 2},
] + ([] if GUARDED else [{"name": "clip", "optimizer": "sgd", "steps": 3, "clip": 0.05}])
#: 0.4 on: the sequence-parallel pass is decided by ``trn_config.sequence_parallel_enabled``.
SEQUENCE_PARALLEL = RELEASE >= Version("0.4.0")
if SEQUENCE_PARALLEL:
    CLOSURE_SCENARIOS.append({"name": "sequence-parallel", "optimizer": "sgd", "steps": 3, "sequence_parallel": True})
NO_CLOSURE = {"name": "no-closure", "optimizer": "sgd", "steps": 3, "closure": False}
NAMES = [s["name"] for s in CLOSURE_SCENARIOS]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{shim: {rank: result}}: one launch of 2 replicas per shim mode, every scenario in it."""
    out = replica_tests.run_both("support.neuron_replica", CLOSURE_SCENARIOS + [NO_CLOSURE], tmp_path_factory,
                                 child_env)
    replica_tests.write_summary(REPO, summarize(out))
    return out


def summarize(runs):
    """The matrix summary (the keys test_replicas writes for Lightning targets)."""
    not_applicable = {"optimum-neuron-clip": "0.0.x's XLA branch never clips (prepare_clip_grad_norm keeps "
                                             "only model-parallel parameters)"} if GUARDED else {}
    return replica_tests.summarize(runs, TARGET, "optimum-neuron %s" % runs[True][0]["optimum_neuron"],
                                   "optimum-neuron-", CLOSURE_SCENARIOS + [NO_CLOSURE], not_applicable)


def _events(runs, shim, rank, name):
    """The event names; every reduction as ``reduce(n)``, n the tensors it reduced: neuronx-distributed's
    bucket_allreduce_gradients (0.1.0 on; the all_reduce it issues is the stand-in's detail, left out),
    torch_xla's reduce_gradients and a single-tensor all_reduce (the lockstep loss, 0.0.x)."""
    out = []
    for event, info in runs[shim][rank]["scenarios"][name]["events"]:
        if event == "bucket_allreduce":
            out.append("reduce(%d)" % info["tensors"])
        elif event == "reduce_gradients":
            out.append("reduce(%d)" % info["grads"])
        elif event == "all_reduce":
            if "numel" in info:
                out.append("reduce(1)")
        elif event != "mark_step":
            out.append(event)
    return out


def test_summary_written(runs):
    replica_tests.assert_summary_written(REPO, TARGET)


def test_the_release_under_test_runs_on_accelerates_xla_state(runs):
    for shim in (True, False):
        assert runs[shim][0]["optimum_neuron"] == str(RELEASE)
        for rank in (0, 1):
            for name, entry in runs[shim][rank]["scenarios"].items():
                assert entry["distributed_type"] == "DistributedType.XLA", (shim, rank, name)


def test_site_patched_with_shim_and_original_without(runs):
    assert runs[True][0]["shim"] is True and runs[False][0]["shim"] is False
    assert runs[True][0]["site"] == {"wrapped": not GUARDED, "verdict": EXPECTED_VERDICTS[0],
                                     "variant": EXPECTED_VARIANT, "release": str(RELEASE)}
    assert runs[False][0]["site"] == {"wrapped": False, "verdict": EXPECTED_VERDICTS[1], "variant": EXPECTED_VARIANT,
                                      "release": str(RELEASE)}


test_with_shim_equals_reference_bitwise, test_without_shim_replicas_diverge = \
    replica_tests.trajectory_tests(CLOSURE_SCENARIOS)


def test_sgd_event_order_closure_then_reduction_then_step(runs):
    """With the shim: closure -> data-parallel reduction of its 4 gradients -> step, at every step.
    Without it (the twin), the release's order: the reduction runs before the closure (of no gradients
    at the first step, of the previous step's stale ones after it)."""
    for rank in (0, 1):
        assert _events(runs, True, rank, "sgd") == [
            "step", "closure", "reduce(4)", "optimizer_step"] * 3
        without = _events(runs, False, rank, "sgd")
        assert without[:4] == ["step", "reduce(0)", "closure", "optimizer_step"]
        assert without[4:] == ["step", "reduce(4)", "closure", "optimizer_step"] * 2


@defined_where(not GUARDED)
def test_clipping_follows_the_reduction_of_the_closures_gradients(runs):
    for rank in (0, 1):
        assert _events(runs, True, rank, "clip") == [
            "step", "closure", "reduce(4)", "clip_grad_norm", "optimizer_step"] * 3
        without = _events(runs, False, rank, "clip")
        assert without.index("clip_grad_norm") < without.index("closure")


@defined_where(SEQUENCE_PARALLEL)
def test_sequence_parallel_pass_follows_each_evaluation(runs):
    """The release's sequence-parallel pass (one reduce_from_tensor_model_parallel_region per marked
    gradient: the first layer's weight and bias) runs after the closure with the shim; without it, before
    the closure, on the previous step's gradients (none at the first step)."""
    sequence = ["sequence_parallel_reduce"] * 2
    for rank in (0, 1):
        assert _events(runs, True, rank, "sequence-parallel") == (
            ["step", "closure"] + sequence + ["reduce(4)", "optimizer_step"]) * 3
        assert _events(runs, False, rank, "sequence-parallel") == (
            ["step", "reduce(0)", "closure", "optimizer_step"]
            + (["step"] + sequence + ["reduce(4)", "closure", "optimizer_step"]) * 2)


def _reductions_after_each_evaluation(events):
    """For every closure evaluation, the gradient reductions (more than one tensor) before the next
    evaluation or step."""
    counts = []
    for event in events:
        if event == "closure":
            counts.append(0)
        elif event == "optimizer_step":
            counts.append(None)
        elif counts and counts[-1] is not None and event.startswith("reduce(") and event != "reduce(1)":
            counts[-1] += 1
    return [c for c in counts if c is not None]


@pytest.mark.parametrize("name", NAMES)
def test_each_closure_evaluation_is_reduced_exactly_once(runs, name):
    replica_tests.assert_each_evaluation_reduced_once(
        lambda shim, rank: _reductions_after_each_evaluation(_events(runs, shim, rank, name)))


def test_lbfgs_replicas_evaluate_the_closure_equally_often(runs):
    """The lockstep rule over the data-parallel group: each evaluation also averages the loss (one 1-tensor
    reduction: the release's bucket_allreduce_gradients; torch_xla's all_reduce on 0.0.x), so both replicas'
    LBFGS take the same branches. Without the shim no evaluation is reduced at all."""
    counts = []
    for rank in (0, 1):
        events = _events(runs, True, rank, "lbfgs")
        evaluations = events.count("closure")
        assert evaluations == events.count("reduce(1)") == events.count("reduce(4)") > 2
        counts.append(evaluations)
        without = _events(runs, False, rank, "lbfgs")
        assert "reduce(1)" not in without
    assert counts[0] == counts[1]


def test_no_closure_path_is_untouched(runs):
    """Backward, then ``step()``: the release was right; with or without the shim the same events and the
    same bitwise parameters, equal to the reference."""
    replica_tests.assert_untouched(runs, NO_CLOSURE["name"])


# --------------------------------------------------------------------------- status
def _status(shim):
    """``tpu-closure-fix status --json`` in a process that imported the optimizer module (on the stand-ins:
    support.neuron_status, what the release matrix runs for these targets)."""
    env = child_env(shim)
    env.pop("TPU_CLOSURE_FIX_RESULTS", None)
    proc = subprocess.run([sys.executable, "-m", "support.neuron_status", "--json"], env=env, cwd=TESTS, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=600)
    records = json.loads(proc.stdout[proc.stdout.index("{"):])["sites"]
    rows = [r for r in records if r["module"] == "optimum.neuron.accelerate.optimizer"]
    assert len(rows) == 1, rows
    return proc, rows[0]


def test_status_reports_the_row_patched_or_guarded():
    proc, record = _status(True)
    assert (record["verdict"], record["variant"], record["release"]) == (EXPECTED_VERDICTS[0], EXPECTED_VARIANT,
                                                                         str(RELEASE))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_status_without_shim_reports_unprotected_and_fails():
    """The twin: TPU_CLOSURE_FIX=0 leaves the release's step (and torch_xla's optimizer_step) in place;
    status says so, exit 1."""
    proc, record = _status(False)
    assert record["verdict"] == EXPECTED_VERDICTS[1]
    assert proc.returncode == 1


# --------------------------------------------------------------------------- self-test driver
_DRIVER_PRELUDE = r"""
import json, sys, types, warnings
warnings.simplefilter("ignore")
import torch
from support import neuron_sdk
xm = neuron_sdk.install(1, 0)
import tpu_closure_fix
from tpu_closure_fix import engine
from tpu_closure_fix.integrations.optimum_neuron import verify
module = neuron_sdk.load_optimizer_module()
events = []
"""


def _driver_events(shim):
    code = replica_tests.event_step_child(_DRIVER_PRELUDE, ("optimum.neuron.accelerate.optimizer",
                                                          "NeuronAcceleratedOptimizer.step"))
    return replica_tests.run_child_json(code, child_env(shim), TESTS)


@defined_where(not GUARDED)
def test_self_test_driver_sees_the_fixed_order_with_the_shim():
    """integrations/optimum_neuron/verify.event_step (what ``check`` runs) drives the row's step: closure,
    then the data-parallel reduction, then the step."""
    result = _driver_events(True)
    assert result["verdict"] == "patched"
    assert result["events"] == ["forward", "backward", "reduce_gradients", "step"]


@defined_where(not GUARDED)
def test_self_test_driver_sees_the_bug_without_the_shim():
    """The twin: the release reduces before the closure has produced any gradient."""
    result = _driver_events(False)
    assert result["verdict"] == "disabled"
    assert result["events"] == ["reduce_gradients(no grads)", "forward", "backward", "step"]


# --------------------------------------------------------------------------- ZeRO-1 branch
_ZERO_CHILD = r"""
import json, sys, types, warnings
warnings.simplefilter("ignore")
import torch
from support import neuron_sdk, neuron_replica
neuron_sdk.install(1, 0)
import tpu_closure_fix
module = neuron_sdk.load_optimizer_module()
from accelerate import Accelerator
Accelerator()
# the ZeRO-1 class the release tests (NeuronZero1Optimizer from 0.4, torch_xla's ZeroRedundancyOptimizer before)
zero_class = getattr(module, "NeuronZero1Optimizer", None) or getattr(module, "ZeroRedundancyOptimizer")
seen = []
class RecordingZero1(zero_class):
    # stands for the ZeRO-1 optimizer: records what its step receives; runs the closure once, as ZeRO-1 does
    def __init__(self, inner):
        self.inner, self.param_groups, self.defaults, self.state = inner, inner.param_groups, inner.defaults, {}
        self._grad_norm = None
    def step(self, closure=None, **kwargs):
        seen.append({"user_closure": closure is user_closure, "kwargs": sorted(kwargs)})
        loss = closure()
        self.inner.step()
        return loss
    def state_dict(self):
        return self.inner.state_dict()
    def load_state_dict(self, state):
        return self.inner.load_state_dict(state)
    def zero_grad(self, set_to_none=True):
        return self.inner.zero_grad(set_to_none)
model = torch.nn.Linear(3, 1)
zero = RecordingZero1(torch.optim.SGD(model.parameters(), lr=0.1))
neuron = neuron_replica.neuron_optimizer(module, zero)
def user_closure():
    zero.zero_grad()
    loss = torch.nn.functional.mse_loss(model(torch.ones(2, 3)), torch.zeros(2, 1))
    loss.backward()
    return loss
neuron.step(user_closure)
print(json.dumps({"seen": seen, "shim": tpu_closure_fix.is_enabled()}))
"""


@defined_where(not GUARDED)
def test_zero_1_branch_runs_the_release_unchanged():
    """On the ZeRO-1 branch the fix steps aside: the ZeRO-1 optimizer receives the user's own closure (it
    runs it, then reduce-scatters: the right order for one evaluation), with the shim as without it."""
    results = {shim: replica_tests.run_child_json(_ZERO_CHILD, child_env(shim), TESTS) for shim in (True, False)}
    assert results[True]["shim"] is True and results[False]["shim"] is False
    assert results[True]["seen"] == results[False]["seen"] == [{"user_closure": True, "kwargs": []}]

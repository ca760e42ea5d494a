"""What the replica tests of an optimizer integration (accelerate, optimum-neuron) check the same way.

Such a test module launches its replica module (:mod:`support.accelerate_replica`,
:mod:`support.neuron_replica`) on 2 ranks once with the shim and once without (:func:`run_both`), writes
the summary ``scripts/matrix.py`` aggregates (:func:`write_summary`, the keys ``test_replicas`` writes for
Lightning targets) and asserts through the helpers below; what differs per integration (its event names,
its site, its release rules) stays in the test module.

``runs`` is ``{shim: {rank: result}}``; a rank's result holds ``scenarios``: name -> ``params`` (the
flattened parameters after every step), ``events`` and, on rank 0, ``reference`` (plain PyTorch).
"""
import json
import os
import re
import subprocess
import sys

import pytest

from support import ranks

RANKS = (0, 1)
#: Seconds every launch may take (one import of the framework per rank, then every scenario).
TIMEOUT = 600


def run_both(module, scenarios, tmp_path_factory, environment_of):
    """``{shim: {rank: result}}``: ``module`` on 2 ranks with the shim and without it, every scenario in each
    launch; ``environment_of(shim)`` is the ranks' environment."""
    return {shim: ranks.run_replicas(module, scenarios, len(RANKS), tmp_path_factory.mktemp(module.split(".")[-1]),
                                     environment_of(shim), TIMEOUT)
            for shim in (True, False)}


# --------------------------------------------------------------------------- reading a run
def params(runs, shim, rank, name):
    return runs[shim][rank]["scenarios"][name]["params"]


def reference(runs, name):
    return runs[True][0]["scenarios"][name]["reference"]


def max_diff(a, b):
    """Largest |a - b| over every step and parameter of two trajectories."""
    return max(abs(x - y) for step_a, step_b in zip(a, b) for x, y in zip(step_a, step_b))


# --------------------------------------------------------------------------- the matrix summary
def results_dir(repo):
    return os.environ.get("TPU_CLOSURE_FIX_RESULTS") or os.path.join(repo, "results")


def summary_path(repo, target):
    return os.path.join(results_dir(repo), re.sub(r"[^A-Za-z0-9.+_-]+", "-", target) + ".json")


def scenario_summary(runs, spec):
    """One scenario's row: steps, whether the bug can show (a closure step), divergences, reference gaps."""
    name = spec["name"]
    with_shim, without = [[params(runs, shim, rank, name) for rank in RANKS] for shim in (True, False)]
    return {
        "steps": len(with_shim[0]),
        "bug_can_occur": spec.get("closure", True),
        "divergence_with_shim": max_diff(*with_shim),
        "divergence_without_shim": max_diff(*without),
        "reference_diff_with_shim": max_diff(with_shim[0], reference(runs, name)),
        "reference_diff_without_shim": max_diff(without[0], reference(runs, name)),
    }


def summarize(runs, target, framework, prefix, specs, not_applicable):
    """The matrix summary of one target: each of ``specs`` as ``prefix + name``, the worst figures over them."""
    scenarios = {prefix + spec["name"]: scenario_summary(runs, spec) for spec in specs}
    values = scenarios.values()
    return {
        "target": target,
        "lightning": None,
        "framework": framework,
        "scenarios_run": list(scenarios),
        "not_applicable": not_applicable,
        "replicas": len(RANKS),
        "steps_compared": sum(s["steps"] for s in values),
        "max_divergence_with_shim": max(s["divergence_with_shim"] for s in values),
        "max_divergence_without_shim": max(s["divergence_without_shim"] for s in values),
        "max_reference_diff_with_shim": max(s["reference_diff_with_shim"] for s in values),
        "scenarios": scenarios,
        "sites": {"with_shim": runs[True][0]["site"], "without_shim": runs[False][0]["site"]},
    }


def write_summary(repo, summary):
    os.makedirs(results_dir(repo), exist_ok=True)
    with open(summary_path(repo, summary["target"]), "w") as handle:
        json.dump(summary, handle, indent=1, sort_keys=True)


def assert_summary_written(repo, target):
    """The summary on disk is this target's, the shim matched the reference exactly and the twin diverged."""
    with open(summary_path(repo, target)) as handle:
        summary = json.load(handle)
    assert summary["target"] == target and summary["max_reference_diff_with_shim"] == 0.0
    assert summary["max_divergence_without_shim"] > 0.0


# --------------------------------------------------------------------------- trajectories
def assert_equals_reference(runs, name, steps):
    """With the shim every rank's trajectory is bitwise the reference's, ``steps`` long."""
    expected = reference(runs, name)
    assert len(expected) == steps
    for rank in RANKS:
        assert params(runs, True, rank, name) == expected, "rank %d differs from the reference" % rank


def assert_replicas_diverge(runs, name):
    """The twin: without the shim the released code steps on unreduced closure gradients."""
    rank0, rank1 = params(runs, False, 0, name), params(runs, False, 1, name)
    assert rank0[-1] != rank1[-1], "replicas agree without the shim: the scenario does not show the bug"
    assert rank0[-1] != reference(runs, name)[-1]


def trajectory_tests(specs):
    """The two trajectory tests of every integration module, one case per closure scenario of ``specs``:
    bitwise the reference with the shim, diverging replicas without it. A module takes them as its own::

        test_with_shim_equals_reference_bitwise, test_without_shim_replicas_diverge = trajectory_tests(SPECS)
    """
    steps = {spec["name"]: spec["steps"] for spec in specs}

    @pytest.mark.parametrize("name", list(steps))
    def test_with_shim_equals_reference_bitwise(runs, name):
        assert_equals_reference(runs, name, steps[name])

    @pytest.mark.parametrize("name", list(steps))
    def test_without_shim_replicas_diverge(runs, name):
        """The twin: the released code steps on unreduced closure gradients."""
        assert_replicas_diverge(runs, name)

    return test_with_shim_equals_reference_bitwise, test_without_shim_replicas_diverge


def assert_untouched(runs, name):
    """A path the release had right: with or without the shim the same events and the same bitwise
    parameters, equal to the reference."""
    for rank in RANKS:
        with_shim, without = runs[True][rank]["scenarios"][name], runs[False][rank]["scenarios"][name]
        assert with_shim["events"] == without["events"]
        assert with_shim["params"] == without["params"] == reference(runs, name)


def assert_each_evaluation_reduced_once(counts_of):
    """With the shim one gradient reduction per closure evaluation; without it none. ``counts_of(shim,
    rank)``: for each evaluation of that run, the reductions that followed it (in the integration's events)."""
    for rank in RANKS:
        with_shim, without = counts_of(True, rank), counts_of(False, rank)
        assert with_shim and set(with_shim) == {1}, with_shim
        assert without and set(without) == {0}, without


# --------------------------------------------------------------------------- one-process children
def event_step_child(prelude, key):
    """The code of a child that drives the integration's self-test step (``verify.event_step``, what
    ``check`` runs) on the row of call site ``key`` and prints ``{"verdict", "events"}``. ``prelude``
    imports json, types, torch, ``tpu_closure_fix``'s ``engine`` and the integration's ``verify``, and binds
    ``module`` (the release's module), ``xm`` (the stand-in) and ``events`` (the list the step records in)."""
    return prelude + """
finding = engine.examine(%r)
owner = getattr(module, %r)
target = types.SimpleNamespace(row=finding.site, module=module, owner=owner, attribute="step",
                               function=vars(owner)["step"])
verify.event_step(target, torch, xm, events)
print(json.dumps({"verdict": finding.verdict, "events": events}))
""" % (tuple(key), key[1].split(".")[0])


def run_child_json(code, environment, cwd):
    """Run ``python -c code`` (it prints its JSON result last); that result."""
    proc = subprocess.run([sys.executable, "-c", code], env=environment, cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])

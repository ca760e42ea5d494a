"""The generated support table credits each row with the matrix scenarios that ran through it.

Which scenarios those are is each integration's knowledge (``integrations/<name>/verify.py:
matrix_scenarios``, and ``double_scenarios`` for a package the matrix replaces with its test double);
the script only formats them. Fed trimmed matrix results written here.
"""
import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _script():
    spec = importlib.util.spec_from_file_location("support_table_under_test",
                                                  os.path.join(REPO, "scripts", "support_table.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _scenario(bug_can_occur=True, without=0.25):
    return {"bug_can_occur": bug_can_occur, "divergence_with_shim": 0.0, "divergence_without_shim": without,
            "reference_diff_with_shim": 0.0, "steps": 3}


def _results():
    accelerate = {
        "verdict": "pass", "wrapt": "2.5.2", "lightning": None,
        "status": [{"module": "accelerate.optimizer", "method": "AcceleratedOptimizer.step", "release": "1.15.0",
                    "verdict": "patched", "variant": "accelerate-1.7"}],
        "scenarios_run": ["accelerate-sgd", "accelerate-lbfgs", "accelerate-no-closure"],
        "scenarios": {"accelerate-sgd": _scenario(without=0.5), "accelerate-lbfgs": _scenario(without=0.125),
                      "accelerate-no-closure": _scenario(bug_can_occur=False, without=0.0)},
    }
    fabric = {
        "verdict": "pass", "wrapt": "2.5.2", "lightning": {"lite": "lightning_fabric 2.6.6 (fabric)"},
        "status": [{"module": "lightning_fabric.plugins.precision.xla", "method": "XLAPrecision.optimizer_step",
                    "release": "2.6.6", "verdict": "patched", "variant": "fabric-2.1"}],
        "scenarios_run": ["lite-sgd"], "scenarios": {"lite-sgd": _scenario()},
    }
    return {"targets": {"accelerate==1.15.0": accelerate, "lightning-fabric==2.6.6": fabric},
            "order": ["accelerate==1.15.0", "lightning-fabric==2.6.6"], "torch": "2.13.0", "python": "3.11"}


def _line(table, variant_releases):
    """The entry (a list item of docs/support.md, or a row of README's table) holding ``variant_releases``, as one
    line: its wrapped lines joined again."""
    entries = []
    for line in table.splitlines():
        if line.startswith(("- ", "|")) or not entries:
            entries.append(line)
        elif line.startswith(" "):
            entries[-1] += " " + line.strip()
    (entry,) = [e for e in entries if variant_releases in e]
    return entry


def test_accelerate_row_lists_the_accelerate_scenarios_with_their_divergence():
    script = _script()
    table = script.build_table(_results())
    line = _line(table, "accelerate `>=1.7.0,")
    assert "`accelerate==1.15.0`: sgd, lbfgs, no-closure = reference bitwise; without shim diverge (max 0.5)" in line
    assert "lightning-fabric" not in line and "status `patched`" not in line


def test_rows_of_another_integration_take_none_of_its_scenarios():
    script = _script()
    table = script.build_table(_results())
    fabric = _line(table, "lightning_fabric `>=2.1.0")
    assert "`lightning-fabric==2.6.6`: sgd = reference bitwise; without shim diverge (max 0.25)" in fabric
    assert "accelerate==1.15.0" not in fabric
    older = _line(table, "accelerate `>=0.28.0,")  # no target carries this row
    assert older.endswith("verified by the release matrix: not in the matrix")


def test_a_row_whose_target_ran_no_scenario_says_only_its_status():
    script = _script()
    results = _results()
    results["targets"]["accelerate==1.15.0"]["scenarios_run"] = []
    line = _line(script.build_table(results), "accelerate `>=1.7.0,")
    assert "`accelerate==1.15.0`: status `patched`" in line


def _with_guard_scenarios():
    results = _results()
    fabric = results["targets"]["lightning-fabric==2.6.6"]
    fabric["scenarios_run"] = ["lite-sgd", "xla-sgd", "xla-lbfgs"]
    fabric["scenarios"].update({"xla-sgd": _scenario(without=0.375), "xla-lbfgs": _scenario(without=0.0625)})
    return results


def test_the_guard_row_is_credited_with_the_plain_loop_scenarios_over_the_test_double():
    script = _script()
    table = script.build_table(_with_guard_scenarios())
    guard = _line(table, "torch_xla `>=2.1.0")
    assert ("`lightning-fabric==2.6.6` (torch_xla: the test double): sgd, lbfgs = reference bitwise; "
            "without shim diverge (max 0.38)") in guard
    assert "accelerate==1.15.0" not in guard
    fabric = _line(table, "lightning_fabric `>=2.1.0")
    assert "lbfgs" not in fabric and "test double" not in fabric


def test_without_plain_loop_scenarios_the_guard_row_is_not_in_the_matrix():
    script = _script()
    guard = _line(script.build_table(_results()), "torch_xla `>=2.1.0")
    assert guard.endswith("verified by the release matrix: not in the matrix")


def test_a_row_of_an_installed_package_takes_no_scenarios_from_a_target_without_its_release():
    script = _script()
    table = script.build_table(_with_guard_scenarios())
    older = _line(table, "lightning_fabric.plugins.precision.tpu:TPUPrecision.")  # the target carries the package, not this row
    assert older.endswith("verified by the release matrix: not in the matrix")


def _with_neuron_0_0_28(verdict):
    results = _results()
    results["targets"]["optimum-neuron==0.0.28"] = {
        "verdict": "pass", "wrapt": "2.5.2", "lightning": None,
        "status": [{"module": "optimum.neuron.accelerate.optimizer", "method": "NeuronAcceleratedOptimizer.step",
                    "release": "0.0.28", "verdict": verdict, "variant": None}],
        "scenarios_run": ["optimum-neuron-sgd", "optimum-neuron-no-closure"],
        "scenarios": {"optimum-neuron-sgd": _scenario(without=0.5),
                      "optimum-neuron-no-closure": _scenario(bug_can_occur=False, without=0.0)},
    }
    results["order"].append("optimum-neuron==0.0.28")
    return results


def test_the_guarded_optimum_neuron_line_is_credited_where_status_says_guarded():
    script = _script()
    line = _line(script.build_table(_with_neuron_0_0_28("guarded")), "optimum.neuron `>=0.0.24,<0.1.0`")
    assert "guarded (no row)" in line
    assert ("`optimum-neuron==0.0.28`: status `guarded`; sgd, no-closure = reference bitwise; without shim diverge "
            "(max 0.5)") in line
    summary = _line(script.build_summary(_with_neuron_0_0_28("guarded")), ">= 0.0.24, <= 0.0.28")
    assert summary.endswith("| 1/1 |")


def test_the_guarded_optimum_neuron_line_takes_no_target_whose_status_is_not_guarded():
    """The twin: the same target reporting 'skipped' (the guard not in place) verifies nothing."""
    script = _script()
    line = _line(script.build_table(_with_neuron_0_0_28("skipped")), "optimum.neuron `>=0.0.24,<0.1.0`")
    assert line.endswith("verified by the release matrix: not in the matrix")
    assert _line(script.build_summary(_with_neuron_0_0_28("skipped")), ">= 0.0.24, <= 0.0.28").endswith("| - |")


def test_neuronx_distributed_optimizer_is_listed_as_affected_not_verifiable():
    script = _script()
    line = _line(script.build_table(_results()), "NxDOptimizer.step")
    assert "**affected, not verifiable here**" in line and "SyncCheck" in line


def test_the_summary_says_of_each_site_the_verdict_status_prints_for_it():
    """A site the shim patches (the torch_xla guard included: status prints ``patched`` for it) reads
    ``patched`` in README's summary, never ``guarded`` (status's word for a framework's site that only the
    guard covers)."""
    from tpu_closure_fix import engine
    from tpu_closure_fix.sites import CALL_SITES

    script = _script()
    summary = script.build_summary(_results())
    guard = _line(summary, "`torch_xla`")
    assert "patched" in guard and "guarded" not in guard, guard
    for site in CALL_SITES:
        if site.fix is not None and not site.inherits:
            assert engine.PATCHED in script._summary_verdict(site), site.variant


def test_each_summary_verdict_is_the_word_status_prints_for_its_sites():
    """README's summary says what ``status`` says: ``patched`` for a row the shim patches (the torch_xla guard's row
    too: status prints its site ``patched``, never ``guarded``), ``fixed upstream`` for upstream-fixed code."""
    from tpu_closure_fix.sites import CALL_SITES

    script = _script()
    for site in CALL_SITES:
        if site.inherits:
            continue
        verdict = script._summary_verdict(site)
        expected = "fixed upstream" if site.fix is None else "patched"
        assert expected in verdict and "guarded" not in verdict.split("(")[0], (site.variant, verdict)


def test_an_inheriting_row_says_its_base_s_verdict_via_the_base_as_status_does():
    """status prints a subclass that inherits the method with its base's verdict and ``via`` the base (``patched
    (via ...TPUPrecisionPlugin.optimizer_step)``, ``fixed upstream (via ...)`` from 1.9): so does docs/support.md,
    never a word status does not print ("inherits")."""
    from tpu_closure_fix.sites import CALL_SITES

    script = _script()
    inheriting = [site for site in CALL_SITES if site.inherits]
    assert inheriting
    for site in inheriting:
        bases = script._bases_of(site)
        assert bases, site.variant
        expected = "fixed upstream" if all(base.fix is None for base in bases) else "patched"
        assert script.verdict_of(site) == "%s (via `%s`)" % (expected, site.inherits), site.variant
        untouched = script.strategy_of(site).startswith("none:")
        assert untouched == (expected == "fixed upstream"), (site.variant, script.strategy_of(site))
    words = {script.verdict_of(site).split(" (")[0] for site in inheriting}
    assert words == {"patched", "fixed upstream"}, words  # both kinds are in the table

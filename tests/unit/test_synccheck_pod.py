"""SyncCheck on a small pod of real replica processes (gloo over 127.0.0.1): the zero-code hook under
asymmetric ranks (a probe on rank 0, an optimizer stepped on rank 0 only, an LBFGS step that raised, a rank
killed before a check), ``tpu-closure-fix run --sync-check`` on a script that never imports the package,
the "started different" / "diverged between" diagnoses, replica groups of DTensor meshes and of
neuronx-distributed's parallel state, what ``compare_replicas`` takes, and one report per check.

Every "right" case has its twin that shows the failure; the scenarios are in
tests/support/pod_scenarios.py, started by tests/support/ranks.py (one thread each, a hard timeout).
"""
import os
import re
import shutil
import sys

import pytest

pytest.importorskip("torch", reason="SyncCheck compares torch tensors: no torch here")

import importlib.util  # noqa: E402

from support import ranks  # noqa: E402
from support import said as said_module  # noqa: E402

#: Four or more processes: what they test (layouts, report counts at scale) does not depend on the
#: interpreter, so the other interpreters' runs (scripts/pythons.py) leave them to the base one.
MANY_RANKS = pytest.mark.many_ranks

_torch = importlib.import_module("torch")
#: The zero-code hook is torch's global optimizer step hook (torch >= 2.0).
needs_step_hooks = pytest.mark.skipif(
    not hasattr(importlib.import_module("torch.optim.optimizer"), "register_optimizer_step_post_hook"),
    reason="the zero-code SyncCheck needs torch >= 2.0 (its global step hooks); torch %s here" % _torch.__version__)

REPO = ranks.REPO
SYNC = "TPU_CLOSURE_FIX_SYNC_CHECK"
TIMEOUT_VAR = "TPU_CLOSURE_FIX_SYNC_CHECK_TIMEOUT"
DIVERGED = "data-parallel replicas hold different parameters"
STANDS_DOWN = "the zero-code sync check stands down for"
REACHED_BY_0 = "rank 0 reached it, rank 1 did not"


def _ok(runs):
    ranks.assert_all_ok(runs)
    return runs


def _by_case(run):
    return {r["case"]: r for r in run.reports}


def _assert_changed(runs, tensor, versions):
    """Every rank's report of the case "changed" names ``tensor`` alone as differing, held in ``versions``."""
    for run in runs:
        report = _by_case(run)["changed"]
        assert report["outcome"] == "differ" and report["differing"] == [tensor]
        assert report["versions"] == versions


def _shared_run(scenario, world=2, env=None, name=None, unavailable=None):
    """A module-scoped fixture (named ``name``, default the scenario's): one run of the pod ``scenario``
    that the tests of its section share; ``unavailable``: why this torch cannot run it (the tests skip)."""

    @pytest.fixture(scope="module", name=name or scenario)
    def shared(tmp_path_factory):
        if unavailable:
            pytest.skip(unavailable)
        return _ok(ranks.run_ranks(scenario, world, tmp_path_factory.mktemp(scenario), env=env))

    return shared


#: One run of the 3,000-tensor scenario (section (i)), whose children also say which package they imported.
many = _shared_run("many")


# --------------------------------------------------------------------------- (a) a probe on rank 0 only
def test_the_children_run_the_working_tree(many):
    """The venv holds an old copy of the package: the children must import this checkout's."""
    for run in many:
        assert run.payload["modules"]["tpu_closure_fix"] == os.path.join(REPO, "tpu_closure_fix", "__init__.py")
        assert run.payload["modules"]["_tpu_closure_fix_startup"] == os.path.join(REPO, "startup",
                                                                                  "_tpu_closure_fix_startup.py")


@needs_step_hooks
def test_a_probe_on_rank_0_only_keeps_the_checks_in_step(tmp_path):
    runs = _ok(ranks.run_ranks("probe", 2, tmp_path, env={SYNC: "5"}))
    assert "probed" in runs[0].result and "probed" not in runs[1].result
    for run in runs:
        assert run.messages == [], run.describe()
        assert run.hook["armed_every"] == 5
        assert run.hook["checks"] == 4  # before step 1, after steps 1, 5, 10 of 12
        assert run.hook["last_report"]["outcome"] == "identical"
        assert run.hook["last_report"]["step"] == 10


@needs_step_hooks
def test_a_probe_on_rank_0_twin_without_the_gradient_all_reduce_warns_on_rank_0(tmp_path):
    runs = _ok(ranks.run_ranks("probe", 2, tmp_path, env={SYNC: "5"}, args=["--variant", "noreduce"]))
    warned = runs[0].messages
    # identical before step 1; different at steps 1, 5, 10: the same divergence, said once
    assert len(warned) == 1 and all(DIVERGED in m for m in warned), warned
    assert all("'0.weight'" in m for m in warned)  # named by module path, not param_groups[0][0]
    assert "between the start (identical before the first optimizer step) and step 1" in warned[0]
    assert [w["filename"] for w in runs[0].warnings] == [os.path.join(ranks.HERE, "pod_scenarios.py")]
    assert runs[1].messages == []
    assert [run.hook["checks"] for run in runs] == [4, 4]
    assert runs[1].hook["last_report"]["outcome"] == "differ"


@needs_step_hooks
def test_raise_stops_every_rank_at_the_same_optimizer_step(tmp_path):
    """The verdict of the check at step 1 comes from the worker; every rank raises at the step they agreed (a rank
    whose training passed that step before its worker handed it over: at its next step, saying so). The loops run
    until they raise: no collective keeps these ranks in step, and on a loaded machine a fixed number of steps can
    end before the worker answers (the job's end then fails it: test_synccheck_word.py)."""
    env = {SYNC: "50", SYNC + "_ON_DIVERGENCE": "raise"}
    runs = ranks.run_ranks("probe", 2, tmp_path, env=env, args=["--variant", "noreduce", "--steps", "0",
                                                                 "--drain", "5"])
    for run in runs:
        assert run.returncode == 3 and not run.timed_out, run.describe()
        assert run.failure.startswith("ReplicaDivergenceError: SyncCheck: data-parallel replicas hold different "
                                      "parameters between the start (identical before the first optimizer step) "
                                      "and step 1"), run.failure
        assert "steps" not in run.result  # the loop did not run to its end
    (_, agreed), _ = said_module.assert_raised_together([run.failure for run in runs])
    said = [m for m in runs[0].messages if "Every rank raises ReplicaDivergenceError at its optimizer step %d."
            % agreed in m]
    # on a loaded machine one rank may run far enough ahead for its stream's quota of checks the other has not
    # reached to stand it down (said once, by that rank) before the raise is known, or learn the agreed step late
    late = [m for run in runs for m in run.messages if LEARNT_LATE in m]
    others = [m for run in runs for m in run.messages if m not in said and m not in late]
    assert len(said) == 1, runs[0].messages
    assert all("stands down" in m and "not reached by every rank" in m for m in others), others
    assert all(len([m for m in run.messages if m in others]) <= 1 for run in runs), others
    assert all(len([m for m in run.messages if m in late]) <= 1 for run in runs), late


@needs_step_hooks
def test_raise_where_the_ranks_meet_at_every_step_and_one_learns_the_step_3_steps_late_stops_them_together(
        tmp_path):
    """The ranks all-reduce at every step and diverge; after the check at step 1 both trainings wait 0.3 s (the
    raise round then sees no pace), and rank 1's worker hands the agreed step over 3 steps late: every rank still
    raises at the same step (a rank raising at the next step would leave rank 1 in a collective no rank enters)."""
    env = {SYNC: "10", SYNC + "_ON_DIVERGENCE": "raise"}
    runs = ranks.run_ranks("repeat", 2, tmp_path, env=env, args=["--steps", "300", "--variant", "stall"],
                           timeout=120)
    for run in runs:
        assert run.returncode == 3 and not run.timed_out, run.describe()
        assert run.failure.startswith("ReplicaDivergenceError: SyncCheck: data-parallel replicas hold different "
                                      "parameters between the start (identical before the first optimizer step) "
                                      "and step 1"), run.failure
    steps = said_module.assert_raised_together([run.failure for run in runs])
    assert all(at == agreed for at, agreed in steps), steps  # each at the agreed step, none learnt it late
    assert not [m for run in runs for m in run.messages if LEARNT_LATE in m]


#: What a rank says when it learnt the agreed raise step only after its training passed it.
LEARNT_LATE = "learnt the optimizer step every rank raises at"


@needs_step_hooks
def test_a_rank_that_learns_the_raise_step_after_passing_it_says_so_before_it_waits(tmp_path):
    """As above, but rank 1's worker hands the agreed step over only once rank 1's training went past it: rank 0
    raises there and leaves; rank 1, in that step's all-reduce no rank enters any more, has said why first (its
    twin, 3 steps late, says nothing of it)."""
    env = {SYNC: "10", SYNC + "_ON_DIVERGENCE": "raise"}
    runs = ranks.run_ranks("repeat", 2, tmp_path, env=env, args=["--steps", "300", "--variant", "stall-late"],
                           timeout=120)
    zero, one = runs
    assert zero.returncode == 3 and "Raised at optimizer step" in zero.failure, zero.describe()
    agreed = int(re.search(r"Raised at optimizer step (\d+), the step every rank agreed on", zero.failure).group(1))
    late = [m for m in one.messages if LEARNT_LATE in m]
    assert late == ["tpu-closure-fix: rank 1 %s (%d) when its training had passed it (at step %d): it raises at its "
                    "next step. Ranks that raised at step %d no longer enter collectives with it: if it waits in one, "
                    "that is why." % (LEARNT_LATE, agreed, agreed, agreed)], one.describe()
    assert zero.messages and not [m for m in zero.messages if LEARNT_LATE in m]


@needs_step_hooks
def test_raise_twin_with_the_all_reduce_runs_to_the_end(tmp_path):
    env = {SYNC: "5", SYNC + "_ON_DIVERGENCE": "raise"}
    runs = _ok(ranks.run_ranks("probe", 2, tmp_path, env=env))
    assert [run.result["steps"] for run in runs] == [12, 12]


@needs_step_hooks
def test_a_probe_over_a_copy_of_the_model_on_rank_0_is_never_compared_with_the_model(tmp_path):
    """Rank 0 alone steps once, before training, a copy of the model (the same shapes) through the same
    ``train_step`` helper: its stream is another than the model's, so rank 1's model is compared with rank 0's
    model only. One stand-down note for the probe on rank 0; the model's checks all identical, no difference said
    (named by shapes and count alone, the probe took the model's name on rank 0 and was warned DIFFERENT)."""
    runs = _ok(ranks.run_ranks("probe-optimizer", 2, tmp_path, env={SYNC: "5", TIMEOUT_VAR: "3"},
                               args=["--variant", "copy"]))
    zero, one = runs
    assert zero.result["main_stream"] == one.result["main_stream"]
    assert len(zero.messages) == 1 and STANDS_DOWN in zero.messages[0] and REACHED_BY_0 in zero.messages[0], \
        zero.messages
    assert one.messages == []
    assert zero.result["main_checks"] == one.result["main_checks"] == 4
    assert zero.hook["last_report"]["outcome"] == one.hook["last_report"]["outcome"] == "identical"


# --------------------------------------------------------------------------- (b) an optimizer on rank 0 only
@needs_step_hooks
def test_an_optimizer_stepped_on_rank_0_only_stands_down_once_and_the_main_checks_go_on(tmp_path):
    runs = _ok(ranks.run_ranks("probe-optimizer", 2, tmp_path, env={SYNC: "5", TIMEOUT_VAR: "3"}))
    zero, one = runs
    for run in runs:
        assert run.seconds < 60 and run.parent_seconds < 60, run.describe()
    probe, main = zero.result["probe_stream"], zero.result["main_stream"]
    assert probe != main and one.result["main_stream"] == main
    assert len(zero.messages) == 1, zero.messages
    message = zero.messages[0]
    # the probe optimizer named as the user knows it, never by the stream's key
    assert message.startswith("tpu-closure-fix: %s SGD over weight, bias (in Linear) at step 0: " % STANDS_DOWN), \
        message
    assert REACHED_BY_0 + " within 3s" in message and probe not in message
    assert zero.result["probe_stood_down"].startswith(REACHED_BY_0)
    assert one.messages == []
    assert zero.result["main_checks"] == one.result["main_checks"] == 4
    assert zero.hook["checks"] == one.hook["checks"] == 4
    assert zero.hook["last_report"]["outcome"] == one.hook["last_report"]["outcome"] == "identical"


# --------------------------------------------------------------------------- (b') a probe stepped first, every step
@needs_step_hooks
def test_a_probe_stepped_first_at_every_step_stands_down_alone_and_a_late_divergence_is_reported(tmp_path):
    """Rank 0's probe checks are never reached by rank 1: they fill the probe's own quota of pending checks and
    only the probe stands down, naming the cause; the main optimizer's checks go on to the divergence at step
    160 (a process-wide bound alone let the probe's stuck checks crowd the main stream out)."""
    env = {SYNC: "1", TIMEOUT_VAR: "60"}
    runs = _ok(ranks.run_ranks("probe-first", 2, tmp_path, env=env,
                               args=["--steps", "200", "--variant", "diverge", "--drain", "10"]))
    zero, one = runs
    for run in runs:
        assert run.result["steps"] == 200 and run.result["main_stood_down"] is None, run.describe()
        assert run.hook["last_report"]["outcome"] == "differ" and run.hook["last_report"]["step"] == 200
    stood = [m for m in zero.messages if STANDS_DOWN in m]
    assert len(stood) == 1, zero.messages
    assert stood[0].startswith("tpu-closure-fix: %s SGD over weight, bias (in Linear) at step " % STANDS_DOWN)
    assert "its earlier checks were not reached by every rank (the oldest, at step 0, by " in stood[0], stood[0]
    assert "more often than the ranks can exchange them" not in stood[0]
    diverged = [m for m in zero.messages if DIVERGED in m]
    assert diverged and "between step 159 (identical) and step 160" in diverged[0], zero.messages
    assert one.messages == []


# --------------------------------------------------------------------------- (b'') the last check, at the job's end
ENDED = "did not complete"


def _ended(tmp_path, variant, env=None):
    runs = _ok(ranks.run_ranks("last-step", 2, tmp_path, env=dict(env or {}, **{SYNC: "10"}),
                               args=["--variant", variant, "--drain", "0"], timeout=120))
    for run in runs:
        assert run.returncode == 0 and run.parent_seconds < 60, run.describe()
        assert ENDED not in run.stderr and "Connection closed" not in run.stderr, run.describe()
    return runs


@needs_step_hooks
@pytest.mark.parametrize("variant", ["diverge", "diverge,slow"])
def test_the_last_check_is_answered_when_the_job_destroys_its_process_group(tmp_path, variant):
    """Rank 1 alone applies a different update at the last step (a check at step 20), then both ranks destroy
    their process group at once, or rank 1 a second later: the check is answered before the group goes."""
    zero, one = _ended(tmp_path, variant)
    said = [m for m in zero.messages if DIVERGED in m]
    assert len(said) == 1 and "between step 10 (identical) and step 20" in said[0], zero.messages
    assert zero.messages == said and one.messages == []
    for run in (zero, one):
        assert run.result["destroyed"] is True
        assert run.hook["last_report"]["step"] == 20 and run.hook["last_report"]["outcome"] == "differ"


@needs_step_hooks
def test_the_last_check_twin_with_the_same_update_is_silent_at_destroy(tmp_path):
    for run in _ended(tmp_path, ""):
        assert run.messages == [] and run.result["destroyed"] is True
        assert run.hook["last_report"]["step"] == 20 and run.hook["last_report"]["outcome"] == "identical"


@needs_step_hooks
@pytest.mark.parametrize("variant, said", [("diverge,exit", True), ("exit", False)])
def test_the_last_check_is_answered_at_interpreter_exit(tmp_path, variant, said):
    """No destroy_process_group: the interpreter's exit hooks let the worker answer the check at step 20 (said on
    rank 0's stderr, after the result was written); its twin with the same update says nothing."""
    zero, one = _ended(tmp_path, variant, env={"SYNC_CHECK_TEST_RECORD": "0"})  # reports on stderr, as for a user
    assert zero.messages == one.messages == []  # the result was written before the exit
    assert (": SyncCheck: " + DIVERGED in zero.stderr) is said, zero.describe()
    assert ("between step 10 (identical) and step 20" in zero.stderr) is said
    assert "SyncCheck" not in one.stderr, one.describe()


# --------------------------------------------------------------------------- (c) tpu-closure-fix run --sync-check
RUN = [sys.executable, "-m", "tpu_closure_fix", "run", "--sync-check", "5", "--"]


def _check_the_working_tree_ran(run):
    assert run.payload["modules"]["tpu_closure_fix"] == os.path.join(REPO, "tpu_closure_fix", "__init__.py")
    assert run.payload["modules"]["_tpu_closure_fix_startup"] == os.path.join(REPO, "startup",
                                                                              "_tpu_closure_fix_startup.py")
    assert run.result["pythonpath"].split(os.pathsep)[0] == os.path.join(REPO, "tpu_closure_fix", "_bootstrap")
    assert run.result["sync_check_var"] == "5"


@needs_step_hooks
def test_run_sync_check_on_a_plain_script_that_diverges_warns_on_rank_0(tmp_path):
    runs = _ok(ranks.run_ranks("plain", 2, tmp_path, launcher=RUN))
    for run in runs:
        _check_the_working_tree_ran(run)
        assert run.hook["checks"] == 4
    assert len(runs[0].messages) == 1 and all(DIVERGED in m for m in runs[0].messages), runs[0].messages
    assert runs[1].messages == []


@needs_step_hooks
def test_run_sync_check_on_the_plain_script_twin_with_the_all_reduce_is_silent(tmp_path):
    runs = _ok(ranks.run_ranks("plain", 2, tmp_path, launcher=RUN, args=["--variant", "reduce"]))
    for run in runs:
        _check_the_working_tree_ran(run)
        assert run.messages == []
        assert run.hook["checks"] == 4 and run.hook["last_report"]["outcome"] == "identical"


def test_the_plain_script_without_run_checks_nothing(tmp_path):
    """Twin of the diverging run: the same script started without ``run`` never loads the package."""
    runs = _ok(ranks.run_ranks("plain", 2, tmp_path))
    for run in runs:
        assert run.payload["modules"]["tpu_closure_fix"] is None
        assert run.hook["loaded"] is False and run.messages == []
        assert run.result["sync_check_var"] is None


# --------------------------------------------------------------------------- (d) started different / diverged between
seeded = _shared_run("seeded")


def test_replicas_seeded_by_rank_started_different(seeded):
    for run in seeded:
        report = _by_case(run)["by-rank@0"]
        assert report["outcome"] == "differ" and report["first_check"] is True and report["started_different"]
        assert "before the first optimizer step: the replicas started different" in report["message"]
        assert report["differing"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
        report = _by_case(run)["by-rank@1"]
        assert report["outcome"] == "differ" and report["first_check"] is False and not report["started_different"]
        assert report["differing"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
        later = _by_case(run)["by-rank@5"]
        assert later["outcome"] == "differ" and later["first_check"] is False and not later["started_different"]
        assert "started different" not in later["message"]


def test_replicas_seeded_by_rank_given_to_check_sync_with_its_default_are_a_divergence_too(seeded):
    """check_sync is the user's declaration: its default ``auto`` compares a bare model over the world."""
    for run in seeded:
        cases = _by_case(run)
        first = cases["by-rank-auto@0"]
        assert (first["outcome"], first["rule"], first["diverged"], first["in_sync"]) == ("differ", None, True, False)
        assert first["started_different"] and first["set_aside"] == []
        for step in (1, 5):
            assert cases["by-rank-auto@%d" % step]["outcome"] == "differ"


def test_replicas_with_the_same_seed_are_identical_at_step_1(seeded):
    for run in seeded:
        cases = _by_case(run)
        assert cases["same@0"]["outcome"] == "identical" and cases["same@0"]["first_check"] is True
        assert cases["same@1"]["outcome"] == "identical" and cases["same@1"]["first_check"] is False
        assert cases["same@5"]["outcome"] == "identical" and cases["same@5"]["identical_at"] == 1


def test_a_replica_perturbed_after_step_3_diverged_between_step_1_and_step_5(seeded):
    for run in seeded:
        cases = _by_case(run)
        assert cases["perturbed@1"]["outcome"] == "identical"
        report = cases["perturbed@5"]
        assert report["outcome"] == "differ" and report["differing"] == ["2.weight"]
        assert report["first_check"] is False and report["identical_at"] == 1
        assert "between step 1 (identical) and step 5" in report["message"]
        assert "started different" not in report["message"]
    # check_sync's one report per event: rank 0 says by-rank and by-rank-auto at 0 (at 1 and 5: the same
    # divergence) and perturbed at 5; rank 1 never
    assert len(seeded[0].messages) == 3 and seeded[1].messages == []


# --------------------------------------------------------------------------- (e) DTensor on a 2x2 mesh
dtensor = _shared_run("dtensor", world=4, env={"TPU_CLOSURE_FIX": "0"},
                      unavailable=None if importlib.util.find_spec("torch.distributed.tensor") else
                      "no torch.distributed.tensor (DTensor) in torch %s" % _torch.__version__)


@MANY_RANKS
def test_dtensor_shards_differ_over_tp_and_agree_over_dp(dtensor):
    for run in dtensor:
        assert run.result["coordinate"] == [run.rank // 2, run.rank % 2]
        assert run.result["types"] == ["DTensor", "DTensor"]
    local = [run.result["w_local"] for run in dtensor]
    assert local[0] == local[2] and local[1] == local[3] and local[0] != local[1]
    for run in dtensor:  # the twin: the same local shards as plain tensors differ over the world
        report = _by_case(run)["local-shards-as-plain"]
        assert report["outcome"] == "differ" and report["versions"] == [[0, 2], [1, 3]]


@MANY_RANKS
def test_dtensor_replicas_that_agree_over_dp_are_identical(dtensor):
    for run in dtensor:
        for case in ("dict", "list"):
            report = _by_case(run)[case]
            assert report["outcome"] == "identical" and report["differing"] == [], report
            assert "all 2 parameter tensors bitwise identical on all 4 replicas" in report["message"]


@MANY_RANKS
def test_dtensor_local_shard_changed_on_one_dp_replica_is_named(dtensor):
    _assert_changed(dtensor, "w", [[0], [2]])
    for run in dtensor:
        assert "(in the replica group of ranks 0, 2: rank 0 holds one version; rank 2 holds another)" in \
            _by_case(run)["changed"]["message"]
    assert [len(run.messages) for run in dtensor] == [0, 0, 0, 0]  # compare_replicas only reports


# --------------------------------------------------------------------------- (f) neuronx-distributed TP 2 x DP 2
neuron = _shared_run("neuron", world=4, env={"TPU_CLOSURE_FIX": "0"})


@MANY_RANKS
def test_neuron_tp_shards_agreeing_within_dp_groups_are_identical(neuron):
    for run in neuron:
        assert run.result["groups"] == [[0, 2], [1, 3]]
        assert _by_case(run)["tp"]["outcome"] == "identical"
        without = _by_case(run)["no-parallel-state"]  # twin: no parallel state, the TP shards differ
        assert without["outcome"] == "differ" and without["differing"] == ["shard"]
        assert without["versions"] == [[0, 2], [1, 3]]


@MANY_RANKS
def test_neuron_one_dp_replica_changed_differs(neuron):
    _assert_changed(neuron, "shard", [[1], [3]])


# --------------------------------------------------------------------------- (f') FSDP1 on two "hosts" of 2
fsdp = _shared_run("fsdp", world=4, env={SYNC: "1", TIMEOUT_VAR: "30"},
                   unavailable=None if tuple(int(x) for x in _torch.__version__.split(".")[:2]) >= (2, 1) else
                   "FSDP1 on CPU (device_id=cpu) needs torch >= 2.1; torch %s here" % _torch.__version__)


@MANY_RANKS
def test_fsdp_hybrid_shards_are_compared_over_their_replica_groups(fsdp):
    for run in fsdp:
        for case, count in (("hybrid", 1), ("hybrid-orig", 4)):
            report = _by_case(run)[case]
            assert report["outcome"] == "identical" and report["not_compared"] == [], report
            assert "all %d parameter tensors bitwise identical on all 4 replicas" % count in report["message"]
        # the twin: the same local shard as a plain tensor differs over the world (shards 0 and 1)
        plain = _by_case(run)["hybrid-as-plain"]
        assert plain["outcome"] == "differ" and plain["versions"] == [[0, 2], [1, 3]]
        assert _by_case(run)["hybrid-orig-as-plain"]["outcome"] == "structure"
    # use_orig_params: this rank's views of its shard have other lengths than the next shard's
    assert fsdp[0].result["hybrid-orig"] != fsdp[1].result["hybrid-orig"]
    assert fsdp[0].result["hybrid-orig"] == fsdp[2].result["hybrid-orig"]


@MANY_RANKS
def test_fsdp_hybrid_shard_changed_on_one_replica_is_named(fsdp):
    for run in fsdp:
        for case in ("hybrid", "hybrid-orig"):
            report = _by_case(run)[case + "-changed"]
            assert report["outcome"] == "differ" and report["versions"] == [[0], [2]], report
            assert report["differing"] == run.result[case + "-changed"]


@MANY_RANKS
def test_fsdp_full_shard_is_not_compared_and_never_identical(fsdp):
    for run in fsdp:
        for case in ("full", "full-changed"):
            report = _by_case(run)[case]
            assert report["outcome"] == "unverified", report
            assert [name for name, _ in report["not_compared"]] == ["_fsdp_wrapped_module._flat_param"]
            assert "FSDP FULL_SHARD" in report["not_compared"][0][1]
            assert "1 parameter tensor not compared" in report["message"]
        assert _by_case(run)["full-as-plain"]["versions"] == [[0], [1], [2], [3]]  # the twin: shards differ


@MANY_RANKS
def test_fsdp_on_a_subgroup_is_not_compared_across_groups_that_differ_by_design(fsdp):
    for run in fsdp:
        report = _by_case(run)["subgroup"]
        assert report["outcome"] == "unverified", report
        assert "FSDP NO_SHARD over 2 of the 4 ranks" in report["not_compared"][0][1]
        # the twin: the same full parameters as plain tensors differ between the two hosts (their own data)
        assert _by_case(run)["subgroup-as-plain"]["versions"] == [[0, 1], [2, 3]]


@needs_step_hooks
@MANY_RANKS
def test_fsdp_under_the_zero_code_check_one_report_per_event_on_rank_0(fsdp):
    for run in fsdp:  # every optimizer's stream is the same on every rank (no agreement timed out)
        for case in ("hybrid", "hybrid-orig", "full", "subgroup"):
            assert run.result[case + "-stream"] == {"checks": 5, "steps": 4, "stood_down": None}
    said = fsdp[0].messages
    assert len(said) == 4, said
    assert sum("different parameters between step 3 (identical) and step 4" in m for m in said) == 2
    assert sum("could not compare" in m and "FSDP FULL_SHARD" in m for m in said) == 1
    assert sum("could not compare" in m and "FSDP NO_SHARD over 2 of the 4 ranks" in m for m in said) == 1
    assert [run.messages for run in fsdp[1:]] == [[], [], []]


# --------------------------------------------------------------------------- (g) what compare_replicas takes
optimizers = _shared_run("optimizer", name="optimizers")


def test_an_optimizer_of_differing_replicas_differs(optimizers):
    for run in optimizers:
        report = _by_case(run)["differing"]
        assert report["outcome"] == "differ" and report["diverged"] is True
        assert report["differing"] == ["param_groups[0][0]"] and report["versions"] == [[0], [1]]


def test_an_exhausted_generator_is_unverified_with_a_reason(optimizers):
    for run in optimizers:
        assert run.result["exhausted"] == 4
        report = _by_case(run)["exhausted-generator"]
        assert report["outcome"] == "unverified" and report["diverged"] is False
        assert report["reason"] == "no parameter tensors to compare on every replica"
        assert "could not compare the replicas" in report["message"]


def test_an_optimizer_of_agreeing_replicas_is_identical(optimizers):
    for run in optimizers:
        report = _by_case(run)["agreeing"]
        assert report["outcome"] == "identical" and report["differing"] == []


# --------------------------------------------------------------------------- (h) an LBFGS step that raised
@needs_step_hooks
def test_after_an_lbfgs_step_raised_the_hook_still_reports_the_divergence(tmp_path):
    runs = _ok(ranks.run_ranks("lbfgs", 2, tmp_path, env={SYNC: "5"}))
    for run in runs:
        assert run.result["caught"] == "out of data at step 3" and run.result["lbfgs_steps"] == 2
        assert run.result["lbfgs_checks"] == 2 and run.result["sgd_checks"] == 4  # LBFGS: 0, 1; SGD: 0, 1, 5, 10
        assert run.hook["checks"] == 6 and run.hook["last_report"]["outcome"] == "differ"
    # the SGD stream at step 1 (its checks at 5 and 10: the same divergence); LBFGS reduced: identical
    assert len(runs[0].messages) == 1 and all(DIVERGED in m for m in runs[0].messages), runs[0].messages
    assert runs[1].messages == []


@needs_step_hooks
def test_after_an_lbfgs_step_raised_the_twin_with_the_all_reduce_is_silent(tmp_path):
    runs = _ok(ranks.run_ranks("lbfgs", 2, tmp_path, env={SYNC: "5"}, args=["--variant", "reduce"]))
    for run in runs:
        assert run.result["lbfgs_steps"] == 2 and run.result["sgd_checks"] == 4
        assert run.hook["checks"] == 6 and run.hook["last_report"]["outcome"] == "identical"
        assert run.messages == []


# --------------------------------------------------------------------------- (i) 3,000 tensors
def test_one_of_3000_tensors_differing_is_named_exactly(many):
    for run in many:
        same = _by_case(run)["same"]
        assert same["outcome"] == "identical" and "all 3000 parameter tensors" in same["message"]
        report = _by_case(run)["one-differs"]
        assert report["outcome"] == "differ" and report["differing"] == ["t1234"]
        assert "1 of 3000 parameter tensors differ" in report["message"]
        assert report["worst_parameter"] == "t1234"


# --------------------------------------------------------------------------- (j) a rank killed before a check
@needs_step_hooks
def test_a_rank_killed_before_a_check_never_hangs_its_peer(tmp_path):
    runs = ranks.run_ranks("killed", 2, tmp_path, env={SYNC: "5", TIMEOUT_VAR: "5"}, kill_rank=1, timeout=150)
    zero, one = runs
    assert one.returncode == 1 and not one.timed_out and one.payload is None
    assert "os._exit(1) before the check at step 5" in one.stderr
    assert not zero.timed_out and zero.parent_seconds < 90, zero.describe()
    assert zero.returncode == 3, zero.describe()  # the scenario ended with the training's own gloo error
    assert zero.messages and len(zero.messages) == 1, zero.messages
    message = zero.messages[0]
    if "the check's all-reduce did not complete" in message:
        # a loaded machine: the worker was still exchanging an earlier check when the peer died; it stood down then
        assert STANDS_DOWN in message, message
    else:
        assert STANDS_DOWN in message and "at step 5: " + REACHED_BY_0 + " within 5s" in message, message
        assert zero.hook["checks"] == 2  # before step 1 and after step 1
    assert zero.result["step"] == 6  # the next step's gradient all-reduce found the peer gone
    assert zero.failure.startswith("RuntimeError: ") and "peer" in zero.failure, zero.failure


# --------------------------------------------------------------------------- (k) one report per check
@needs_step_hooks
@MANY_RANKS
@pytest.mark.parametrize("world", [4, 8])
def test_one_report_per_check_names_the_ranks_by_version(tmp_path, world):
    runs = _ok(ranks.run_ranks("four", world, tmp_path, env={SYNC: "5"}))
    last = world - 1
    warned = runs[0].messages
    assert len(warned) == 1, warned  # step 1 (identical before it; at 5 and 10 the same divergence), rank 0 only
    for message in warned:
        assert DIVERGED in message and "(ranks 0-%d hold one version; rank %d holds another)" % (last - 1, last) \
            in message, message
    for run in runs:
        assert run.hook["checks"] == 4
        assert run.hook["last_report"]["versions"] == [list(range(last)), [last]]
    assert [len(run.messages) for run in runs[1:]] == [0] * last


# --------------------------------------------------------------------------- (m) never held up by a peer
PG_TIMEOUT = ["--pg-timeout", "10"]


def _wall(runs):
    """Seconds from the interpreters' start to the end of the slowest rank's training loop."""
    return max(run.result["loop_end_seconds"] for run in runs)


@needs_step_hooks
def test_a_probe_optimizer_on_rank_0_with_a_10s_process_group_timeout_finishes_on_every_rank(tmp_path):
    """The check's default agreement timeout (300 s) is far beyond the process group's 10 s: rank 0's probe
    checks wait on the worker, never in the training, so rank 1's own collectives never time out; once the
    probe's own quota of pending checks is full, the probe alone stands down, saying why."""
    args = PG_TIMEOUT + ["--steps", "200", "--drain", "3"]
    (tmp_path / "armed").mkdir()
    (tmp_path / "off").mkdir()
    armed = _ok(ranks.run_ranks("probe-optimizer", 2, tmp_path / "armed", env={SYNC: "5"}, args=args))
    off = _ok(ranks.run_ranks("probe-optimizer", 2, tmp_path / "off", env={SYNC: "0"}, args=args))
    for run in armed:
        assert run.result["steps"] == 200 and run.result["main_checks"] == 42, run.describe()  # 0, 1, 5 .. 200
        assert run.hook["last_report"]["outcome"] == "identical" and run.hook["last_report"]["step"] == 200
    assert armed[1].messages == []
    # the probe stands down once its quota is full and rank 1 went past its oldest check: when, the machine's pace
    # decides
    assert len(armed[0].messages) <= 1, armed[0].messages
    for message in armed[0].messages:
        assert re.match(r"tpu-closure-fix: %s SGD over weight, bias \(in Linear\) at step \d+: its earlier checks "
                        r"were not reached by every rank \(the oldest, at step 0, by (rank 0 only|1 of 2 ranks) so "
                        r"far, " % STANDS_DOWN, message), message
        assert armed[0].result["probe_stood_down"].startswith("its earlier checks were not reached by every rank")
    assert armed[0].result["drained_in_loop"] is False  # the probe's checks, still waiting for rank 1
    assert [run.result["steps"] for run in off] == [200, 200]
    print("\nstart to end of training, slowest rank: check armed %.2f s, off %.2f s, ratio %.2f"
          % (_wall(armed), _wall(off), _wall(armed) / _wall(off)))


@needs_step_hooks
def test_one_rank_without_the_check_and_a_10s_process_group_timeout_finishes(tmp_path):
    """Rank 1 never arms the check (its environment lacks the variable); rank 0's checks wait on its worker."""
    arguments = ["--scenario", "probe", "--drain", "3"] + PG_TIMEOUT
    environments = [ranks.child_environment({SYNC: "5"}), ranks.child_environment({})]
    runs = ranks.launch([sys.executable, "-m", "support.pod_scenarios"], 2, tmp_path, arguments, environments,
                        cwd=tmp_path, tag="unarmed")
    _ok(runs)
    zero, one = runs
    assert [run.result["steps"] for run in runs] == [12, 12]
    assert zero.hook["armed_every"] == 5 and one.hook["armed_every"] == 0
    assert zero.hook["checks"] == 0 and zero.result["drained"] is False  # no rank 1 to exchange with
    assert zero.messages == one.messages == []


@pytest.fixture(scope="module", name="endurance")
def _endurance(tmp_path_factory):
    """10,000 steps of a tiny model with the check at every step, then a fork, then destroy_process_group."""
    # the agreement's timeout at 5 s: a rank that stood down for being behind leaves the other's pending
    # checks of that stream to their timeout
    return _ok(ranks.run_ranks("endurance", 2, tmp_path_factory.mktemp("endurance"), env={SYNC: "1", TIMEOUT_VAR: "5"},
                               args=["--steps", "10000", "--drain", "60"], timeout=300))


@needs_step_hooks
def test_10000_steps_at_every_step_keep_memory_flat_and_say_at_most_once_that_the_check_is_behind(endurance):
    for run in endurance:
        assert run.result["steps"] == 10000 and run.result["drained_in_loop"] is True
        grown = run.result["rss_kib_end"] - run.result["rss_kib_early"]
        assert grown < 16 * 1024, run.result  # KiB: the pending checks are bounded (256 vectors of ~80 kB)
        assert len(run.messages) <= 1, run.messages
        for message in run.messages:
            # this rank's worker behind, or its checks of a stream the other rank stood down for being behind
            assert ("checks are still being exchanged" in message and "set TPU_CLOSURE_FIX_SYNC_CHECK higher"
                    in message) or "its earlier checks were not reached by every rank" in message, message
        assert run.hook["checks"] >= 2 and run.hook["last_report"]["outcome"] == "identical"


@needs_step_hooks
def test_a_forked_child_starts_without_the_worker(endurance):
    for run in endurance:
        assert "tpu-closure-fix-synccheck" in run.result["threads_before"]
        assert run.result["fork_child"] == "0 0 MainThread"  # no worker, none of the parent's gloo groups


@needs_step_hooks
def test_destroying_the_process_group_releases_the_worker_and_the_checks_group(endurance):
    for run in endurance:
        assert run.result["worker_before_destroy"] is True
        assert run.result["worker_after_destroy"] is False and run.result["check_groups_after_destroy"] == 0
        assert run.result["threads_after"] == ["MainThread"]


# --------------------------------------------------------------------------- sharing a core with training
CHRT_BATCH = ["chrt", "-b", "0"]  # a user's training process scheduled SCHED_BATCH from its start


@needs_step_hooks
@pytest.mark.skipif(not sys.platform.startswith("linux") or not shutil.which("chrt"),
                    reason="threads' own scheduling policies: Linux, with chrt")
@pytest.mark.parametrize("variant, launcher, check_threads", [
    ("", None, "BATCH"),  # keeping up: the worker and its group's threads yield
    ("behind", None, "OTHER"),  # falling behind: they take their share as training's threads do
    ("behind", CHRT_BATCH, "BATCH")])  # a process the user scheduled: nothing switched
def test_the_check_yields_a_shared_core_with_its_gloo_threads_while_it_keeps_up(tmp_path, variant, launcher,
                                                                                check_threads):
    """2 gloo ranks, a check at every step: the worker's thread and the threads of the check's own gloo group run
    as SCHED_BATCH while the worker keeps up; the training thread and the job's own gloo threads keep their
    policy; once the worker is stopped (a thread-leak guard) or the group destroyed, the check's group's threads
    still running are as they were found."""
    runs = _ok(ranks.run_ranks("scheduled", 2, tmp_path, env={SYNC: "1"}, args=["--variant", variant],
                               launcher=launcher))
    job = "BATCH" if launcher else "OTHER"
    for run in runs:
        policies, count = run.result["policies"], run.result["check_group"]
        if launcher:  # never switched: its group's threads are not even looked for (among "gloo" below)
            assert count == 0, run.result
        else:
            assert count >= 2 and policies["check-group"] == [check_threads] * count, run.result
        assert policies["worker"] == [check_threads], run.result
        assert policies["main"] == [job] and set(policies["gloo"]) == {job}, run.result
        if not launcher:  # the worker stopped, its group's threads are as it found them
            assert run.result["after_stop"]["check-group"] == [job] * count, run.result
        assert set(run.result["after_destroy"].get("check-group", [job])) == {job}, run.result

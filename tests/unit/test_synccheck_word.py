"""SyncCheck's word can be trusted, on real replica processes (gloo over 127.0.0.1, the one N-rank harness
tests/support/ranks.py): what it has seen equal it never sets aside, and what it finds reaches the user, once.

* Every decision per tensor, kept for the tensor's life: a rank-local scale is set aside alone and a later
  divergence beside it is raised; a new optimizer per epoch inherits what its tensors were seen as; of 3,000
  tensors the one that differs at the start is named and counted exactly.
* The explicit calls are the user's declaration: ``check_sync`` on a plain loop without reduction says
  ``differ`` at step 1.
* Reports go out on the logger: a warnings filter, ``PYTHONWARNINGS=ignore`` or a recording
  ``catch_warnings`` never mute them, and they reach stderr exactly once.
* ``raise`` fails the job that ends before the agreed step; a forked child that ends with ``os._exit`` still
  answers its last check; a divergence at every check is said once, then in short lines, and never stands the
  check down.

Each "right" case has its twin. The scenarios are in tests/support/pod_scenarios.py and tests/support/fork_job.py.
"""
import importlib
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="SyncCheck compares torch tensors: no torch here")

from support import ports, ranks  # noqa: E402
from support.said import assert_raised_together, raised_steps  # noqa: E402

_torch = importlib.import_module("torch")
needs_step_hooks = pytest.mark.skipif(
    not hasattr(importlib.import_module("torch.optim.optimizer"), "register_optimizer_step_post_hook"),
    reason="the zero-code SyncCheck needs torch >= 2.0 (its global step hooks); torch %s here" % _torch.__version__)

SYNC = "TPU_CLOSURE_FIX_SYNC_CHECK"
RAISE = {SYNC + "_ON_DIVERGENCE": "raise"}
DIVERGED = "data-parallel replicas hold different parameters"
#: The harness records reports through a handler; "0": none, so they reach stderr as a user's would.
TO_STDERR = {"SYNC_CHECK_TEST_RECORD": "0"}


def _raised_at(run):
    found = raised_steps(run.failure)
    return found[0] if found else None


#: What gloo says to a rank whose peer closed its connection: an end of stream read ("Connection closed by
#: peer"), or the reset the kernel sends instead when the peer closed with bytes still unread ("Read error
#: [address]:port: Connection reset by peer").
PEER_GONE = ("Connection closed by peer", ": Connection reset by peer")


def _raised_by_the_job(runs, *said):
    """Every rank ended with status 3, in time; the ranks that raised ReplicaDivergenceError name ``said`` and
    raised at the one step they agreed on. A rank stalled past that step when it learned it raises one step
    later (docs/synccheck.md), so its peer may meet the closed connection of the rank that raised first: at least
    one rank raised."""
    raised = [run for run in runs if (run.failure or "").startswith("ReplicaDivergenceError: SyncCheck: ")]
    for run in runs:
        assert run.returncode == 3 and not run.timed_out, run.describe()
        assert run in raised or any(words in (run.failure or "") for words in PEER_GONE), run.describe()
    assert raised, [run.describe() for run in runs]
    for run in raised:
        assert all(text in run.failure for text in said), run.failure
        assert run.result["steps"] < 5000
    if len(raised) == len(runs):
        assert_raised_together([run.failure for run in runs])
    return raised


# --------------------------------------------------------------------------- every decision per tensor
@needs_step_hooks
def test_a_rank_local_scale_is_set_aside_alone_and_a_later_divergence_beside_it_is_raised(tmp_path):
    runs = ranks.run_ranks("local-scale", 2, tmp_path, env=dict(RAISE, **{SYNC: "10"}), args=["--steps", "5000"])
    notes = [m for m in runs[0].messages if "set aside" in m]
    assert len(notes) == 1 and notes[0].startswith("SyncCheck: 1 parameter tensor differs before the first update "
                                                   "('scale')"), runs[0].messages
    raised = _raised_by_the_job(runs, "'2.weight'", "between step 30 (identical) and step 40")
    assert all(_raised_at(run) > 40 for run in raised)


@needs_step_hooks
def test_twin_without_the_rank_local_scale_the_same_change_is_raised_and_nothing_is_set_aside(tmp_path):
    runs = ranks.run_ranks("local-scale", 2, tmp_path, env=dict(RAISE, **{SYNC: "10"}),
                           args=["--steps", "5000", "--variant", "twin"])
    assert not [m for m in runs[0].messages if "set aside" in m], runs[0].messages
    raised = _raised_by_the_job(runs, "'2.weight'", "between step 30 (identical) and step 40")
    assert all(_raised_at(run) > 40 for run in raised)


@needs_step_hooks
def test_an_optimizer_built_afresh_each_epoch_inherits_what_its_tensors_were_seen_as(tmp_path):
    """Rank 1 stops reducing at step 200, the last step of the first epoch: the next epoch's new optimizer finds
    the difference at its first check (its step 0), a divergence, raised."""
    runs = ranks.run_ranks("epochs", 2, tmp_path, env=dict(RAISE, **{SYNC: "1000"}), args=["--steps", "5000"])
    raised = _raised_by_the_job(runs, "data-parallel replicas hold different parameters at step 0, the first check "
                                      "of this optimizer: tensors seen bitwise equal at an earlier check")
    assert all("started different" not in run.failure and "Build the model" not in run.failure for run in raised)
    assert not [m for m in runs[0].messages if "could not compare" in m or "set aside" in m], runs[0].messages


@needs_step_hooks
def test_twin_every_epoch_reduced_runs_to_the_end_in_silence(tmp_path):
    runs = ranks.run_ranks("epochs", 2, tmp_path, env=dict(RAISE, **{SYNC: "1000"}),
                           args=["--steps", "450", "--variant", "twin"])
    ranks.assert_all_ok(runs)
    assert [run.result["steps"] for run in runs] == [450, 450] and runs[0].messages == []
    assert [run.hook["checks"] for run in runs] == [6, 6]  # steps 0 and 1 of each of the 3 optimizers


@needs_step_hooks
def test_of_3000_tensors_the_one_rank_local_at_the_start_is_named_and_counted(tmp_path):
    runs = ranks.run_ranks("apart-3000", 2, tmp_path, env={SYNC: "5"}, args=["--steps", "6"])
    ranks.assert_all_ok(runs)
    (note,) = runs[0].messages
    assert note.startswith("SyncCheck: 1 parameter tensor differs before the first update ('p.2500'): "), note
    assert runs[1].messages == []
    for run in runs:
        last = run.hook["last_report"]
        assert last["outcome"] == "identical" and last["not_compared"] == [["p.2500", last["not_compared"][0][1]]]
        assert not last["in_sync"]


# --------------------------------------------------------------------------- the explicit calls declare
def test_check_sync_on_a_plain_loop_without_the_all_reduce_says_differ_at_step_1(tmp_path):
    runs = ranks.run_ranks("plain-check-sync", 2, tmp_path, args=["--steps", "5"])
    ranks.assert_all_ok(runs)
    for run in runs:
        by_step = {r["case"]: r for r in run.reports}
        assert sorted(by_step) == ["step-1", "step-5"]
        assert [(by_step[s]["outcome"], by_step[s]["diverged"], by_step[s]["in_sync"]) for s in ("step-1", "step-5")] \
            == [("differ", True, False)] * 2
    assert len(runs[0].messages) == 1 and DIVERGED in runs[0].messages[0] and runs[1].messages == []


def test_twin_check_sync_on_the_plain_loop_with_the_all_reduce_is_identical(tmp_path):
    runs = ranks.run_ranks("plain-check-sync", 2, tmp_path, args=["--steps", "5", "--variant", "reduce"])
    ranks.assert_all_ok(runs)
    for run in runs:
        assert [(r["outcome"], r["in_sync"]) for r in run.reports] == [("identical", True)] * 2
        assert run.messages == []


# --------------------------------------------------------------------------- what it finds reaches the user
@needs_step_hooks
@pytest.mark.parametrize("variant, env", [("filter", {}), ("plain", {"PYTHONWARNINGS": "ignore"}),
                                          ("record", {})], ids=["filterwarnings-ignore", "PYTHONWARNINGS", "record"])
def test_no_warnings_filter_mutes_a_divergence_it_reaches_stderr_once(tmp_path, variant, env):
    runs = ranks.run_ranks("muted", 2, tmp_path, env=dict(TO_STDERR, **dict(env, **{SYNC: "5"})),
                           args=["--steps", "12", "--variant", variant])
    ranks.assert_all_ok(runs)
    assert runs[0].stderr.count(DIVERGED) == 1, runs[0].describe()
    assert os.path.join(ranks.HERE, "pod_scenarios.py") + ":" in runs[0].stderr  # the line that stepped
    assert DIVERGED not in runs[1].stderr, runs[1].describe()
    assert runs[0].result["caught"] == 0  # nothing of it went through warnings


@needs_step_hooks
def test_twin_the_same_loop_with_the_all_reduce_says_nothing(tmp_path):
    runs = ranks.run_ranks("muted", 2, tmp_path, env=dict(TO_STDERR, **{SYNC: "5"}),
                           args=["--steps", "12", "--variant", "filter,reduce"])
    ranks.assert_all_ok(runs)
    assert all("SyncCheck" not in run.stderr for run in runs), runs[0].describe()


@needs_step_hooks
@pytest.mark.parametrize("variant, code", [("destroy", 3), ("exit", 1)])
def test_raise_fails_a_job_that_ends_before_the_agreed_step(tmp_path, variant, code):
    """The check at step 1 finds the divergence; the loop ends at step 3, before the step every rank agreed to
    raise at: the job still fails, from ``destroy_process_group`` or with exit status 1 at exit."""
    runs = ranks.run_ranks("ends-first", 2, tmp_path, env=dict(TO_STDERR, **dict(RAISE, **{SYNC: "5"})),
                           args=["--steps", "3", "--variant", variant])
    for run in runs:
        assert run.returncode == code and not run.timed_out, run.describe()
        if variant == "destroy":
            assert run.failure.startswith("ReplicaDivergenceError: SyncCheck: " + DIVERGED), run.failure
    if variant == "exit":
        assert "this process exits with status 1" in runs[0].stderr, runs[0].describe()
        assert "this process exits with status 1" not in runs[1].stderr  # one report for the job


@needs_step_hooks
@pytest.mark.parametrize("variant, code", [("exit,lag", 1), ("exit,lag,reduce", 0)])
def test_raise_fails_a_job_whose_training_ends_before_its_worker_found_the_divergence(tmp_path, variant, code):
    """As above, but each rank's worker counts in to the check at step 1 only 1 s after it was handed over, when
    the 3-step loops have ended: the checks are answered at the interpreter's exit, the divergence found there
    still fails the job (status 1, said once); its twin in sync ends with status 0."""
    runs = ranks.run_ranks("ends-first", 2, tmp_path, env=dict(TO_STDERR, **dict(RAISE, **{SYNC: "5"})),
                           args=["--steps", "3", "--variant", variant])
    for run in runs:
        assert run.returncode == code and not run.timed_out, run.describe()
        assert "drained_in_loop" not in run.result and run.failure is None, run.describe()
    said = [run.rank for run in runs if "this process exits with status 1" in run.stderr]
    assert said == ([0] if code else []), [run.describe() for run in runs]


@needs_step_hooks
@pytest.mark.parametrize("variant", ["destroy,reduce", "exit,reduce"])
def test_twin_a_job_in_sync_under_raise_ends_with_status_0(tmp_path, variant):
    runs = ranks.run_ranks("ends-first", 2, tmp_path, env=dict(TO_STDERR, **dict(RAISE, **{SYNC: "5"})),
                           args=["--steps", "3", "--variant", variant])
    ranks.assert_all_ok(runs)


def _fork_job(tmp_path, variant):
    env = ranks.child_environment(dict(TO_STDERR, **{SYNC: "10"}))
    return subprocess.run([sys.executable, "-m", "support.fork_job", "--port", str(ports.free_port()),
                           "--variant", variant], env=env, cwd=ranks.TESTS, capture_output=True, text=True,
                          timeout=180)


@needs_step_hooks
def test_a_forked_child_ending_with_os_exit_answers_its_last_check(tmp_path):
    """torch.multiprocessing's fork start (accelerate's debug launcher, Lightning's ddp_fork): rank 1's different
    update at the last step (a check at step 20) is reported although no child exits through the interpreter."""
    proc = _fork_job(tmp_path, "diverge")
    assert proc.returncode == 0 and "JOB DONE" in proc.stdout, proc.stderr
    assert proc.stderr.count(DIVERGED) == 1 and "between step 10 (identical) and step 20" in proc.stderr, proc.stderr


@needs_step_hooks
def test_twin_forked_children_with_the_same_update_say_nothing(tmp_path):
    proc = _fork_job(tmp_path, "")
    assert proc.returncode == 0 and "JOB DONE" in proc.stdout, proc.stderr
    assert "SyncCheck" not in proc.stderr and "tpu-closure-fix" not in proc.stderr, proc.stderr


@needs_step_hooks
def test_a_divergence_at_every_check_for_1000_steps_is_said_once_then_briefly_and_never_stands_down(tmp_path):
    runs = ranks.run_ranks("repeat", 2, tmp_path, env={SYNC: "1"}, args=["--steps", "1000"], timeout=300)
    ranks.assert_all_ok(runs)
    said = runs[0].messages
    full = [m for m in said if DIVERGED in m]
    short = [m for m in said if "still differ as said at step" in m]
    assert len(full) == 1 and len(short) <= 100 and len(said) == len(full) + len(short), said[:3]
    assert not [m for m in said if "stands down" in m]
    for run in runs:
        assert run.result["stood_down"] is None and run.result["checks"] == 1001, run.result
    assert runs[1].messages == []


@needs_step_hooks
def test_twin_the_same_job_in_sync_at_every_check_for_1000_steps_keeps_up_in_silence(tmp_path):
    runs = ranks.run_ranks("repeat", 2, tmp_path, env={SYNC: "1"}, args=["--steps", "1000", "--variant", "reduce"],
                           timeout=300)
    ranks.assert_all_ok(runs)
    for run in runs:
        assert run.messages == [] and run.result["stood_down"] is None and run.result["checks"] == 1001


@needs_step_hooks
@pytest.mark.parametrize("variant", ["reduce-lag", "lag"])
def test_a_rank_whose_worker_lags_1_5_s_at_a_check_every_step_stands_nothing_down(tmp_path, variant):
    """Rank 1's worker counts in its first check 1.5 s late (a loaded host) while both ranks train on at a check
    every step (some 150 checks meanwhile): no stream stands down, every check is answered -- silently when the
    ranks agree, and (its twin) with the divergence said when they do not."""
    runs = ranks.run_ranks("repeat", 2, tmp_path, env={SYNC: "1"}, args=["--steps", "300", "--variant", variant],
                           timeout=300)
    ranks.assert_all_ok(runs)
    for run in runs:
        assert not [m for m in run.messages if "stands down" in m], run.messages
        assert run.result["stood_down"] is None and run.result["checks"] == 301, run.result
    assert runs[1].messages == [] and (runs[0].messages == []) is (variant == "reduce-lag"), runs[0].messages[:2]


@needs_step_hooks
@pytest.mark.parametrize("variant, said", [("diverge", True), ("", False)])
def test_a_job_ended_by_sigterm_answers_its_last_check_then_ends_as_sigterm_ends_it(tmp_path, variant, said):
    """Rank 1 alone applies a different last update (a check at step 20); then each rank gets SIGTERM: the check
    is answered before the signal ends the process (status -SIGTERM, as without the check); its twin is silent."""
    import signal

    runs = ranks.run_ranks("sigterm", 2, tmp_path, env=dict(TO_STDERR, **{SYNC: "10"}), args=["--variant", variant],
                           timeout=120)
    for run in runs:
        assert run.returncode == -signal.SIGTERM and not run.timed_out, run.describe()
    assert (DIVERGED in runs[0].stderr) is said, runs[0].describe()
    assert ("between step 10 (identical) and step 20" in runs[0].stderr) is said
    assert DIVERGED not in runs[1].stderr


#: A process whose SIGTERM handler is the check's (installed at its first check); ``compose`` installs after it a
#: handler that records the signal and calls the one it found, as Lightning's signal connector does.
SIGTERM_CHILD = """
import os, signal, sys
sys.path.insert(0, sys.argv[2])
from tpu_closure_fix.synccheck import worker
worker._watch_sigterm()
assert signal.getsignal(signal.SIGTERM) is worker._on_sigterm
got = []
if sys.argv[1] == "compose":
    found = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: (got.append(signum), found(signum, frame)))
os.kill(os.getpid(), signal.SIGTERM)
print("survived", got)
"""


def _sigterm_child(mode, cwd):
    """The child's process (``-I``: nothing from the working directory or the environment's paths)."""
    return subprocess.run([sys.executable, "-I", "-c", SIGTERM_CHILD, mode, ranks.REPO], capture_output=True,
                          text=True, timeout=120, cwd=str(cwd))


def test_a_handler_installed_after_the_checks_that_calls_it_decides_and_the_process_goes_on(tmp_path):
    import signal

    proc = _sigterm_child("compose", tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "survived [%d]" % signal.SIGTERM, proc


def test_twin_the_checks_handler_alone_ends_the_process_as_sigterm_does(tmp_path):
    import signal

    proc = _sigterm_child("alone", tmp_path)
    assert proc.returncode == -signal.SIGTERM and proc.stdout == "", proc


RELEASE_CHILD = """
import signal, sys
sys.path.insert(0, sys.argv[1])
from tpu_closure_fix.synccheck import worker
def mine(signum, frame):
    pass
worker._watch_sigterm()
installed = signal.getsignal(signal.SIGTERM) is worker._on_sigterm
worker.release()
released = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
signal.signal(signal.SIGTERM, mine)  # the program's own handler, installed later: never taken back
worker.release()
print(installed, released, signal.getsignal(signal.SIGTERM) is mine)
"""


def test_the_job_s_end_gives_sigterm_its_default_action_back_and_leaves_a_program_s_handler_alone(tmp_path):
    proc = subprocess.run([sys.executable, "-I", "-c", RELEASE_CHILD, ranks.REPO], capture_output=True, text=True,
                          timeout=120, cwd=str(tmp_path))
    assert proc.returncode == 0 and proc.stdout.split() == ["True", "True", "True"], proc


def test_the_checks_the_end_drops_are_said_in_one_line_warning_only_for_a_real_loss():
    import logging
    import types

    from tpu_closure_fix.synccheck import worker

    def job(step, deadline, decision):
        return types.SimpleNamespace(pending=types.SimpleNamespace(step=step), deadline=deadline, decision=decision)

    assert worker.dropped_line([]) is None
    level, line = worker.dropped_line([job(5, 1.0, None), job(10, 1.0, None)])
    assert level == logging.INFO and "2 sync checks that not every rank reached (at step 5, 10)" in line
    level, line = worker.dropped_line([job(5, 1.0, None), job(10, 1.0, "go"), job(15, None, None)])
    assert level == logging.WARNING and "2 sync checks not answered (at step 10, 15)" in line

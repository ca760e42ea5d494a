"""benchmarks/synccheck_loop.py: its count of checks follows the check's schedule, its arms are checked for what
they stand for, its goal is read on the training thread's own time per check against the fingerprint plus 1 ms,
and its smoke run prints each loop's lines (no timing is asserted)."""
import re
import subprocess
import sys

import pytest

from support import benchmark_module  # noqa: E402

REPO = benchmark_module.REPO
PATH = benchmark_module.path("synccheck_loop")
bench = benchmark_module.load("synccheck_loop")


@pytest.mark.parametrize("steps, every, checks", [(300, 5, 62), (200, 100, 4), (30, 5, 8), (1, 5, 2), (4, 1, 5)])
def test_the_checks_counted_are_the_schedule_s(steps, every, checks):
    # before the first update, after it, then at every multiple of every
    assert bench.expected_checks(steps, every) == checks


def _result(checks, outcome="identical", every=5, own=1.0, first_own=0.0):
    return {"armed_every": every, "checks": checks, "outcome": outcome, "fingerprint_ms": 1.0, "worker_cpu_s": 0.01,
            "train_cpu_s": 1.0, "params": 100, "judged_own_s": own, "judged_first_own_s": first_own,
            "cores": [0, 1], "worker_cores": [1]}


def test_an_off_run_that_checked_or_an_armed_run_that_missed_checks_stops_the_run():
    cfg = {"steps": 30, "every": 5}
    with pytest.raises(SystemExit, match="'off' run ran the check"):
        bench.check_arm("off", cfg, _result(3))
    with pytest.raises(SystemExit, match="delivered 7 checks \\(want 8\\)"):
        bench.check_arm("armed", cfg, _result(7))
    with pytest.raises(SystemExit, match="the last diverged"):
        bench.check_arm("armed", cfg, _result(8, "diverged"))
    bench.check_arm("off", cfg, _result(0, None, every=0))
    bench.check_arm("armed", cfg, _result(8))
    spare = dict(cfg, spare=True)
    bench.check_arm("armed", spare, _result(8))
    with pytest.raises(SystemExit, match="ran on cores \\[0\\], not on the spare core 1"):
        bench.check_arm("armed", spare, dict(_result(8), worker_cores=[0]))


@pytest.mark.parametrize("added_s, met", [(0.0015, True), (0.0025, False)])
def test_the_goal_is_the_training_thread_s_own_time_within_the_fingerprint_plus_1_ms_a_later_check(capsys, added_s,
                                                                                                   met):
    """1.5 ms of the training thread's own time added per later check is within the fingerprint (1 ms) plus
    1 ms; 2.5 ms is not. The loop's wall time (here 10 s more) is printed, not judged."""
    cfg = {"steps": 20, "every": 2, "batch": 1}  # 11 checks, 9 after the first step; the goal 2 ms per check
    runs = {"armed": [(0.0, 11.0, _result(11, own=1.0 + 9 * added_s))] * 3,
            "off": [(0.0, 1.0, _result(0, None, 0))] * 3}
    assert bench.print_loop("t", cfg, runs) == (0 if met else 1)
    assert ("goal: the training thread loses <= fingerprint + 1 ms = 2.00 ms a later check: %s"
            % ("met" if met else "NOT met") in capsys.readouterr().out)


@pytest.mark.parametrize("first_s, met", [(0.0039, True), (0.0041, False)])
def test_the_first_step_s_goal_is_two_checks_of_the_fingerprint_plus_1_ms(capsys, first_s, met):
    """The first step holds two checks (before and after its update): with a 1 ms fingerprint, 3.9 ms of the
    training thread's own time added there is within 2 x 2 ms, 4.1 ms is not (the later checks within their goal
    either way; the first step's wall time, 1 s more, is not judged)."""
    cfg = {"steps": 20, "every": 2, "batch": 1}
    runs = {"armed": [(1.0, 1.0, _result(11, first_own=first_s))] * 3, "off": [(0.0, 1.0, _result(0, None, 0))] * 3}
    assert bench.print_loop("t", cfg, runs) == (0 if met else 1)
    assert ("goal: and <= 2 x (fingerprint + 1 ms) = 4.00 ms in the first step: %s" % ("met" if met else "NOT met")
            in capsys.readouterr().out)


@pytest.mark.parametrize("spare, own, first_own", [(True, 1.0, 0.5), (False, 3.0, 0.7)])
def test_a_run_is_judged_by_rank_0_with_a_spare_core_else_by_the_rank_that_lost_most(spare, own, first_own):
    ranks = [{"own_s": 1.0, "first_own_s": 0.5}, {"own_s": 3.0, "first_own_s": 0.2},
             {"own_s": 2.0, "first_own_s": 0.7}]
    assert bench.judged({"spare": spare, "every": 5}, ranks) == {"judged_own_s": own, "judged_first_own_s": first_own,
                                                                "judged_within_s": [], "judged_held_first": None,
                                                                "judged_held": []}


def _steps(count, base=0.002, added=None):
    """Each later step's own time (optimizer step 2 first): ``base`` seconds, plus ``added[number]``."""
    return [base + (added or {}).get(number, 0.0) for number in range(2, count + 2)]


def test_within_a_run_a_check_is_charged_its_window_against_its_period_s_other_steps():
    """Checks at 5, 10, 15 (every 5, steps 2-16): each window (the check's step and the next 2) is charged against
    the median of the period's other 2 steps (10's: 13 slow, 14 not: 4 ms). A slow step after the window is not
    charged to the check (it is in its period's median); a check whose window the run does not hold is left out."""
    added = {5: 0.001, 6: 0.0005, 7: 0.0002, 10: 0.003, 12: 0.004, 13: 0.004, 15: 0.001}
    found = bench.within_run(_steps(15, added=added), 5)
    assert [round(seconds, 6) for seconds in found] == [0.0017, 0.001]  # 15's window needs 17, not run
    assert bench.within_run(_steps(15), 5) == [0.0, 0.0]


@pytest.mark.parametrize("every, count, checks", [(100, 248, 2), (100, 199, 1), (5, 299, 59), (5, 3, 0)])
def test_within_a_run_every_check_with_its_window_and_period_counts(every, count, checks):
    assert len(bench.within_run(_steps(count), every)) == checks


@pytest.mark.parametrize("spare, expected", [(True, [0.001]), (False, [0.003])])
def test_within_a_run_the_judged_rank_is_rank_0_with_a_spare_core_else_the_one_whose_checks_cost_most(spare,
                                                                                                     expected):
    ranks = [{"own_s": 1.0, "first_own_s": 0.5, "step_own_s": _steps(8, added={5: added})} for added in
             (0.001, 0.003)]
    found = bench.judged({"spare": spare, "every": 5}, ranks)["judged_within_s"]
    assert [round(seconds, 6) for seconds in found] == expected


@pytest.mark.parametrize("added_s, met", [(0.0015, True), (0.0025, False)])
def test_the_within_run_goal_is_the_fingerprint_plus_1_ms_a_later_check(capsys, added_s, met):
    """Armed runs whose later checks each add ``added_s`` within the run (the whole runs equal: no paired
    difference) meet the goal of a 1 ms fingerprint plus 1 ms, or miss it; the off runs' control is printed."""
    cfg = {"steps": 20, "every": 2, "batch": 1}
    armed = dict(_result(11), judged_within_s=[added_s] * 9)
    runs = {"armed": [(0.0, 1.0, armed)] * 3, "off": [(0.0, 1.0, dict(_result(0, None, 0), judged_within_s=[0.0]))] * 3}
    assert bench.print_loop("t", cfg, runs) == (0 if met else 1)
    out = capsys.readouterr().out
    verdict = "met" if met else "NOT met"
    assert "goal (within runs): <= fingerprint + 1 ms = 2.00 ms a later check: %s" % verdict in out
    assert "(median of 27 checks; IQR %+.2f .. %+.2f); off, same steps +0.00" % (1e3 * added_s, 1e3 * added_s) in out


def _clocked(hooks, inside):
    """A rank's result with its step hooks' and fingerprints' seconds per optimizer step (step 1 first)."""
    return {"own_s": 1.0, "first_own_s": 0.5, "hooks_s": hooks, "in_fingerprint_s": inside}


def test_held_pairs_the_first_step_and_each_later_check_s_step_with_its_fingerprint():
    """Every 3, steps 1-7: the first step (two checks) and the checks after steps 3 and 6; steps 2, 4, 5, 7 held
    nothing of the check's."""
    hooks = [0.010, 0.001, 0.006, 0.002, 0.003, 0.007, 0.004]
    inside = [0.008, 0.0, 0.005, 0.0, 0.0, 0.0065, 0.0]
    first, later = bench.held_in_checks(_clocked(hooks, inside), 3)
    assert first == (0.010, 0.008)
    assert later == [(0.006, 0.005), (0.007, 0.0065)]
    assert bench.held_in_checks(_clocked(hooks, inside), 1)[1] == list(zip(hooks, inside))[1:]
    assert bench.held_in_checks({}, 3) == (None, [])


@pytest.mark.parametrize("spare, first, later", [(True, (0.004, 0.001), [(0.002, 0.001)]),
                                                 (False, (0.009, 0.001), [(0.005, 0.001)])])
def test_held_is_judged_on_rank_0_with_a_spare_core_else_on_the_rank_held_longest_beyond_its_fingerprint(
        spare, first, later):
    """Rank 1's fingerprints are the longer ones, rank 2's checks held longest beyond theirs: rank 2 is judged
    (rank 0 where it has a spare core)."""
    ranks = [_clocked([0.004, 0.002], [0.001, 0.001]), _clocked([0.012, 0.005], [0.008, 0.004]),
             _clocked([0.009, 0.005], [0.001, 0.001])]
    found = bench.judged({"spare": spare, "every": 2}, ranks)
    assert (found["judged_held_first"], found["judged_held"]) == (first, later)


@pytest.mark.parametrize("beyond_s, met", [(0.0009, True), (0.0011, False)])
def test_the_held_goal_is_the_fingerprint_plus_1_ms_a_check_and_2_ms_in_the_first_step(capsys, beyond_s, met):
    """Checks that held the training thread ``beyond_s`` past a 5 ms fingerprint each (the first step's two:
    twice that) meet the held goal, or miss it; the off runs' hook time is printed as the control."""
    cfg = {"steps": 20, "every": 2, "batch": 1}
    armed = dict(_result(11), judged_held_first=(0.010 + 2 * beyond_s, 0.010),
                 judged_held=[(0.005 + beyond_s, 0.005)] * 9)
    off = dict(_result(0, None, 0), judged_held_first=(0.0001, 0.0), judged_held=[(0.00005, 0.0)] * 9)
    runs = {"armed": [(0.0, 1.0, armed)] * 3, "off": [(0.0, 1.0, off)] * 3}
    assert bench.print_loop("t", cfg, runs) == (0 if met else 2)
    out = capsys.readouterr().out
    verdict = "met" if met else "NOT met"
    assert "goal (held): <= the fingerprint + 1 ms a check: %s a later check, %s in the first step" % (
        verdict, verdict) in out
    assert "%+8.2f ms (median of 27; IQR" % (1e3 * beyond_s) in out
    assert "its fingerprint 5.00 ms; off +0.05" in out
    assert "its fingerprints 10.00 ms; off +0.10" in out


def test_a_run_of_the_first_step_alone_judges_only_the_first_step(capsys):
    """3 steps, a check every 100: no later check, so no later-check goal (its own time, 2 steps, is not one)."""
    cfg = {"steps": 3, "every": 100, "batch": 1}
    runs = {"armed": [(0.0, 1.0, _result(2, own=1.5, first_own=0.001))] * 3, "off": [(0.0, 1.0, _result(0, None, 0))] * 3}
    assert bench.print_loop("t", cfg, runs) == 0
    out = capsys.readouterr().out
    assert "a later check:" not in out and "each later check" not in out and "(later checks)" not in out
    assert "in the first step: met" in out


@pytest.mark.slow
def test_the_smoke_run_prints_each_loop_in_lines_of_at_most_120_columns():
    pytest.importorskip("torch", reason="the benchmark trains a torch model: no torch here")
    from support import features

    if not features.has_step_hooks():
        pytest.skip(features.needs_step_hooks().kwargs["reason"])  # its armed arm is the zero-code check
    proc = subprocess.run([sys.executable, PATH, "--smoke"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 120 for line in lines), [line for line in lines if len(line) > 120]
    for name in bench.LOOPS:
        assert any(line.startswith(name + ": ") for line in lines), name
    assert sum(line.startswith("  goal: the training thread loses <= fingerprint + 1 ms") for line in lines) == len(
        bench.LOOPS)
    assert sum(line.startswith("  goal (within runs): ") for line in lines) == len(bench.LOOPS)
    assert sum(line.startswith("  goal (held): ") for line in lines) == len(bench.LOOPS)
    # the fingerprints inside the checks were timed (their CPU time is more than none), the later ones too
    inside = [float(re.search(r"its fingerprints? ([0-9.]+) ms", line).group(1)) for line in lines
              if re.match(r"    (each later check|first step) .* its fingerprint", line)]
    assert len(inside) == 2 * len(bench.LOOPS) and all(ms > 0 for ms in inside), inside
    assert lines[-1] in ["every goal met"] + ["%d goal(s) not met" % n for n in range(1, 5 * len(bench.LOOPS) + 1)]


def test_bad_counts_are_refused_naming_the_option():
    proc = subprocess.run([sys.executable, PATH, "--pairs", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and "--pairs: 0; give 1 or more" in proc.stderr

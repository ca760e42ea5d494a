"""benchmarks/synccheck_probe_wall.py: its ratio and goal are read as stated, its arms are checked for what they
stand for, and its smoke run prints both arms and the ratio (no timing is asserted)."""
import os
import subprocess
import sys

import pytest

from support import benchmark_module  # noqa: E402

REPO = benchmark_module.REPO
PATH = benchmark_module.path("synccheck_probe_wall")
bench = benchmark_module.load("synccheck_probe_wall")


def _runs(armed, off):
    return {"armed": [(a, a / 2) for a in armed], "off": [(o, o / 2) for o in off]}


def _armed_results(count):
    return [{"checks": 60, "stood_down": ["... stands down ..."], "armed_every": 5}] * count


def test_the_goal_is_met_at_1_2x_and_read_on_the_paired_ratios_of_the_job(capsys):
    assert bench.print_results(_runs([6.0, 12.0, 6.0], [5.0, 10.0, 5.0]), _armed_results(3), 400) == 0
    out = capsys.readouterr().out
    assert "job:  armed / off = 1.200x" in out and "goal <= 1.2x: met" in out
    assert "stood down in 3 of 3 runs" in out


def test_the_goal_is_not_met_above_1_2x(capsys):
    # medians of the arms are 6.1 and 5.0 (1.22x), and so is each pair's ratio
    assert bench.print_results(_runs([6.1, 6.1], [5.0, 5.0]), _armed_results(2), 400) == 1
    assert "goal <= 1.2x: NOT met" in capsys.readouterr().out


def test_an_off_arm_that_ran_checks_or_an_armed_arm_that_did_not_stops_the_run():
    with pytest.raises(SystemExit, match="'off' job ran the check"):
        bench._check_arm("off", {"armed_every": 5, "checks": 3})
    with pytest.raises(SystemExit, match="'armed' job ran no check"):
        bench._check_arm("armed", {"armed_every": 5, "checks": 0})
    with pytest.raises(SystemExit, match="'armed' job ran no check"):
        bench._check_arm("armed", {"armed_every": 0, "checks": 4})
    bench._check_arm("off", {"armed_every": 0, "checks": 0})
    bench._check_arm("armed", {"armed_every": 5, "checks": 4})


@pytest.mark.slow
def test_the_smoke_run_prints_both_arms_and_the_ratio_in_lines_of_at_most_120_columns():
    pytest.importorskip("torch", reason="the benchmark trains a torch model: no torch here")
    from support import features

    if not features.has_step_hooks():
        pytest.skip(features.needs_step_hooks().kwargs["reason"])  # its armed job is the zero-code check
    proc = subprocess.run([sys.executable, PATH, "--smoke"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 120 for line in lines), [line for line in lines if len(line) > 120]
    for arm in ("armed", "off"):
        assert any(line.split()[:1] == [arm] and len(line.split()) == 3 for line in lines), arm
    assert any(line.startswith("job:  armed / off = ") and "goal <= 1.2x: " in line for line in lines)
    assert lines[-1] in ("every goal met", "1 goal(s) not met")


def test_bad_counts_are_refused_naming_the_option():
    proc = subprocess.run([sys.executable, PATH, "--pairs", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and "--pairs: 0; give 1 or more" in proc.stderr

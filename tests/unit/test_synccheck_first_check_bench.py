"""benchmarks/synccheck_first_check.py: its goal is read on the paired differences, a job that did not measure
what it stands for stops the run, and its smoke run prints its lines in their shape (no timing is asserted)."""
import re
import subprocess
import sys

import pytest

from support import benchmark_module

REPO = benchmark_module.REPO
PATH = benchmark_module.path("synccheck_first_check")
bench = benchmark_module.load("synccheck_first_check")


def _result(pairs):
    return {"pairs": pairs, "live": 1000, "objects": 10, "scan_s": 0.5, "armed_every": bench.EVERY,
            "package": REPO}


def test_the_goal_is_met_when_the_paired_median_adds_at_most_1_ms(capsys):
    # medians of the arms differ by 5 ms (first 6, later 1); each pair's difference is at most 1 ms but one
    assert bench.print_results(_result([(0.002, 0.001), (0.006, 0.0055), (0.0100, 0.0095)])) == 0
    out = capsys.readouterr().out
    assert "first - later: +0.500 ms (paired median;" in out and "goal <= 1.0 ms: met" in out


def test_twin_a_first_check_2_ms_longer_in_each_pair_misses_the_goal(capsys):
    assert bench.print_results(_result([(0.003, 0.001), (0.004, 0.002)])) == 1
    assert "goal <= 1.0 ms: NOT met" in capsys.readouterr().out


def test_a_job_that_was_not_armed_or_missed_a_check_stops_the_run():
    with pytest.raises(SystemExit, match="not armed"):
        bench.check_result(dict(_result([(0.1, 0.1)]), armed_every=0), 1)
    with pytest.raises(SystemExit, match=r"optimizer\(s\) \[1\] of 2"):
        bench.check_result(_result([(0.1, 0.1), (0.1, None)]), 2)
    with pytest.raises(SystemExit, match="of 3"):
        bench.check_result(_result([(0.1, 0.1)]), 3)
    bench.check_result(_result([(0.1, 0.1)]), 1)


@pytest.mark.slow
def test_the_smoke_run_prints_the_pairs_the_goal_and_the_scan_in_lines_of_at_most_120_columns():
    pytest.importorskip("torch", reason="the benchmark trains a torch model: no torch here")
    from support import features

    if not features.has_step_hooks():
        pytest.skip(features.needs_step_hooks().kwargs["reason"])  # it measures the zero-code check
    proc = subprocess.run([sys.executable, PATH, "--smoke"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 120 for line in lines), [line for line in lines if len(line) > 120]
    assert re.match(r"\d+ live objects tracked per process \(10000 made by the job\); package: ", lines[1]), lines
    assert re.match(r"first check [\d.]+ ms \| later check [\d.]+ ms \(medians of 3 optimizers\)$", lines[2]), lines
    assert re.match(r"first - later: [+-][\d.]+ ms \(paired median; IQR [+-][\d.]+ \.\. [+-][\d.]+\); "
                    r"goal <= 1\.0 ms: (met|NOT met)$", lines[3]), lines
    assert re.match(r"one scan of the live objects \(what a first check made before\): [\d.]+ ms$", lines[4])
    assert lines[-1] in ("every goal met", "1 goal(s) not met")


def test_bad_counts_are_refused_naming_the_option():
    proc = subprocess.run([sys.executable, PATH, "--objects", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and "--objects: 0; give 1 or more" in proc.stderr

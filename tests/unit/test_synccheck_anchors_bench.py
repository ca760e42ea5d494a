"""benchmarks/synccheck_anchors.py: the anchors it times find what they exist to find (each says "different"
when one replica's parameter differs), its goals are read as stated, and its smoke run works."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="the benchmark compares torch parameters: no torch here")

from support import features  # noqa: E402  (after the skip: needs torch)

from support import benchmark_module  # noqa: E402

REPO = benchmark_module.REPO
PATH = benchmark_module.path("synccheck_anchors")
bench = benchmark_module.load("synccheck_anchors")


class TwoRanks(object):
    """torch.distributed as ``rank`` of two sees it, the other rank holding ``theirs`` (a function of each
    tensor this rank sends: what the other rank sends in its place)."""

    class ReduceOp(object):
        MAX = "max"

    def __init__(self, theirs, rank):
        self.theirs, self.rank = theirs, rank

    def get_world_size(self):
        return 2

    def all_gather(self, out, tensor):
        out[self.rank].copy_(tensor)
        out[1 - self.rank].copy_(self.theirs(tensor))

    def all_reduce(self, tensor, op=None):
        assert op == self.ReduceOp.MAX
        torch.maximum(tensor, self.theirs(tensor), out=tensor)


def _params():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(4, 3, generator=gen), torch.randn(3, generator=gen)]


def _changed(tensor):
    """What the other rank sends where its first parameter's first element is one ulp off: that parameter,
    the stacked digests (a changed byte) or the sums vector [s, -s] (s[0] changed in both halves)."""
    out = tensor.clone()
    flat = out.view(-1)
    if out.dtype == torch.uint8:
        flat[0] ^= 1
        return out
    half = flat.numel() // 2
    sums = flat.numel() % 2 == 0 and torch.equal(flat[half:], -flat[:half])
    flat.view(torch.int32)[0] += 1
    if sums:
        flat[half:] = -flat[:half]
    return out


@pytest.mark.parametrize("anchor, ranks_that_see", [("megatron", [1]), ("gather_equal", [0, 1]), ("sums", [0, 1])])
def test_each_anchor_finds_equal_replicas_equal_and_a_changed_one_different(anchor, ranks_that_see):
    """Megatron's method compares each rank's digests with rank 0's: only the other ranks see a difference."""
    method = getattr(bench, anchor)
    for rank in (0, 1):
        assert method(_params(), TwoRanks(lambda t: t.clone(), rank)) is True
        assert method(_params(), TwoRanks(_changed, rank)) is (rank not in ranks_that_see), rank


def _result(size, work=None, **held):
    """One size's measurements: every method held 10 ms and worked 1 ms, but for ``held`` and ``work``."""
    methods = {name: {"held_ms": 10.0, "thread_ms": 2.0, "work_ms": 1.0, "sent_bytes": 0, "peak_bytes": 0}
               for name in bench.METHODS}
    for name, value in held.items():
        methods[name]["held_ms"] = value
    for name, value in (work or {}).items():
        methods[name]["work_ms"] = value
    return {"size": size, "parameters": 100_000_000 if size == "100" else 260_000, "methods": methods}


_FINE_HELD = {bench.ZERO: 60.0, bench.FINGERPRINT: 60.0, bench.THIS: 90.0, bench.MEGATRON: 200.0,
              bench.GATHER: 400.0, bench.SUMS: 61.0, bench.FLOOR: 20.0}
_FINE_WORK = {bench.ZERO: 60.0, bench.FLOOR: 20.0, bench.MEGATRON: 200.0, bench.GATHER: 400.0, bench.SUMS: 61.0}


def test_the_goals_are_met_at_their_bounds(capsys):
    """Held as long as the fingerprint, work exactly 3 passes, every anchor held longer: all three goals met."""
    assert bench.goals([_result("100", work=_FINE_WORK, **_FINE_HELD)]) == 0
    out = capsys.readouterr().out
    assert "NOT met" not in out and "3.00x; goal <= 3x: met" in out and out.count("(c) held") == 3
    assert "the training thread's CPU time:     2.00 ms /     2.00 ms =  1.00x" in out  # shown, not judged


def test_goal_a_is_read_on_the_held_time_against_the_fingerprint(capsys):
    held = dict(_FINE_HELD, **{bench.FINGERPRINT: 30.0})  # held twice the fingerprint: the thread waited
    assert bench.goals([_result("100", work=_FINE_WORK, **held)]) == 1
    out = capsys.readouterr().out
    assert "(a) held: zero-code check" in out and "2.00x; goal <= 1x: NOT met" in out


def test_goal_b_is_read_on_the_work_of_the_whole_check_not_on_the_held_time(capsys):
    work = dict(_FINE_WORK, **{bench.ZERO: 61.0})  # 3.05 passes of work, though held 3 passes only
    assert bench.goals([_result("100", work=work, **_FINE_HELD)]) == 1
    out = capsys.readouterr().out
    assert out.count("NOT met") == 1 and "(b) work" in out and "3.05x; goal <= 3x: NOT met" in out
    held = dict(_FINE_HELD, **{bench.ZERO: 59.0, bench.FLOOR: 1.0})  # held 59 passes: (b) is not on held time
    assert bench.goals([_result("100", work=_FINE_WORK, **held)]) == 0


def test_goal_c_is_read_on_the_held_time_against_each_anchor(capsys):
    held = dict(_FINE_HELD, **{bench.SUMS: 59.0})  # the sums held the thread less than the check
    assert bench.goals([_result("100", work=_FINE_WORK, **held)]) == 1
    out = capsys.readouterr().out
    assert out.count("NOT met") == 1 and [line for line in out.splitlines() if "NOT met" in line][0].count(
        "per-tensor sums") == 1


def test_the_floor_goal_is_set_at_100_m_only(capsys):
    small = _result("0.26", **{bench.ZERO: 1.0, bench.FINGERPRINT: 1.0, bench.FLOOR: 0.01})
    assert bench.goals([small]) == 0
    assert "not measured" in capsys.readouterr().out


def test_the_work_against_each_anchor_is_printed_and_counted(capsys):
    work = dict(_FINE_WORK, **{bench.SUMS: 30.0})  # the sums cost less work than the check
    assert bench.work_ratios([_result("100", work=work, **_FINE_HELD)]) == 1
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.endswith("check faster: NO")] == [
        line for line in out.splitlines() if "work: per-tensor sums" in line]
    assert "1.50x (the worker's gain)" in out


@pytest.mark.slow
@features.needs_step_hooks()  # one of its methods is the zero-code check
def test_the_smoke_run_measures_every_method_in_lines_of_at_most_120_columns():
    proc = subprocess.run([sys.executable, PATH, "--smoke"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 120 for line in lines), [line for line in lines if len(line) > 120]
    for name in bench.METHODS:
        assert any(line.startswith("0.26 M") and name in line and "ms" not in line.split(name)[0] for line in lines), name
    assert lines[-1] in ("every goal met",) or lines[-1].endswith("goal(s) not met")
    assert any(line.startswith("0.26 M") and "(a) held: zero-code check" in line for line in lines)
    assert any(line.startswith("0.26 M") and "work: Megatron-core (SHA-1)" in line for line in lines)


def test_bad_sizes_are_refused_naming_the_accepted_values():
    proc = subprocess.run([sys.executable, PATH, "--sizes", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and "--sizes: 3 is not one of 0.26, 4, 17, 100" in proc.stderr

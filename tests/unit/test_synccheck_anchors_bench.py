"""benchmarks/synccheck_anchors.py: the anchors it times find what they exist to find (each says "different"
when one replica's parameter differs), its goals are read as stated, and its smoke run works."""
import importlib.util
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="the benchmark compares torch parameters: no torch here")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATH = os.path.join(REPO, "benchmarks", "synccheck_anchors.py")


def _bench():
    spec = importlib.util.spec_from_file_location("synccheck_anchors", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _bench()


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


def _result(size, **held):
    methods = {name: {"held_ms": 10.0, "work_ms": 1.0, "sent_bytes": 0, "peak_bytes": 0} for name in bench.METHODS}
    for name, value in held.items():
        methods[name]["held_ms"] = value
    return {"size": size, "parameters": 100_000_000 if size == "100" else 260_000, "methods": methods}


def test_the_goals_are_read_as_stated(capsys):
    fine = _result("100", **{bench.THIS: 60.0, bench.FINGERPRINT: 60.0, bench.MEGATRON: 200.0, bench.GATHER: 400.0,
                             bench.SUMS: 61.0, bench.FLOOR: 20.0})
    assert bench.goals([fine]) == 0
    out = capsys.readouterr().out
    assert "NOT met" not in out and "3.00x; goal <= 3x: met" in out
    slow = _result("100", **{bench.THIS: 61.0, bench.FINGERPRINT: 30.0, bench.MEGATRON: 200.0, bench.GATHER: 400.0,
                             bench.SUMS: 61.0, bench.FLOOR: 20.0})
    assert bench.goals([slow]) == 3  # not faster than the sums; held twice the fingerprint; over 3 passes
    out = capsys.readouterr().out
    assert out.count("NOT met") == 3 and "per-tensor sums" in out and "3.05x; goal <= 3x: NOT met" in out
    small = _result("0.26", **{bench.THIS: 1.0, bench.FINGERPRINT: 1.0, bench.FLOOR: 0.01})
    assert bench.goals([small]) == 0  # the floor's goal is set at 100 M only
    assert "not measured" in capsys.readouterr().out


@pytest.mark.slow
def test_the_smoke_run_measures_every_method_in_lines_of_at_most_120_columns():
    proc = subprocess.run([sys.executable, PATH, "--smoke"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 120 for line in lines), [line for line in lines if len(line) > 120]
    for name in bench.METHODS:
        assert any(line.startswith("0.26 M") and name in line and "ms" not in line.split(name)[0] for line in lines), name
    assert lines[-1] in ("every goal met",) or lines[-1].endswith("goal(s) not met")


def test_bad_sizes_are_refused_naming_the_accepted_values():
    proc = subprocess.run([sys.executable, PATH, "--sizes", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and "--sizes: 3 is not one of 0.26, 4, 17, 100" in proc.stderr

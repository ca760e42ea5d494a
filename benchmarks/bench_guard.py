"""Cost of the torch_xla guard on ``xm.optimizer_step`` calls WITHOUT a closure (the common case).

The guard wraps ``torch_xla.core.xla_model.optimizer_step`` for every caller; a
call without a closure in ``optimizer_args`` must pass straight through. Paired
blocks of ``--calls`` calls of the same ``optimizer_step`` (the CPU simulation's,
whose body is torch_xla's: reduce_gradients, then step), unpatched and patched,
order alternating, on one replica with an optimizer whose gradients are None and
whose ``step`` does nothing, so the guard's own cost is what differs. The figure
is the median over pairs of the per-call difference. Goal: <= 1 us.

    python benchmarks/bench_guard.py            # 400 pairs x 1000 calls
    python benchmarks/bench_guard.py --smoke    # 10 pairs (CI: checks it runs)
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)
from _stats import summary  # noqa: E402


class _NoOpOptimizer(object):
    """What ``xm.optimizer_step`` touches: ``param_groups`` (no gradients) and ``step``."""

    param_groups = [{"params": []}]

    def step(self, closure=None):
        return None


def _block(function, optimizer, calls):
    start = time.perf_counter()
    for _ in range(calls):
        function(optimizer)
    return (time.perf_counter() - start) / calls


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=400)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--smoke", action="store_true", help="10 pairs: checks the benchmark runs")
    args = parser.parse_args(argv)
    pairs = 10 if args.smoke else args.pairs

    os.environ["TPU_CLOSURE_FIX"] = "1"
    import tpu_closure_fix
    from tpu_closure_fix import _simulated_xla, engine

    xm = _simulated_xla.install(world_size=1)
    original = engine._state.patches[("torch_xla.core.xla_model", "optimizer_step")][2]
    patched = xm.optimizer_step
    assert engine.is_ours(patched) and original is not patched, "the guard is not in place"
    assert tpu_closure_fix.is_enabled()
    optimizer = _NoOpOptimizer()
    base, treated = [], []
    for i in range(pairs):
        first, second = (original, patched) if i % 2 == 0 else (patched, original)
        a = _block(first, optimizer, args.calls)
        b = _block(second, optimizer, args.calls)
        base.append(a if first is original else b)
        treated.append(b if first is original else a)
    summary("xm.optimizer_step, no closure", base, treated, "us", scale=1e6, goal=1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())

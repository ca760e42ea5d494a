"""Cost of one patched ``optimizer_step`` vs the upstream-fixed code, same class, same stand-in.

pytorch-lightning 1.8.6's ``TPUPrecisionPlugin.optimizer_step`` as patched by the
shim, against a verbatim copy of pytorch-lightning 1.9.0's fixed body (and its
``_tpu_wrap_closure``, Apache-2.0, Lightning AI) called on the same plugin
instance: same trainer, same hooks, the torch_xla stand-in, a trivial closure and
an optimizer whose ``step`` only calls the closure. Both do the same work
(closure, reduce_gradients, hooks, step, mark_step), so the difference is the
shim's own cost. Many short paired blocks of ``--calls`` calls, order alternating
(short blocks: a busy machine then disturbs both arms of a pair alike); the figure
is the median over pairs of the per-call difference. Goal: <= 2 us.

    python benchmarks/bench_step.py            # 400 pairs x 100 calls (~30 s)
    python benchmarks/bench_step.py --smoke    # 10 pairs x 100 calls (CI)
"""
import argparse
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TARGET = os.path.join(REPO, ".cache", "targets", "pytorch-lightning-1.8.6")
sys.path.insert(0, HERE)
from _stats import summary  # noqa: E402


# ---- pytorch-lightning 1.9.0, src/pytorch_lightning/plugins/precision/tpu.py (verbatim bodies) ----------------
def _tpu_wrap_closure(self, optimizer, closure):
    import torch_xla.core.xla_model as xm

    closure_result = closure()
    xm.reduce_gradients(optimizer)
    return closure_result


def upstream_1_9_optimizer_step(self, optimizer, model, optimizer_idx, closure, **kwargs):
    import torch_xla.core.xla_model as xm

    closure = partial(self._tpu_wrap_closure, optimizer, closure)
    closure = partial(self._wrap_closure, model, optimizer, optimizer_idx, closure)
    closure_result = optimizer.step(closure=closure, **kwargs)
    xm.mark_step()
    skipped_backward = closure_result is None
    # in manual optimization, the closure does not return a value
    if model.automatic_optimization and skipped_backward:
        # we lack coverage here so disable this - something to explore if there's demand
        raise MisconfigurationException(
            "Skipping backward by returning `None` from your `training_step` is not implemented for TPUs."
            " Please, open an issue in `https://github.com/Lightning-AI/lightning/issues`"
            " requesting this feature."
        )
    return closure_result
# --------------------------------------------------------------------------------------------------------------


def setup():
    sys.path[:0] = [TARGET, REPO, os.path.join(REPO, "tests")]
    warnings.simplefilter("ignore")
    os.environ.pop("TPU_CLOSURE_FIX", None)
    import torch
    import pytorch_lightning  # noqa: F401 (Lightning is imported before the torch_xla stand-in is installed)
    from support import xla_standin as xm
    from support.one_step_trainer import fitted_tpu_precision_plugin
    import tpu_closure_fix
    from pytorch_lightning.plugins.precision import tpu

    xm.install()
    tpu.xm = xm
    tpu._XLA_AVAILABLE = True
    assert type(vars(tpu.TPUPrecisionPlugin)["optimizer_step"]).__name__ == "FunctionWrapper", "not patched"
    global partial, MisconfigurationException
    from functools import partial
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    tpu.TPUPrecisionPlugin._tpu_wrap_closure = _tpu_wrap_closure  # the 1.9.0 helper, on the same class

    class NoOpOptimizer(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {})

        def step(self, closure=None):
            return closure()

    trainer, plugin, model = fitted_tpu_precision_plugin()
    optimizer = NoOpOptimizer(model.parameters())
    result = torch.tensor(1.0)

    def closure():
        return result

    # Each timed function holds the trainer (a default argument): the model refers to it weakly.
    def patched(n, _trainer=trainer):
        step = plugin.optimizer_step
        start = time.perf_counter()
        for _ in range(n):
            step(optimizer, model, 0, closure)
        return (time.perf_counter() - start) / n

    def upstream(n, _trainer=trainer):
        step = upstream_1_9_optimizer_step
        start = time.perf_counter()
        for _ in range(n):
            step(plugin, optimizer, model, 0, closure)
        return (time.perf_counter() - start) / n

    # Same events on both paths (the point of the comparison).
    for fn in (patched, upstream):
        xm.clear()
        fn(1)
        assert xm.names() == ["reduce_gradients", "mark_step"], xm.names()
    xm.events[:] = []
    sys.modules["torch_xla.core.xla_model"].recorder = None  # no event log: it would grow without bound
    return patched, upstream, tpu_closure_fix


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=400)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--smoke", action="store_true", help="10 pairs x 100 calls, for CI (figures not meaningful)")
    args = parser.parse_args(argv)
    if not os.path.isdir(TARGET):
        sys.exit("install the target first: python scripts/targets.py install pytorch-lightning==1.8.6")
    pairs, calls = (10, 100) if args.smoke else (args.pairs, args.calls)
    patched, upstream, shim = setup()
    patched(calls), upstream(calls)  # warm-up
    base, treated = [], []
    for i in range(pairs):
        if i % 2:
            treated.append(patched(calls))
            base.append(upstream(calls))
        else:
            base.append(upstream(calls))
            treated.append(patched(calls))
    print("%d pairs x %d calls" % (pairs, calls))
    summary("optimizer_step: patched 1.8.6 vs 1.9.0", base, treated, "us", scale=1e6,
            goal=None if args.smoke else 2.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())

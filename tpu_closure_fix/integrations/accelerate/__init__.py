"""The Hugging Face accelerate integration: ``AcceleratedOptimizer.step(closure)`` on torch_xla.

Every accelerate release whose ``step`` takes a closure (0.4.0 on) reduces the
gradients before the closure computes them. The rows follow the code shapes
read from the published wheels (``accelerate/optimizer.py``); each boundary is
between two adjacent releases that were both read:

==============  ===============================================================
0.4.0-0.5.1     ``if self.state.distributed_type == DistributedType.TPU:``
                ``xm.optimizer_step(self.optimizer, optimizer_args={"closure": ...})``
0.6.0-0.10.0    the same, on ``self.accelerator_state``
0.11.0-0.27.2   the same, inside ``if self.gradient_state.sync_gradients:``
0.28.0-1.6.0    ``DistributedType.XLA``: ``xm.all_reduce("sum", xm._fetch_gradients(...),
                scale=1.0 / xm.xrt_world_size())`` unless ``is_xla_gradients_synced``,
                then ``self.optimizer.step(closure)`` (LOMO early return from 0.30.0)
1.7.0-1.16.0    the same with ``scale=1.0 / xr.world_size()``
==============  ===============================================================

0.1.0-0.3.0 take no closure (not affected) and have no row: like any release
outside the rows, they are left untouched and reported as unknown.
"""
from ...shape import Shape
from ...sites import fingerprint_table, make_site
from .fixes import PARAMS, OptimizerStepClosureFix, XlaClosureFix

NAME = "accelerate"
#: Top-level packages whose import arms the start-up watcher.
PACKAGES = frozenset(("accelerate",))

MODULE = "accelerate.optimizer"
QUALNAME = "AcceleratedOptimizer.step"
DISTRIBUTION = "accelerate"

# --- shapes ------------------------------------------------------------------
# Up to 0.27 the buggy call is xm.optimizer_step(..., optimizer_args=...) on TPU; from 0.28 it is the
# pre-step all_reduce followed by optimizer.step(closure). Neither reduces after the closure.
_OPTIMIZER_STEP = ("optimizer_step", "optimizer_args", "closure", "distributed_type", "TPU", "optimizer")
_XLA_STEP = ("_fetch_gradients", "all_reduce", "is_xla_gradients_synced", "sync_gradients", "XLA", "step",
             "closure", "optimizer")
_NOT_FIXED = ("reduce_gradients", "mark_step")

TPU_STATE = Shape(PARAMS, varkw=False, requires=_OPTIMIZER_STEP + ("state",),
                  forbids=_NOT_FIXED + ("accelerator_state", "sync_gradients", "_fetch_gradients"))
TPU_ACCELERATOR_STATE = Shape(PARAMS, varkw=False, requires=_OPTIMIZER_STEP + ("accelerator_state",),
                              forbids=_NOT_FIXED + ("sync_gradients", "_fetch_gradients"))
TPU_SYNC_GATED = Shape(PARAMS, varkw=False,
                       requires=_OPTIMIZER_STEP + ("accelerator_state", "gradient_state", "sync_gradients"),
                       forbids=_NOT_FIXED + ("_fetch_gradients",))
XLA_XRT = Shape(PARAMS, varkw=False, requires=_XLA_STEP + ("xrt_world_size",),
                forbids=_NOT_FIXED + ("optimizer_step", "optimizer_args", "xr"))
XLA_XR = Shape(PARAMS, varkw=False, requires=_XLA_STEP + ("xr", "world_size"),
               forbids=_NOT_FIXED + ("optimizer_step", "optimizer_args", "xrt_world_size"))


#: Code fingerprints (:mod:`tpu_closure_fix.identity`) of each row's known code, one ``(release,
#: fingerprint)`` pair per distinct code, named by the newest release read that has it. Measured by
#: ``python scripts/fingerprints.py wheels`` from the 37 closure-taking wheels read (not every
#: release; docs/fingerprints.json lists them per release). 0.21.0 and 0.22.0 changed only the scaler branch.
FINGERPRINTS = fingerprint_table("""
accelerate-0.4   0.5.1=sha256:05ba936f9527a4b2
accelerate-0.6   0.10.0=sha256:90d54cfc8ccfec29
accelerate-0.11  0.20.3=sha256:8306a2f6a6537970  0.21.0=sha256:03370a90194583e2  0.27.2=sha256:378a8f66ea8a439d
accelerate-0.28  0.29.3=sha256:b0fdce55d3656a41  1.6.0=sha256:59b2457bd134540c
accelerate-1.7   1.16.0=sha256:99a5512f038b56d2
""")


def _site(variant, releases, shape, fix, note=""):
    return make_site(variant, NAME, "accelerate", DISTRIBUTION, MODULE, QUALNAME, releases, shape, fix,
                     fingerprints=FINGERPRINTS[variant], note=note)


CALL_SITES = (
    _site("accelerate-0.4", ">=0.4.0,<0.6.0", TPU_STATE, OptimizerStepClosureFix("state", gated=False)),
    _site("accelerate-0.6", ">=0.6.0,<0.11.0", TPU_ACCELERATOR_STATE,
          OptimizerStepClosureFix("accelerator_state", gated=False)),
    _site("accelerate-0.11", ">=0.11.0,<0.28.0", TPU_SYNC_GATED,
          OptimizerStepClosureFix("accelerator_state", gated=True)),
    _site("accelerate-0.28", ">=0.28.0,<1.7.0", XLA_XRT, XlaClosureFix("xrt"), note="LOMO early return from 0.30.0"),
    _site("accelerate-1.7", ">=1.7.0,<1.16.1", XLA_XR, XlaClosureFix("xr")),
)

"""SyncCheck: catch data-parallel replicas that silently train different models.

Every ``every`` optimizer steps, each replica computes a cheap fingerprint of
its parameters -- per parameter, the sum of its values and the sum of their
absolute values -- and the replicas compare them with ONE small collective:
the vector ``[f, -f, s]`` (3 floats per parameter) all-reduced with MAX gives
``max f``, ``-min f`` and the largest scale ``s`` at once. A parameter whose
``max f - min f`` exceeds ``tolerance * s`` differs across replicas.

Correctly synchronised replicas hold bitwise-identical parameters (same
program, same reduced gradients), so their fingerprints are bitwise equal and
the spread is exactly 0. With Lightning's TPU bug (the all-reduce running
before the closure), the very first optimizer step already leaves each replica
with its own local gradient step, and the spread only grows from there.

Two ways to use it::

    # Lightning Trainer (pytorch_lightning or lightning.pytorch, 1.5 and later)
    from tpu_closure_fix import SyncCheck
    trainer = Trainer(..., callbacks=[SyncCheck()])          # every 100 steps, warn

    # Lite / Fabric / plain loops
    from tpu_closure_fix import check_sync
    for step, batch in enumerate(loader, 1):
        ...; optimizer.step(closure)
        check_sync(model, step)                                # acts when step % 100 == 0

Collective backend, picked at each check: torch_xla (``xm.all_reduce``) when
torch_xla is importable and its world size is > 1; else ``torch.distributed``
when it is initialised with a world size > 1; else nothing (one device: there
is nothing to compare, the check returns None at no cost).

Every replica must call the check at the same steps (it is a collective): the
callback keys on ``trainer.global_step``, which is the same on every replica.

Default frequency, ``DEFAULT_EVERY = 100``: a check costs one pass over the
parameters (a sum, an abs-sum), one collective of 3 floats per parameter tensor
and one device-to-host copy of that vector. On XLA that copy forces the pending
graph to run, so a check can cost up to about one extra step's synchronisation;
even in that worst case, once every 100 steps keeps it under 1 % of the
training time. The bug shows from the first step and never heals, so detecting
it within 100 steps loses nothing. See docs/synccheck.md for the measured
overhead (benchmarks/synccheck_overhead.py).
"""
import math
import sys
import warnings

from .config import TPUClosureFixWarning

DEFAULT_EVERY = 100
DEFAULT_TOLERANCE = 1e-6
ON_DIVERGENCE = ("warn", "raise")

__all__ = ["SyncCheck", "check_sync", "compare_replicas", "ReplicaDivergenceError", "SyncReport",
           "DEFAULT_EVERY", "DEFAULT_TOLERANCE"]


class ReplicaDivergenceError(RuntimeError):
    """Raised by SyncCheck / check_sync with ``on_divergence="raise"`` when replicas differ."""

    def __init__(self, message, report=None):
        super().__init__(message)
        self.report = report


class SyncReport(object):
    """The outcome of one cross-replica comparison.

    ``divergence[i]`` is ``(max f - min f) / s`` for parameter ``names[i]``
    (``f`` its sum over replicas' values, ``s`` the largest sum of absolute
    values), ``spread[i]`` the absolute ``max f - min f``.
    """

    def __init__(self, step, world_size, backend, names, spread, divergence, tolerance):
        self.step = step
        self.world_size = world_size
        self.backend = backend
        self.names = names
        self.spread = spread
        self.divergence = divergence
        self.tolerance = tolerance

    @property
    def worst_index(self):
        if not self.divergence:
            return None
        return max(range(len(self.divergence)), key=lambda i: self.divergence[i])

    @property
    def worst_parameter(self):
        i = self.worst_index
        return None if i is None else self.names[i]

    @property
    def max_divergence(self):
        return max(self.divergence) if self.divergence else 0.0

    @property
    def diverged_count(self):
        return sum(1 for d in self.divergence if d > self.tolerance)

    @property
    def diverged(self):
        return self.diverged_count > 0

    def message(self):
        i = self.worst_index
        return ("SyncCheck: data-parallel replicas hold different parameters at step %s: %d of %d parameter "
                "tensors differ across %d replicas; worst %r: fingerprint spread %.3g (relative divergence "
                "%.3g > tolerance %.3g). The gradients are not being all-reduced before the optimizer step "
                "(Lightning's TPU closure bug?): check that tpu-closure-fix is enabled "
                "(tpu_closure_fix.status(), TPU_CLOSURE_FIX)."
                % (self.step, self.diverged_count, len(self.divergence), self.world_size, self.names[i],
                   self.spread[i], self.divergence[i], self.tolerance))

    def as_dict(self):
        return {"step": self.step, "world_size": self.world_size, "backend": self.backend,
                "diverged": self.diverged, "diverged_count": self.diverged_count,
                "worst_parameter": self.worst_parameter, "max_divergence": self.max_divergence,
                "tolerance": self.tolerance}

    def __repr__(self):
        return "SyncReport(%r)" % (self.as_dict(),)


# --------------------------------------------------------------------------- backends
_NO_XLA = []  # set once an import of torch_xla failed: not retried at every check


def _xla_world():
    """(xla_model module, world size) when torch_xla is importable, else (None, 1)."""
    xm = sys.modules.get("torch_xla.core.xla_model")
    if xm is None:
        if _NO_XLA or ("torch_xla" in sys.modules and sys.modules["torch_xla"] is None):
            return None, 1
        try:
            import torch_xla.core.xla_model as xm
        except Exception:  # not installed, or installed but unusable here
            _NO_XLA.append(True)
            return None, 1
    size = None
    try:
        import torch_xla.runtime as xr  # torch_xla >= 2.1

        size = xr.world_size()
    except Exception:
        pass
    if size is None:
        fn = getattr(xm, "xrt_world_size", None) or getattr(xm, "world_size", None)
        try:
            size = fn() if fn is not None else 1
        except Exception:
            size = 1
    return xm, int(size)


def _backend():
    """('xla', xm, size) | ('torch.distributed', dist, size) | (None, None, 1)."""
    xm, size = _xla_world()
    if xm is not None and size > 1:
        return "xla", xm, size
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        size = dist.get_world_size()
        if size > 1:
            return "torch.distributed", dist, size
    return None, None, 1


def _all_reduce_max(kind, lib, vector):
    if kind == "xla":
        out = lib.all_reduce(lib.REDUCE_MAX, vector)
        return vector if out is None else out
    lib.all_reduce(vector, op=lib.ReduceOp.MAX)
    return vector


# --------------------------------------------------------------------------- core
def _named_parameters(model):
    """[(name, tensor)] from a module, a dict name->tensor, or an iterable of tensors / (name, tensor)."""
    if hasattr(model, "named_parameters"):
        return list(model.named_parameters())
    if isinstance(model, dict):
        return list(model.items())
    out = []
    for i, item in enumerate(model):
        if isinstance(item, tuple) and len(item) == 2:
            out.append(item)
        else:
            out.append(("param%d" % i, item))
    return out


def compare_replicas(model, step=None, tolerance=DEFAULT_TOLERANCE):
    """Run one comparison now (a collective: every replica must call it). Returns a SyncReport, or None
    on a single device / when there are no parameters."""
    kind, lib, size = _backend()
    if kind is None:
        return None
    named = _named_parameters(model)
    if not named:
        return None
    import torch

    with torch.no_grad():
        sums, scales = [], []
        for _, p in named:
            t = p.detach()
            if t.is_complex():
                t = torch.view_as_real(t)
            t = t.float()
            sums.append(t.sum())
            scales.append(t.abs().sum())
        device = sums[0].device
        f = torch.stack([v.to(device) for v in sums])
        vector = torch.cat([f, -f, torch.stack([v.to(device) for v in scales])])
        vector = _all_reduce_max(kind, lib, vector)
        values = vector.detach().cpu().tolist()
    n = len(named)
    spread, divergence = [], []
    for i in range(n):
        hi, neg_lo, scale = values[i], values[n + i], values[2 * n + i]
        d = hi + neg_lo  # max f - min f
        if not math.isfinite(d):
            # A NaN/inf on some replica: differs unless every replica has the same non-finite value.
            d = 0.0 if hi == -neg_lo else float("inf")
        spread.append(d)
        divergence.append(d / scale if scale > 0 else (0.0 if d == 0 else float("inf")))
    return SyncReport(step, size, kind, [name for name, _ in named], spread, divergence, tolerance)


def _act(report, on_divergence, stacklevel=3):
    if report is None or not report.diverged:
        return
    if on_divergence == "raise":
        raise ReplicaDivergenceError(report.message(), report)
    if callable(on_divergence):
        on_divergence(report)
        return
    warnings.warn(report.message(), TPUClosureFixWarning, stacklevel=stacklevel)


def _check_options(every, tolerance, on_divergence):
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ValueError("every must be a positive int (optimizer steps); got %r" % (every,))
    if not tolerance >= 0:
        raise ValueError("tolerance must be >= 0; got %r" % (tolerance,))
    if on_divergence not in ON_DIVERGENCE and not callable(on_divergence):
        raise ValueError("on_divergence must be 'warn', 'raise' or a callable(report); got %r" % (on_divergence,))


def check_sync(model, step, every=DEFAULT_EVERY, tolerance=DEFAULT_TOLERANCE, on_divergence="warn"):
    """For Lite / Fabric / plain loops: call after each optimizer step with the 1-based step count.

    When ``step % every == 0`` the replicas compare parameter fingerprints (one collective, so every
    replica must make the same calls); on divergence a TPUClosureFixWarning is issued (or
    ReplicaDivergenceError raised with ``on_divergence="raise"``, or ``on_divergence(report)`` called).
    Returns the SyncReport of a check, or None when no check ran (other steps, single device).
    """
    _check_options(every, tolerance, on_divergence)
    if step % every != 0:
        return None
    report = compare_replicas(model, step, tolerance)
    _act(report, on_divergence)
    return report


# --------------------------------------------------------------------------- Lightning callback
_classes = {}


def _callback_bases():
    """The base classes of the callback: the Lightning integration knows which trainers exist."""
    from .integrations.lightning import callback_bases

    return callback_bases()


class SyncCheck(object):
    """Lightning callback: compare parameter fingerprints across replicas every ``every`` optimizer steps.

    ``SyncCheck(every=100, tolerance=1e-6, on_divergence="warn", check_at_end=True)``; ``on_divergence``
    is ``"warn"`` (TPUClosureFixWarning), ``"raise"`` (ReplicaDivergenceError, stops training) or a
    callable receiving the SyncReport. ``reports`` keeps every check's SyncReport, ``last_report`` the
    latest. Instances are instances of the installed Lightning's ``Callback`` (a subclass is made on
    first use for whichever of pytorch_lightning / lightning.pytorch is imported).
    """

    def __new__(cls, *args, **kwargs):
        if cls is not SyncCheck:
            return super().__new__(cls)
        bases = _callback_bases()
        sub = _classes.get(bases)
        if sub is None:
            sub = type("SyncCheck", (SyncCheck,) + bases, {"__module__": __name__,
                                                           "__doc__": SyncCheck.__doc__})
            _classes[bases] = sub
        return super().__new__(sub)

    def __init__(self, every=DEFAULT_EVERY, tolerance=DEFAULT_TOLERANCE, on_divergence="warn", check_at_end=True):
        _check_options(every, tolerance, on_divergence)
        self.every = every
        self.tolerance = tolerance
        self.on_divergence = on_divergence
        self.check_at_end = check_at_end
        self.reports = []
        self._last_bucket = 0
        self._last_checked_step = None

    @property
    def last_report(self):
        return self.reports[-1] if self.reports else None

    def _check(self, trainer, pl_module, step):
        self._last_checked_step = step
        report = compare_replicas(pl_module, step, self.tolerance)
        if report is not None:
            self.reports.append(report)
        _act(report, self.on_divergence, stacklevel=4)

    def on_train_batch_end(self, trainer, pl_module, *args, **kwargs):
        step = int(trainer.global_step)
        bucket = step // self.every
        if bucket > self._last_bucket:  # crossed a multiple of ``every`` (global_step may jump by > 1)
            self._last_bucket = bucket
            self._check(trainer, pl_module, step)

    def on_train_end(self, trainer, pl_module):
        step = int(trainer.global_step)
        if self.check_at_end and step > 0 and step != self._last_checked_step:
            self._check(trainer, pl_module, step)

    def __reduce__(self):  # the class is made at run time: pickle (spawn launchers) through the factory
        return (SyncCheck, (self.every, self.tolerance, self.on_divergence, self.check_at_end))

    def __repr__(self):
        return "SyncCheck(every=%d, tolerance=%g, on_divergence=%r)" % (self.every, self.tolerance,
                                                                          self.on_divergence)

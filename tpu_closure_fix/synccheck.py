"""SyncCheck: catch data-parallel replicas that silently train different models.

Every ``every`` optimizer steps, each replica fingerprints its parameters
(:mod:`tpu_closure_fix.fingerprint`: per tensor, a 32-bit hash of its raw bits,
its count of non-finite values and its value sum; plus a digest of the model's
structure) into one fixed-length vector, and the replicas compare them with ONE
collective: a MAX all-reduce of ``[v, -v]`` gives every field's largest and
smallest value over the replicas at once. The outcome is one of:

* ``identical``: every parameter bitwise equal on every replica;
* ``differ``: some tensors' bits differ (named, with their value-sum spread as
  "by how much"; a sum-preserving difference has spread 0 and is still caught);
  a NaN/inf on some replicas only is a difference;
* ``structure``: the replicas hold different models (tensor count, shapes or
  dtypes), named in one message -- every replica still joins the same
  collective, a replica without parameters too, so nothing crashes or hangs;
* ``nonfinite``: NaN/inf parameters, bitwise the same everywhere: reported as
  such (a warning), not as a divergence;
* ``unverified``: no verdict possible (a replica could not fingerprint, the
  collective failed), warned about once.

Correctly synchronised replicas hold bitwise-identical parameters (same
program, same reduced gradients), so any bitwise difference is a divergence:
there is no tolerance (the ``tolerance`` parameter is accepted and recorded for
compatibility, and decides nothing). What could go unseen, and how likely: see
:mod:`tpu_closure_fix.fingerprint` (one changed word: never; several: about
2^-32 per tensor).

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
parameters (hash and sums), one collective of a fixed-length vector
(:func:`tpu_closure_fix.fingerprint.vector_length` floats) and one
device-to-host copy of it. On XLA that copy forces the pending graph to run, so
a check can cost up to about one extra step's synchronisation; even in that
worst case, once every 100 steps keeps it under 1 % of the training time. The
bug shows from the first step and never heals, so detecting it within 100 steps
loses nothing. See docs/synccheck.md for the measured overhead
(benchmarks/synccheck_overhead.py).
"""
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


#: The outcomes of a comparison. ``diverged`` is true for "differ" and "structure" only.
OUTCOMES = ("identical", "differ", "structure", "nonfinite", "unverified")
DIVERGED_OUTCOMES = ("differ", "structure")
#: How many tensor names a message lists before "and N more".
NAMES_IN_MESSAGE = 5


class SyncReport(object):
    """The outcome of one cross-replica comparison.

    ``outcome`` is one of :data:`OUTCOMES`: ``"identical"`` (every parameter bitwise equal on every
    replica), ``"differ"`` (``differing``: the indices of the tensors whose bits differ somewhere),
    ``"structure"`` (the replicas hold different models: ``structure`` says how), ``"nonfinite"``
    (NaN/inf parameters, bitwise the same on every replica: not a divergence) or ``"unverified"``
    (``reason``: why no verdict was possible). ``diverged`` is true for "differ" and "structure".

    For "by how much": ``spread[i]`` is ``max f - min f`` over the replicas of tensor ``names[i]``'s
    value sum ``f`` and ``divergence[i]`` that spread relative to the largest sum of absolute values.
    A sum-preserving difference (compensating changes, permuted rows) differs with a spread of 0.
    With more tensors than fingerprint slots, tensors sharing a slot share these figures.
    ``tolerance`` is recorded as given; it no longer decides anything (any bitwise difference is one).

    A report made from figures alone (no ``outcome``) says "differ" for the tensors whose spread or
    divergence is not 0, else "identical".
    """

    def __init__(self, step, world_size, backend, names, spread, divergence, tolerance, outcome=None,
                 differing=None, nonfinite=(), structure=None, reason=None):
        self.step = step
        self.world_size = world_size
        self.backend = backend
        self.names = names
        self.spread = spread
        self.divergence = divergence
        self.tolerance = tolerance
        if differing is None:
            differing = [i for i in range(len(names)) if spread[i] != 0 or divergence[i] != 0]
        if outcome is None:
            outcome = "differ" if differing else "identical"
        if outcome not in OUTCOMES:
            raise ValueError("outcome must be one of %s; got %r" % (", ".join(OUTCOMES), outcome))
        self.outcome = outcome
        self.differing = list(differing)
        self.nonfinite = list(nonfinite)
        self.structure = structure
        self.reason = reason

    @property
    def diverged(self):
        return self.outcome in DIVERGED_OUTCOMES

    @property
    def diverged_count(self):
        return len(self.differing)

    @property
    def worst_index(self):
        """The differing tensor with the largest relative divergence (None when none differs)."""
        if not self.differing:
            return None
        return max(self.differing, key=lambda i: (self.divergence[i], -i))

    @property
    def worst_parameter(self):
        i = self.worst_index
        return None if i is None else self.names[i]

    @property
    def max_divergence(self):
        return max(self.divergence) if self.divergence else 0.0

    def _listed(self, indices):
        shown = ", ".join(repr(self.names[i]) for i in indices[:NAMES_IN_MESSAGE])
        more = len(indices) - NAMES_IN_MESSAGE
        return shown + (" and %d more" % more if more > 0 else "")

    def message(self):
        if self.outcome == "structure":
            return ("SyncCheck: data-parallel replicas hold different models at step %s (%d replicas): %s. "
                    "Every replica must build the same model: the same parameter tensors, shapes and dtypes "
                    "in the same order." % (self.step, self.world_size, self.structure))
        if self.outcome == "nonfinite":
            return ("SyncCheck: parameters hold non-finite values (NaN/inf) at step %s, bitwise the same on "
                    "all %d replicas: the replicas agree (not a divergence), the training itself produced "
                    "them: %s." % (self.step, self.world_size, self._listed(self.nonfinite)))
        if self.outcome == "unverified":
            return "SyncCheck could not compare the replicas at step %s: %s." % (self.step, self.reason)
        if self.outcome == "identical":
            return ("SyncCheck: all %d parameter tensors bitwise identical on all %d replicas at step %s."
                    % (len(self.names), self.world_size, self.step))
        i = self.worst_index
        how = ("value-sum spread %.3g, relative divergence %.3g" % (self.spread[i], self.divergence[i])
               if self.spread[i] else "equal value sums (divergence 0): a sum-preserving difference, e.g. "
               "compensating changes, permuted rows or a change below the sum's rounding")
        extra = ""
        if self.nonfinite:
            extra = "; non-finite values on some replicas only, in %s" % self._listed(self.nonfinite)
        return ("SyncCheck: data-parallel replicas hold different parameters at step %s: %d of %d parameter "
                "tensors differ bitwise across %d replicas (%s); worst %r: %s%s. The replicas did not apply "
                "the same update (missing or misplaced gradient reduction?). Through Lightning, Lite/Fabric "
                "or accelerate on torch_xla, check that tpu-closure-fix is enabled (tpu_closure_fix.status(), "
                "TPU_CLOSURE_FIX)."
                % (self.step, self.diverged_count, len(self.names), self.world_size,
                   self._listed(self.differing), self.names[i], how, extra))

    def as_dict(self):
        return {"step": self.step, "world_size": self.world_size, "backend": self.backend,
                "outcome": self.outcome, "diverged": self.diverged, "diverged_count": self.diverged_count,
                "differing": [self.names[i] for i in self.differing],
                "nonfinite": [self.names[i] for i in self.nonfinite], "structure": self.structure,
                "reason": self.reason, "worst_parameter": self.worst_parameter,
                "max_divergence": self.max_divergence, "tolerance": self.tolerance}

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


def _vector_device(kind, lib, tensors):
    """Where the fingerprint vector goes for the collective: the XLA device for xm.all_reduce; the
    host for gloo (an XLA or other device tensor is copied there); the current GPU for nccl."""
    import torch

    if kind == "xla":
        torch_xla = sys.modules.get("torch_xla")
        device_fn = getattr(torch_xla, "device", None)  # torch_xla >= 2.5: xm.xla_device is deprecated
        return device_fn() if callable(device_fn) else lib.xla_device()
    backend = str(lib.get_backend())
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    if backend == "gloo" or not tensors:
        return torch.device("cpu")
    return tensors[0].device


def _local_vector(kind, lib, named):
    """(vector, error): this replica's fingerprint vector, or -- when fingerprinting failed -- the
    "could not fingerprint" vector and the error, so this replica still joins the collective."""
    from . import fingerprint

    device = None
    try:
        tensors = [t for _, t in named]
        device = _vector_device(kind, lib, tensors)
        return fingerprint.local_vector(tensors, device), None
    except Exception as exc:  # never leave the other replicas waiting in the collective
        return fingerprint.failed_vector(device), exc


def compare_replicas(model, step=None, tolerance=DEFAULT_TOLERANCE):
    """Run one comparison now (a collective: every replica must call it, with or without parameters).

    Returns a SyncReport (see its ``outcome``), or None on a single device (nothing to compare).
    ``tolerance`` is recorded in the report and decides nothing: any bitwise difference is reported.
    """
    kind, lib, size = _backend()
    if kind is None:
        return None
    import torch

    try:
        named = _named_parameters(model)
    except Exception as exc:
        named, listing_error = [], exc
    else:
        listing_error = None
    with torch.no_grad():
        vector, error = _local_vector(kind, lib, named)
        error = listing_error or error
        try:
            reduced = _all_reduce_max(kind, lib, vector).detach().cpu()
        except Exception as exc:
            return SyncReport(step, size, kind, [n for n, _ in named], [0.0] * len(named),
                              [0.0] * len(named), tolerance, outcome="unverified",
                              reason="the all-reduce of the fingerprints failed here: %s: %s"
                              % (type(exc).__name__, exc))
    return _verdict(step, size, kind, named, reduced, tolerance, error)


def _structure_mismatch(decoded, named, slots):
    """A sentence naming how the replicas' models differ, or None when they agree."""
    from . import fingerprint

    high, low = decoded["count"]
    parts = []
    if high != low:
        parts.append("the number of parameter tensors differs (%d on some replicas, %d on others; %d here)"
                     % (low, high, len(named)))
    shape = fingerprint.slots_differing(decoded, "shape_hi", "shape_lo")
    dtype = fingerprint.slots_differing(decoded, "dtype_hi", "dtype_lo")
    bad = (shape | dtype).nonzero().flatten().tolist()
    if bad:
        s = bad[0]
        what = " and ".join(w for w, mask in (("shape", shape), ("dtype", dtype)) if bool(mask[s]))
        if s < len(named):
            here_shape, here_dtype = fingerprint.describe(named[s][1])
            parts.append("parameter tensor #%d %r has another %s on some replica (here: shape %s, %s)"
                         % (s, named[s][0], what, here_shape, here_dtype))
        else:
            parts.append("parameter tensor #%d differs in %s (this replica has no tensor #%d)" % (s, what, s))
    if not parts and decoded["digest"][0] != decoded["digest"][1]:
        parts.append("the order of shapes/dtypes of the parameter tensors differs")
    return "; ".join(parts) or None


def _verdict(step, size, kind, named, reduced, tolerance, error):
    """The SyncReport of a MAX-reduced fingerprint vector (the same on every replica, apart from the
    local names it quotes)."""
    from . import fingerprint

    slots = fingerprint.SLOTS
    decoded = fingerprint.decode(reduced, slots)
    names = [n for n, _ in named]
    n = len(named)
    zeros = [0.0] * n
    if decoded["format"][0] != decoded["format"][1] or decoded["failed"][0] > 0:
        reason = ("fingerprinting the parameters failed here: %s: %s" % (type(error).__name__, error)
                  if error is not None else "another replica could not fingerprint its parameters"
                  if decoded["failed"][0] > 0 else "the replicas run different SyncCheck formats")
        return SyncReport(step, size, kind, names, zeros, zeros, tolerance, outcome="unverified", reason=reason)
    structure = _structure_mismatch(decoded, named, slots)
    if structure is not None:
        return SyncReport(step, size, kind, names, zeros, zeros, tolerance, outcome="structure", differing=[],
                          structure=structure)
    differs = fingerprint.slots_differing(decoded, "bits_hi", "bits_lo").tolist()
    nonfinite_high, nonfinite_low = (t.tolist() for t in decoded["nonfinite"])
    sum_high, sum_low = (t.double() for t in decoded["sum"])
    spreads = (sum_high - sum_low).tolist()
    scales = decoded["abs_sum"].tolist()
    spread, divergence, differing, nonfinite = [], [], [], []
    for i in range(n):
        s = i % slots
        d, scale = spreads[s], scales[s]
        if nonfinite_high[s] != nonfinite_low[s]:  # NaN/inf on some replicas only: no finite measure
            d = scale = float("inf")
        spread.append(d)
        divergence.append(float("inf") if d == float("inf") else
                          d / scale if scale > 0 else (0.0 if d == 0 else float("inf")))
        if differs[s]:
            differing.append(i)
        if nonfinite_high[s] > 0:
            nonfinite.append(i)
    if differing:
        outcome = "differ"
        # where bits differ, name the tensors with non-finite values on some replicas only
        nonfinite = [i for i in nonfinite if nonfinite_high[i % slots] != nonfinite_low[i % slots]
                     or nonfinite_low[i % slots] == 0]
    else:
        outcome = "nonfinite" if nonfinite else "identical"
    return SyncReport(step, size, kind, names, spread, divergence, tolerance, outcome=outcome,
                      differing=differing, nonfinite=nonfinite)


_warned_once = set()


def _act(report, on_divergence, stacklevel=3):
    """What a check does with its report: on divergence warn / raise / call ``on_divergence``; identical
    non-finite parameters are warned about (never raised: the replicas agree); an unverified check is
    warned about once per reason."""
    if report is None or report.outcome == "identical":
        return
    if report.outcome == "nonfinite":
        warnings.warn(report.message(), TPUClosureFixWarning, stacklevel=stacklevel)
        return
    if report.outcome == "unverified":
        if report.reason not in _warned_once:
            _warned_once.add(report.reason)
            warnings.warn(report.message(), TPUClosureFixWarning, stacklevel=stacklevel)
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
    callable receiving the SyncReport of a divergence; ``tolerance`` is recorded and decides nothing.
    ``reports`` keeps every check's SyncReport, ``last_report`` the latest. Instances are instances of the installed Lightning's ``Callback`` (a subclass is made on
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

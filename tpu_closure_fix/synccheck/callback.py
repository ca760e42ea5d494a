"""The Lightning callback: ``Trainer(callbacks=[SyncCheck()])``.

Checks when training starts (before any optimizer update), after the first optimizer step and then every
``every`` steps (keyed on ``trainer.global_step``, the same on every replica), and once more at the end of
training; logs each check's outcome through the
trainer's loggers (``sync_check/diverged``, ``sync_check/differing_tensors``, ``sync_check/unverified``).
An instance used for a second ``fit`` starts afresh.
"""
from . import comm, groups
from .compare import DEFAULT_EVERY, DEFAULT_TOLERANCE, Stream, check_options, due, run
from .report import SyncReport, act

_classes = {}


def _callback_bases():
    """The base classes of the callback: the Lightning integration knows which trainers exist."""
    from ..integrations.lightning import callback_bases

    return callback_bases()


class SyncCheck(object):
    """Lightning callback: compare parameter fingerprints across replicas when training starts, after the first
    optimizer step and then every ``every`` steps.

    ``SyncCheck(every=100, tolerance=1e-6, on_divergence="warn", check_at_end=True)``; ``on_divergence``
    is ``"warn"`` (rank 0 says it on the ``tpu_closure_fix.synccheck`` logger), ``"raise"`` (every rank raises
    ReplicaDivergenceError at the same check) or a callable receiving the SyncReport of a divergence;
    ``tolerance`` is recorded and decides nothing; ``replicas``: over which ranks the parameters are compared
    (``"auto"``, the default: as the job's layout places them, every parameter no layout places over the whole
    world -- adding the callback declares them replicas; ``"world"``; a process group or a list of rank
    lists: see ``compare_replicas``). Reports name the LightningModule's class (``report.stream``).
    ``reports`` keeps every check's SyncReport of the current ``fit``, ``last_report`` the latest. Instances
    are instances of the installed Lightning's ``Callback`` (a subclass is made on first use for whichever of
    pytorch_lightning / lightning.pytorch is imported).
    """

    def __new__(cls, *args, **kwargs):
        if cls is not SyncCheck:
            return super().__new__(cls)
        bases = _callback_bases()
        sub = _classes.get(bases)
        if sub is None:
            sub = type("SyncCheck", (SyncCheck,) + bases, {"__module__": __name__, "__doc__": SyncCheck.__doc__})
            _classes[bases] = sub
        return super().__new__(sub)

    def __init__(self, every=DEFAULT_EVERY, tolerance=DEFAULT_TOLERANCE, on_divergence="warn", check_at_end=True,
                 replicas=groups.AUTO):
        check_options(every, tolerance, on_divergence)
        groups.check_replicas(replicas)
        self.replicas = replicas
        self.every = every
        self.tolerance = tolerance
        self.on_divergence = on_divergence
        self.check_at_end = check_at_end
        self._fits = 0
        self._start()

    def _start(self):
        """A fresh history: at construction and at the start of every ``fit``."""
        self.reports = []
        self._stream = Stream("callback/%d" % self._fits, getattr(self, "replicas", groups.AUTO))
        self._last_due = 0  # the step of the schedule's last check (0: none yet)
        self._last_checked_step = None

    @property
    def last_report(self):
        return self.reports[-1] if self.reports else None

    def on_fit_start(self, trainer, pl_module):
        self._fits += 1
        self._start()

    def on_train_start(self, trainer, pl_module):
        """The first check, before any optimizer update: a difference here is how the replicas started."""
        self._check(trainer, pl_module, int(trainer.global_step))

    def _check(self, trainer, pl_module, step):
        self._last_checked_step = step
        channel = comm.channel()
        if channel is None or self._stream.stood_down:
            return
        self._stream.label = _label(pl_module)  # the reports name it, built complete
        try:
            report = run(pl_module, step, self._stream, tolerance=self.tolerance, channel=channel)
        except comm.StoodDown as exc:
            self._stream.stood_down = str(exc)
            report = SyncReport(step, channel.size, channel.kind, [], tolerance=self.tolerance,
                                outcome="unverified", reason=str(exc), stream=self._stream.label)
        self.reports.append(report)
        _log_metrics(trainer, report, step)
        act(report, self.on_divergence, rank=channel.rank, stream=self._stream)

    def on_train_batch_end(self, trainer, pl_module, *args, **kwargs):
        step = int(trainer.global_step)
        if step < 1:
            return
        # a global step may pass a multiple of every (several optimizers per batch): the first step past it is due
        if step != self._last_checked_step and due(step, self.every, self._last_due):
            self._last_due = step
            self._check(trainer, pl_module, step)

    def on_train_end(self, trainer, pl_module):
        step = int(trainer.global_step)
        if self.check_at_end and step > 0 and step != self._last_checked_step:
            self._check(trainer, pl_module, step)

    def __reduce__(self):  # the class is made at run time: pickle (spawn launchers) through the factory
        return (SyncCheck, (self.every, self.tolerance, self.on_divergence, self.check_at_end, self.replicas))

    def __repr__(self):
        return "SyncCheck(every=%d, tolerance=%g, on_divergence=%r)" % (self.every, self.tolerance,
                                                                          self.on_divergence)


def _label(pl_module):
    """What the callback compares, as the user knows it: the LightningModule's class."""
    return type(pl_module).__name__ if pl_module is not None else None


def _log_metrics(trainer, report, step):
    """The outcome as metrics through the trainer's loggers (Lightning's loggers write on rank 0 only)."""
    loggers = list(getattr(trainer, "loggers", None) or [])
    if not loggers and getattr(trainer, "logger", None) is not None:
        loggers = [trainer.logger]
    for logger in loggers:
        try:
            logger.log_metrics(report.metrics(), step=step)
        except Exception:  # a logger that refuses is no reason to stop training
            pass

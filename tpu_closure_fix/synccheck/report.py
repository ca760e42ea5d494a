"""What a check says: the :class:`SyncReport`, its one message, and the one path every report takes.

One report per check for the whole job: every rank reaches the same verdict (it is read from the same
reduced vector), rank 0 says it, every other rank logs it at debug level only; with
``on_divergence="raise"`` every rank raises at the same check. A check that stands down (a peer gone, a
timeout, a failed fingerprint) is said once per reason by each rank that stood down: it cannot know whether
rank 0 can still speak.

Every report -- divergence, structure, set-aside note, stand-down, a bad setting of the check -- goes out
through :func:`say`, on the ``tpu_closure_fix.synccheck`` logger, never through ``warnings``: a script's
``warnings.filterwarnings("ignore")``, ``PYTHONWARNINGS=ignore`` or ``-W ignore`` cannot mute it. With no
logging configured, Python's last-resort handler writes it to stderr; where logging is configured (the
root's handlers, Lightning's, accelerate's), it goes through those handlers, once. Its record points at the
user's line that stepped (``pathname``/``lineno``), and its text starts with that ``file:line``. A report is
at WARNING level, whatever the root logger's threshold: only ``TPU_CLOSURE_FIX_LOG`` (or the
``tpu_closure_fix`` loggers' own level) raises or lowers it.
"""
import logging
import os
import sys

from .groups import APART as _APART

logger = logging.getLogger("tpu_closure_fix.synccheck")
#: The package's logger, whose level ``TPU_CLOSURE_FIX_LOG`` sets.
PACKAGE_LOGGER = "tpu_closure_fix"
#: After a divergence said in full, the same tensors differing on the same ranks are said again in one short
#: line at every this many checks; a change (other tensors, other ranks) is said in full at once.
REPEAT_EVERY = 10
#: Top-level packages whose frames a report's location skips, besides this package and every integration's
#: packages (the frameworks and torch_xla: ``sites.top_level_packages()``).
LIBRARY_PACKAGES = ("torch", "wrapt", "logging")

#: The outcomes of a comparison. ``diverged`` is true for "differ" and "structure" only.
OUTCOMES = ("identical", "differ", "structure", "nonfinite", "out_of_step", "unverified")
DIVERGED_OUTCOMES = ("differ", "structure")
#: How many tensor names a message lists before "and N more".
NAMES_IN_MESSAGE = 5


class ReplicaDivergenceError(RuntimeError):
    """Raised by SyncCheck / check_sync / the zero-code check with ``on_divergence="raise"``."""

    def __init__(self, message, report=None):
        super().__init__(message)
        self.report = report


def rank_ranges(ranks):
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``."""
    ranks = sorted(set(int(r) for r in ranks))
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else "%d-%d" % (start, r))
            start = None
    return ", ".join(parts)


def apart_note(step, names):
    """What a difference at a tensor's first look means when no data-parallel layout is declared."""
    when = ("before the first update" if step == 0 else "at the first check" if step is None
            else "at the first check (step %s)" % (step,))
    count = len(names)
    shown = ", ".join(repr(n) for n in names[:NAMES_IN_MESSAGE])
    shown += " and %d more" % (count - NAMES_IN_MESSAGE) if count > NAMES_IN_MESSAGE else ""
    return ("%d parameter tensor%s %s (%s): replicas that started different, or tensors that are not replicas by "
            "design (a rank-local value, pipeline stages, optimizer-state or parameter shards); no data-parallel "
            "layout is declared, so %s set aside and not compared again; every other tensor stays compared (if "
            "they are replicas, declare it: TPU_CLOSURE_FIX_SYNC_CHECK_GROUP=world)"
            % (count, " differs" if count == 1 else "s differ", when, shown, "it is" if count == 1 else "they are"))


def _at(step):
    return "this check" if step is None else "step %s" % (step,)


class SyncReport(object):
    """The outcome of one cross-replica comparison.

    ``outcome`` is one of :data:`OUTCOMES`. ``names``: the compared tensors in order; ``differing``:
    indices into ``names`` of the tensors whose bits differ between replicas that must hold them equal
    (exact, however many tensors); ``versions``: for a difference, the ranks grouped by the version they
    hold of the first differing tensor (largest group first); ``first_check``: this was the first check of its
    stream (step 0: before any optimizer update); ``identical_at``: the last step at which the same stream
    compared identical (None: never, or no history kept for the object); ``different_since``: the first
    check since then that found a difference (the replicas stay apart once apart);
    ``spread[i]``/``divergence[i]``: tensor ``names[i]``'s value-sum spread over the replicas and that
    relative to its sum of absolute values (known for the differing tensors; 0 elsewhere);
    ``not_compared``: ``[(name, reason)]``; ``reason``: why no verdict (unverified, out of step);
    ``local_error``: this replica's own listing or fingerprint failed (the reason is its error);
    ``group``: the ranks of the replica group in which the first difference was seen; ``rule``: the
    first-check rule this check decided for the tensors no layout places (``"world"``: equal there, compared
    over the world from now on; ``"apart"``: different there, not compared again; None: nothing decided);
    ``stream``: what the check compared as the user knows it (the zero-code check: the optimizer's class and
    its parameters' module paths), or None; ``set_aside``: the names this check set aside (different at their
    first look, nothing declared) and ``note``: the one sentence saying so (None: none); ``seen_equal``: a
    differing tensor was seen bitwise equal at an earlier check (of another optimizer: the zero-code check);
    ``in_sync``: the field
    a gate reads (true only when every compared tensor matched and nothing was set aside).
    ``tolerance`` is recorded and decides nothing: any bitwise difference is one.
    """

    def __init__(self, step, world_size, backend, names, spread=None, divergence=None, tolerance=0.0,
                 outcome="identical", differing=(), nonfinite=(), structure=None, reason=None, versions=(),
                 first_check=False, identical_at=None, not_compared=(), local_error=False, group=(), rule=None,
                 stream=None, set_aside=(), seen_equal=False, different_since=None):
        if outcome not in OUTCOMES:
            raise ValueError("outcome must be one of %s; got %r" % (", ".join(OUTCOMES), outcome))
        self.step = step
        self.world_size = world_size
        self.backend = backend
        self.names = list(names)
        self.spread = list(spread) if spread is not None else [0.0] * len(self.names)
        self.divergence = list(divergence) if divergence is not None else [0.0] * len(self.names)
        self.tolerance = tolerance
        self.outcome = outcome
        self.differing = list(differing)
        self.nonfinite = list(nonfinite)
        self.structure = structure
        self._reason = reason
        self.versions = [list(v) for v in versions]
        self.first_check = first_check
        self.identical_at = identical_at
        diverged = outcome in DIVERGED_OUTCOMES
        self.different_since = (step if different_since is None else different_since) if diverged else None
        self.not_compared = list(not_compared)
        self.local_error = local_error
        self.group = list(group)
        self.rule = rule
        self.stream = stream
        self.set_aside = list(set_aside)
        self.seen_equal = seen_equal

    @property
    def reason(self):
        """Why no verdict: the cause given, else (every tensor set aside now) the set-aside note."""
        return self._reason if self._reason is not None else self.note

    @reason.setter
    def reason(self, value):
        self._reason = value

    @property
    def note(self):
        """The one sentence saying which tensors this check set aside (``set_aside``, as named now), or None."""
        return apart_note(self.step, self.set_aside) if self.set_aside else None

    @property
    def diverged(self):
        return self.outcome in DIVERGED_OUTCOMES

    @property
    def in_sync(self):
        """The one field a gate reads: True only when the check compared something, every compared tensor
        matched bitwise over its replica group (the same NaN/inf everywhere included), and no tensor was set
        aside by the first-check rule. False for a divergence, and for any check that could not say."""
        apart = any(reason == _APART for _, reason in self.not_compared)
        return self.outcome in ("identical", "nonfinite") and self.compared_count > 0 and not apart

    @property
    def compared_count(self):
        """How many of ``names`` were compared (the rest are listed in ``not_compared``)."""
        left_out = set(name for name, _ in self.not_compared)
        return sum(1 for name in self.names if name not in left_out)

    @property
    def diverged_count(self):
        return len(self.differing)

    @property
    def started_different(self):
        """The replicas differed before any optimizer update (a first check at step 0) of tensors never seen
        equal: they started different -- initialisation, seeding, loading -- rather than diverging through
        training."""
        return self.diverged and self.first_check and self.step == 0 and not self.seen_equal

    @property
    def worst_index(self):
        if not self.differing:
            return None
        return max(self.differing, key=lambda i: (self.divergence[i], -i))

    @property
    def worst_parameter(self):
        i = self.worst_index
        return None if i is None else self.names[i]

    @property
    def max_divergence(self):
        return max([self.divergence[i] for i in self.differing] or [0.0])

    def _listed(self, indices):
        shown = ", ".join(repr(self.names[i]) for i in indices[:NAMES_IN_MESSAGE])
        more = len(indices) - NAMES_IN_MESSAGE
        return shown + (" and %d more" % more if more > 0 else "")

    def _when(self):
        if self.different_since is not None and self.different_since != self.step:
            before = ("; identical before the first optimizer step" if self.identical_at == 0 else
                      "; identical at step %s" % self.identical_at if self.identical_at is not None else "")
            return "at step %s, different since step %s%s" % (self.step, self.different_since, before)
        if self.first_check and self.seen_equal:
            return ("at %s, the first check of this optimizer: tensors seen bitwise equal at an earlier check (of "
                    "another optimizer over them) differ now, so the replicas diverged since" % _at(self.step))
        if self.first_check and self.step == 0:
            return ("before the first optimizer step: the replicas started different (initialisation, seeding "
                    "or loading differs between them)")
        if self.first_check:
            return ("at %s, the first check (the replicas started different or diverged by then)" % _at(self.step))
        if self.identical_at == 0:
            return "between the start (identical before the first optimizer step) and step %s" % (self.step,)
        if self.identical_at is not None:
            return "between step %s (identical) and step %s" % (self.identical_at, self.step)
        return "at %s" % _at(self.step)

    def _versions(self):
        if len(self.versions) < 2:
            return ""
        parts = ["%s %s %s" % ("ranks" if len(v) > 1 else "rank", rank_ranges(v), ("hold" if len(v) > 1 else "holds")
                                + (" one version" if i == 0 else " another"))
                 for i, v in enumerate(self.versions)]
        within = ""
        if self.group and len(self.group) < self.world_size:
            within = "in the replica group of ranks %s: " % rank_ranges(self.group)
        return " (%s%s)" % (within, "; ".join(parts))

    def _of(self):
        """What the check compared, when known: `` of Adam over generator.fc.weight, ...`` (else nothing)."""
        return " of %s" % self.stream if self.stream else ""

    def _not_compared_note(self):
        if not self.not_compared:
            return ""
        name, reason = self.not_compared[0]
        return "; %d parameter tensor%s not compared (%r: %s)" % (
            len(self.not_compared), "" if len(self.not_compared) == 1 else "s", name, reason)

    def message(self):
        if self.outcome == "out_of_step":
            return ("SyncCheck: the replicas%s reached this check at different steps (%s); the check stands down "
                    "rather than compare different steps." % (self._of(), self.reason))
        if self.outcome == "unverified":
            return "SyncCheck could not compare the replicas%s at %s: %s%s." % (self._of(), _at(self.step),
                                                                                self.reason, self._not_compared_note())
        if self.outcome == "structure":
            return ("SyncCheck: data-parallel replicas hold different models%s %s (%d replicas): %s. Every replica "
                    "must build the same model: the same parameter tensors, shapes and dtypes in the same order."
                    % (self._of(), self._when(), self.world_size, self.structure))
        if self.outcome == "nonfinite":
            return ("SyncCheck: parameters%s hold non-finite values (NaN/inf) at %s, bitwise the same on "
                    "all %d replicas: the replicas agree (not a divergence), the training itself produced "
                    "them: %s." % (self._of(), _at(self.step), self.world_size, self._listed(self.nonfinite)))
        if self.outcome == "identical":
            return ("SyncCheck: all %d parameter tensors%s bitwise identical on all %d replicas at %s%s."
                    % (self.compared_count, self._of(), self.world_size, _at(self.step), self._not_compared_note()))
        i = self.worst_index
        how = ("value-sum spread %.3g, relative divergence %.3g" % (self.spread[i], self.divergence[i])
               if self.spread[i] else "equal value sums: a sum-preserving difference, e.g. compensating "
               "changes, permuted rows or a change below the sum's rounding")
        extra = ""
        if self.nonfinite:
            extra = "; non-finite values on some replicas only, in %s" % self._listed(self.nonfinite)
        return ("SyncCheck: data-parallel replicas hold different parameters %s: %d of %d parameter tensors%s "
                "differ bitwise across %d replicas%s: %s; worst %r: %s%s. %s"
                % (self._when(), self.diverged_count, self.compared_count, self._of(), self.world_size,
                   self._versions(),
                   self._listed(self.differing), self.names[i], how, extra, self._next_step()))

    def _next_step(self):
        """What to look at: before any update, only how the replicas were made differs (no gradient was
        reduced yet); after updates, the reduction of the gradients."""
        if self.started_different:
            return ("Build the model from the same seed on every replica, or load or broadcast the same weights to "
                    "every replica, before the first optimizer step.")
        return ("The replicas did not apply the same update (missing or misplaced gradient reduction?). Through "
                "Lightning, Lite/Fabric or accelerate on torch_xla, check that tpu-closure-fix is enabled "
                "(tpu-closure-fix status, TPU_CLOSURE_FIX).")

    def metrics(self):
        """Numbers for a training logger (the Lightning callback logs them)."""
        return {"sync_check/diverged": float(self.diverged), "sync_check/differing_tensors":
                float(self.diverged_count), "sync_check/unverified": float(self.outcome in ("unverified",
                                                                                          "out_of_step"))}

    def as_dict(self):
        return {"step": self.step, "world_size": self.world_size, "backend": self.backend,
                "outcome": self.outcome, "diverged": self.diverged, "diverged_count": self.diverged_count,
                "differing": [self.names[i] for i in self.differing],
                "nonfinite": [self.names[i] for i in self.nonfinite], "structure": self.structure,
                "reason": self.reason, "worst_parameter": self.worst_parameter,
                "max_divergence": self.max_divergence, "tolerance": self.tolerance,
                "versions": self.versions,
                "first_check": self.first_check, "started_different": self.started_different,
                "identical_at": self.identical_at, "different_since": self.different_since,
                "not_compared": [list(p) for p in self.not_compared], "group": self.group, "rule": self.rule,
                "stream": self.stream, "set_aside": self.set_aside, "note": self.note, "in_sync": self.in_sync,
                "seen_equal": self.seen_equal}

    def __repr__(self):
        return "SyncReport(%r)" % (self.as_dict(),)


# --------------------------------------------------------------------------- the one path of every report
def _enabled(level):
    """Whether a record at ``level`` goes out: the ``tpu_closure_fix`` loggers' own level when one is set
    (``TPU_CLOSURE_FIX_LOG``), else WARNING -- never the root logger's threshold, which a script may raise to
    quiet its libraries. ``logging.disable`` and a disabled logger are honoured."""
    if logger.disabled or logging.root.manager.disable >= level:
        return False
    threshold = logger.level or logging.getLogger(PACKAGE_LOGGER).level or logging.WARNING
    return level >= threshold


def say(message, where=None, speaker=True, level=logging.WARNING):
    """Deliver one report: at ``level`` (WARNING) by the rank that speaks, at DEBUG by the others. ``where``:
    ``(filename, lineno, ...)`` of the user's line it is about (captured on the training thread; default: the
    first frame outside this package and the libraries, now; empty: about no line). The record's
    ``sync_check_message`` holds the message alone."""
    level = level if speaker else logging.DEBUG
    if not _enabled(level):
        return
    where = user_location(1) if where is None else where
    if where:
        filename, lineno = where[:2]
        record = logger.makeRecord(logger.name, level, filename, lineno, "%s:%s: %s", (filename, lineno, message),
                                   None, extra={"sync_check_message": message})
    else:  # about no line of the user's (the job's end)
        record = logger.makeRecord(logger.name, level, "", 0, "%s", (message,), None,
                                   extra={"sync_check_message": message})
    logger.handle(record)
    if not _handled(logger) and logging.lastResort is not None and level >= logging.lastResort.level:
        logging.lastResort.handle(record)  # nothing configured: stderr, as Python's logging does


def _handled(start):
    """Whether a handler other than a ``NullHandler`` receives records of ``start``. The package's logger holds a
    ``NullHandler`` (the shim's own log stays quiet unless asked for), which would keep Python's last-resort
    handler from writing a report to stderr where no logging is configured."""
    current = start
    while current is not None:
        if any(not isinstance(handler, logging.NullHandler) for handler in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


def info(message, rank):
    """One line at INFO level for the whole job (rank 0; the others at DEBUG): ``TPU_CLOSURE_FIX_LOG=info``."""
    level = logging.INFO if rank == 0 else logging.DEBUG
    if _enabled(level):
        logger.log(level, "%s", message)


def user_location(skip=0):
    """``(filename, lineno, module)`` of the first frame on this thread outside this package, torch, wrapt, the
    frameworks and the logging machinery (``skip``: frames of the caller's own to pass first)."""
    prefixes = library_dirs()
    first = frame = sys._getframe(1 + skip)
    while frame is not None and code_path(frame.f_code.co_filename).startswith(prefixes):
        frame = frame.f_back
    frame = frame or first
    return frame.f_code.co_filename, frame.f_lineno, frame.f_globals.get("__name__", "__main__")


_library_dirs = {}  # the library modules' files -> the folders library_dirs() gives for them
_library_names = []  # the library modules' names, listed at the first call


def library_dirs():
    """The folders whose frames are not the user's, as a tuple: this package's and the libraries'. Read again
    only when the library modules imported change (a check reads them at every step it checks)."""
    if not _library_names:  # the integrations' packages are the same for the process's life
        from ..sites import top_level_packages

        _library_names.extend(LIBRARY_PACKAGES + tuple(sorted(top_level_packages())))
    files = tuple(getattr(sys.modules.get(name), "__file__", None) for name in _library_names)
    dirs = _library_dirs.get(files)
    if dirs is None:
        own = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
        dirs = _library_dirs[files] = (own,) + tuple(os.path.dirname(os.path.abspath(path)) + os.sep
                                                     for path in files if path)
    return dirs


_code_paths = {}  # a code object's absolute file name -> its normalized path
#: Absolute file names whose normalized path is kept, at most (a program runs code from a bounded set of files).
MAX_CODE_PATHS = 4096


def code_path(filename):
    """``os.path.abspath(filename)``, kept for an absolute ``filename`` (its path never changes; a relative
    one is read against the working directory of the moment, so it is not kept)."""
    path = _code_paths.get(filename)
    if path is None:
        path = os.path.abspath(filename)
        if os.path.isabs(filename) and len(_code_paths) < MAX_CODE_PATHS:
            _code_paths[filename] = path
    return path


def summary(report):
    """A check's outcome in a few words, for its info line (the report, if any, says the rest)."""
    if report.outcome in ("identical", "nonfinite"):
        # never "identical" about a tensor it did not compare
        count = len(report.not_compared)
        left_out = " (%d tensor%s not compared)" % (count, "" if count == 1 else "s") if count else ""
        return ("identical" if report.outcome == "identical" else "identical, with non-finite values") + left_out
    if report.outcome == "structure":
        return "DIFFERENT (the replicas hold different models)"
    if report.diverged:
        return "DIFFERENT (%d of %d tensors)" % (report.diverged_count, report.compared_count)
    return "not compared (%s)" % report.outcome.replace("_", " ")


def info_line(report, held=None):
    """``sync check of SGD over fc.weight, fc.bias at step 100: identical over ranks 0-3, 3.1 ms``."""
    of = " of %s" % report.stream if report.stream else ""
    return "sync check%s at step %s: %s over ranks %s%s" % (
        of, report.step, summary(report), rank_ranges(range(report.world_size)),
        "" if held is None else ", %.1f ms" % (held * 1000.0))


def repeat_of(stream, report):
    """Whether a divergence is said in full (None), in one short line (a string), or not at all (""): after a
    full report, the same tensors differing on the same ranks are said in one line at every
    :data:`REPEAT_EVERY`-th such check; other tensors or other ranks are said in full again."""
    if stream is None or stream.checks < 0:
        return None
    seen = (report.outcome, tuple(report.names[i] for i in report.differing), tuple(tuple(v) for v in report.versions),
            report.structure)
    said = stream.said
    if said is None or said["seen"] != seen:
        stream.said = {"seen": seen, "step": report.step, "repeats": 0}
        return None
    said["repeats"] += 1
    if said["repeats"] % REPEAT_EVERY:
        return ""
    return ("SyncCheck: at step %s the replicas%s still differ as said at step %s (%s, the same ranks; %d checks "
            "since)." % (report.step, report._of(), said["step"],
                         "the replicas hold different models" if report.outcome == "structure" else
                         "%d of %d parameter tensors" % (report.diverged_count, report.compared_count),
                         said["repeats"]))


_said_once = set()


def say_once(key, message, speaker=True, where=None):
    """:func:`say` ``message`` unless ``key`` was said already by a rank in this process that speaks alike."""
    key = (key, speaker)  # a silent rank saying it first must not silence the rank that speaks
    if key in _said_once:
        return
    _said_once.add(key)
    say(message, where, speaker)


def stood_down(label, step, reason, key, where=None):
    """The zero-code check of the optimizer ``label`` stands down at ``step`` for ``reason``: said once per
    ``key``."""
    say_once(key, "tpu-closure-fix: the zero-code sync check stands down for %s at step %d: %s. Training goes on."
             % (label, step, reason), where=where)


def agreed_raise(report, raise_at, rank, where=None, held=None):
    """The ranks agreed to raise ``report``'s divergence at optimizer step ``raise_at``: its info line, and the
    divergence said now (the training may end before that step), by rank 0 (the others at debug level)."""
    info(info_line(report, held), rank)
    say("%s Every rank raises ReplicaDivergenceError at its optimizer step %d." % (report.message(), raise_at),
        where, speaker=rank == 0)


def learnt_late(raise_at, passed, rank, where=None):
    """This rank learnt the step every rank raises at (``raise_at``) after its training went past it (up to
    ``passed``): said by this rank whatever its number, as it alone knows it, and before it raises at its next step
    -- ranks that raised no longer enter the collectives it may wait in meanwhile."""
    say("tpu-closure-fix: rank %d learnt the optimizer step every rank raises at (%d) when its training had passed "
        "it (at step %d): it raises at its next step. Ranks that raised at step %d no longer enter collectives with "
        "it: if it waits in one, that is why." % (rank, raise_at, passed, raise_at), where, speaker=True)


def act(report, on_divergence, rank=0, where=None, stream=None, held=None):
    """What a check does with its report: the info line (rank 0); a set-aside note once; on divergence rank 0
    says it (the others log at debug level; the same divergence again: :func:`repeat_of`), every rank raises
    with ``"raise"``, or ``on_divergence(report)`` is called on every rank; identical non-finite parameters are
    said the same way (never raised: the replicas agree); an unverified or out-of-step check is said once per
    reason, by rank 0 and by a rank whose own listing or fingerprint failed (it alone knows the error)."""
    if report is None:
        return
    info(info_line(report, held), rank)
    speaker = rank == 0
    if report.note and report.outcome != "unverified":  # an unverified report's reason is that note
        say_once(("note", report.note), "SyncCheck: %s." % report.note, speaker, where)
    if report.outcome == "identical":
        return
    if report.outcome in ("unverified", "out_of_step"):
        speaker = bool(speaker or report.local_error)
        say_once((report.outcome, report.reason, report._not_compared_note()), report.message(), speaker, where)
        return
    if report.outcome == "nonfinite":
        say(report.message(), where, speaker)
        return
    if on_divergence == "raise":
        raise ReplicaDivergenceError(report.message(), report)
    if callable(on_divergence):
        on_divergence(report)
        return
    repeat = repeat_of(stream, report)
    if repeat is None:
        say(report.message(), where, speaker)
    elif repeat:
        say(repeat, where, speaker)

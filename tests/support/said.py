"""What SyncCheck said: the records of its logger (``tpu_closure_fix.synccheck``), captured by a handler as a
user's logging configuration would receive them.

``with said() as heard:`` adds the handler for the block and lets DEBUG records through (the ranks that do not
speak log their reports at DEBUG); ``heard.spoken`` are the messages said at WARNING or above (what a user sees),
``heard.quiet`` those at DEBUG, ``heard.infos`` those at INFO. ``fresh()`` forgets what was said once per
process, so a test sees its own once-only messages.
"""
import contextlib
import logging
import re

LOGGER = "tpu_closure_fix.synccheck"


class Heard(logging.Handler):
    def __init__(self):
        logging.Handler.__init__(self, logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)

    @staticmethod
    def text(record):
        return getattr(record, "sync_check_message", None) or record.getMessage()

    def at(self, low, high=logging.CRITICAL):
        return [self.text(r) for r in self.records if low <= r.levelno <= high]

    @property
    def spoken(self):
        return self.at(logging.WARNING)

    @property
    def infos(self):
        return self.at(logging.INFO, logging.INFO)

    @property
    def quiet(self):
        return self.at(logging.DEBUG, logging.DEBUG)


@contextlib.contextmanager
def said(level=logging.DEBUG):
    logger = logging.getLogger(LOGGER)
    heard, previous = Heard(), logger.level
    logger.addHandler(heard)
    logger.setLevel(level)
    try:
        yield heard
    finally:
        logger.removeHandler(heard)
        logger.setLevel(previous)


def fresh():
    """Forget the reports said once per process (a run before this test may have said them)."""
    from tpu_closure_fix import settings
    from tpu_closure_fix.synccheck import report

    report._said_once.clear()
    settings._said.clear()


class Spoken(object):
    """One report said at WARNING or above, as the user's handler got it: ``message`` (the report alone),
    ``filename``/``lineno`` (the user's line it points at), ``levelno``."""

    def __init__(self, record):
        self.message = Heard.text(record)
        self.filename, self.lineno, self.levelno = record.pathname, record.lineno, record.levelno

    def __repr__(self):
        return "Spoken(%r at %s:%s)" % (self.message, self.filename, self.lineno)


@contextlib.contextmanager
def spoken():
    """A list, filled while the block runs, of every report said at WARNING or above (:class:`Spoken`)."""
    out = []
    with said() as heard:
        yield out
        out.extend(Spoken(r) for r in heard.records if r.levelno >= logging.WARNING)


class _Recorder(logging.Handler):
    """Appends each report said at WARNING or above to ``seen`` as ``{"message", "category", "filename",
    "lineno"}`` (``category``: the record's level name): a child process writes them into its JSON result."""

    def __init__(self, seen):
        logging.Handler.__init__(self, logging.WARNING)
        self.seen = seen

    def emit(self, record):
        self.seen.append({"message": Heard.text(record), "category": record.levelname,
                          "filename": record.pathname, "lineno": record.lineno})


def record_into(seen):
    """Record every SyncCheck report said at WARNING or above into the list ``seen`` (a child's harness).

    A handler on the logger means Python's last-resort handler no longer writes the reports to stderr: a test
    of what reaches stderr runs its child without this recorder."""
    logging.getLogger(LOGGER).addHandler(_Recorder(seen))
    return seen


#: The words a ReplicaDivergenceError raised at an agreed step ends with: at that step, or, where the rank learnt
#: the step only after passing it, at its next step naming both (docs/synccheck.md, ``on_divergence="raise"``).
RAISED = re.compile(r"Raised at optimizer step (\d+)(?:, the step every rank agreed on\.|: the ranks agreed on step "
                    r"(\d+), which this rank had passed when it learnt it\.)")


def raised_steps(text):
    """``(step raised at, step the ranks agreed on)`` from a ReplicaDivergenceError's words, or None."""
    found = RAISED.search(text or "")
    if found is None:
        return None
    at = int(found.group(1))
    return at, int(found.group(2)) if found.group(2) else at


def assert_raised_together(texts):
    """The ranks' errors (``texts``) name one agreed step; each rank raised at it, or after it where it learnt it
    late. Returns each rank's ``(raised at, agreed)``."""
    steps = [raised_steps(text) for text in texts]
    assert all(steps), texts
    assert len(set(agreed for _, agreed in steps)) == 1, steps
    assert all(at > agreed or "every rank agreed" in text for (at, agreed), text in zip(steps, texts)), steps
    return steps

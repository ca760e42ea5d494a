"""The switches' names and how a bad value of one is worded and warned about.

The variables (``TPU_CLOSURE_FIX``, ``TPU_CLOSURE_FIX_LOG``, ``TPU_CLOSURE_FIX_DISABLE`` and the sync check's),
their parse rules and defaults are one table in :mod:`.settings`, read once; every activation mode (import,
.pth/.start auto-enable, entry points, sitecustomize, ``tpu-closure-fix run``) asks it, so each variable means the
same thing everywhere.

A bad value of any of them gives one message naming the variable, the value, the accepted values, what applies
instead (the default) and a next step, in lines of at most 120 columns (:func:`bad_value_message`), and is then
ignored: a :class:`TPUClosureFixWarning` at the user's importing line (:func:`warn_about`), or, for the sync
check's variables, a report on its logger.
"""
import importlib
import logging
import os
import sys
import warnings

ENV_VAR = "TPU_CLOSURE_FIX"
#: Arms the zero-code SyncCheck (tpu_closure_fix.synccheck.hook): N optimizer steps between checks.
SYNC_CHECK_VAR = "TPU_CLOSURE_FIX_SYNC_CHECK"
#: The level of the ``tpu_closure_fix`` logger (and a stderr handler on it); unset or empty: untouched.
LOG_VAR = "TPU_CLOSURE_FIX_LOG"
#: Comma-separated integrations to leave alone (``accelerate,optimum_neuron``); unset or empty: none.
DISABLE_VAR = "TPU_CLOSURE_FIX_DISABLE"
#: The zero-code SyncCheck's finer settings: what a divergence does, over which ranks the tensors no layout
#: places are compared, the agreement's timeout, where the replicas of torch_xla without a process group find the
#: check's own store and the job's secret (``settings.TABLE``).
ON_DIVERGENCE_VAR = SYNC_CHECK_VAR + "_ON_DIVERGENCE"
GROUP_VAR = SYNC_CHECK_VAR + "_GROUP"
TIMEOUT_VAR = SYNC_CHECK_VAR + "_TIMEOUT"
CHANNEL_VAR = SYNC_CHECK_VAR + "_CHANNEL"
ON_VALUES = frozenset(("1", "true", "on", "yes"))
OFF_VALUES = frozenset(("0", "false", "off", "no"))
#: ``TPU_CLOSURE_FIX_LOG``'s accepted values, in the order messages list them, with their ``logging`` levels.
LOG_LEVELS = (("debug", logging.DEBUG), ("info", logging.INFO), ("warning", logging.WARNING),
              ("error", logging.ERROR))


class TPUClosureFixWarning(UserWarning):
    """Something a user of tpu-closure-fix must know: a site left unpatched, a bad setting, a late enable."""


#: How much of a bad value a message quotes: enough to recognise it, never the whole of a huge value.
QUOTE_LIMIT = 40

#: The whitespace the switch ignores around its value: ASCII only, so the value parses the same under
#: every locale (``str.strip()`` also strips Unicode spaces, which a C locale decodes to surrogates instead).
ASCII_WHITESPACE = " \t\n\r\x0b\x0c"


def quote_value(raw, limit=QUOTE_LIMIT):
    """``ascii(raw)``, or that of its first ``limit`` characters plus its length when it is longer.

    ASCII-escaped (``'0\\u2003'``, ``'off\\n'``): a message quoting a user's value can be printed on any
    stream (an ASCII stdout never raises ``UnicodeEncodeError``) and never spans two lines of a table.
    """
    if len(raw) <= limit:
        return ascii(raw)
    return "%s... (%d characters)" % (ascii(raw[:limit]), len(raw))


def show_value(raw, limit=QUOTE_LIMIT):
    """``raw`` itself when it is a plain ASCII word (``0``, ``off``), else :func:`quote_value`."""
    if raw and len(raw) <= limit and raw.isascii() and raw.isalnum():
        return raw
    return quote_value(raw, limit)


#: The first line of a bad value's warning: empty. Python prints the warning's location and category in front
#: of it (``path:line: TPUClosureFixWarning: ``), as wide as the path (a venv's site-packages takes 100
#: columns), so the details start on the next line and stand on lines of their own, each at most
#: ``textfit.WIDTH`` columns.
BAD_VALUE_HEAD = ""
#: How far the detail lines of a bad value's warning are indented (their continuations: 4 more).
BAD_VALUE_INDENT = "    "


def bad_value_message(variable, raw, accepted, instead, next_step, complaint="is not an accepted value"):
    """The warning for a bad value ``raw`` of the environment variable ``variable``: :data:`BAD_VALUE_HEAD`
    (empty), then indented lines naming the variable and the value (:func:`quote_value`) with ``complaint`` and the
    ``accepted`` values, what is done ``instead``, and the ``next_step`` (backquoted commands, never broken
    across lines); every line after the first wrapped at ``textfit.WIDTH`` columns."""
    from . import textfit  # only on a bad value: start-up imports nothing more

    sentences = ("%s=%s %s; accepted: %s." % (variable, quote_value(raw), complaint, accepted), instead,
                 "Next step: %s." % next_step)
    lines = [BAD_VALUE_HEAD]
    for number, sentence in enumerate(sentences):
        # the first sentence quotes the user's value: a backquote in it is no command
        lines.extend(textfit.wrap(BAD_VALUE_INDENT + sentence, commands=number > 0))
    return "\n".join(lines)


def warn_about(variable, raw, problem):
    """Warn of the bad value ``raw`` of ``variable``: at the user's line that imported the shim, or, where the
    program importing it is tpu-closure-fix's own command line (:func:`_cli_start`), at the environment, which
    is where the value was set (the command's own source line is nothing a user wrote)."""
    level = user_stacklevel()
    if not _cli_start(sys._getframe(), level):
        warnings.warn(problem, TPUClosureFixWarning, stacklevel=level)
        return
    warnings.warn_explicit(problem, TPUClosureFixWarning, "the environment variable %s=%s" % (
        variable, show_value(raw)), 0, module="tpu_closure_fix", registry={})


#: The first frames of tpu-closure-fix's own command line: its console script (named after the command) and
#: ``python -m tpu_closure_fix`` (the runpy module imports the package before its ``__main__``).
CLI_SCRIPT = "tpu-closure-fix"


def _cli_start(frame, level):
    """True when the frame ``level - 1`` frames above ``frame`` (the one a warning at ``stacklevel=level`` from
    ``frame`` would name) is the command line's start: the console script, or runpy running the package."""
    for _ in range(level - 1):
        if frame is None:
            return False
        frame = frame.f_back
        while frame is not None and "importlib" in frame.f_code.co_filename and "_bootstrap" in \
                frame.f_code.co_filename:
            frame = frame.f_back
    if frame is None:
        return False
    name = os.path.basename(frame.f_code.co_filename)
    return name == CLI_SCRIPT or (name in ("runpy.py", "<frozen runpy>") and
                                  os.path.basename(sys.argv[0]) in ("-m", "__main__.py"))


def _machinery(filename):
    """True for a frame of this package, of the import system, of the start-up module or of wrapt's import
    hooks: the code between the user's import line and a warning about a switch."""
    path = os.path.abspath(filename)
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    importlib_dir = os.path.dirname(os.path.abspath(importlib.__file__)) + os.sep
    return (filename.startswith("<frozen importlib") or path.startswith((package, importlib_dir))
            or os.path.basename(path) == "_tpu_closure_fix_startup.py"
            or os.path.basename(os.path.dirname(path)) == "wrapt")


def user_stacklevel():
    """The ``stacklevel`` that makes a warning issued by the caller of this function point at the first frame
    outside :func:`_machinery`: the user's ``import`` line, not the shim (the message names the variable).
    Where every frame is machinery, the caller itself (1)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and _machinery(frame.f_code.co_filename):
        frame = frame.f_back
        # warnings.warn does not count the import system's bootstrap frames (warnings._is_internal_frame)
        if frame is not None and not ("importlib" in frame.f_code.co_filename and
                                      "_bootstrap" in frame.f_code.co_filename):
            level += 1
    return level if frame is not None else 1


def user_location():
    """``(filename, lineno)`` of the first frame outside :func:`_machinery` (the user's ``import`` line), for a
    report that is not a warning (the sync check's settings); where every frame is machinery, the caller's."""
    first = frame = sys._getframe(1)
    while frame is not None and _machinery(frame.f_code.co_filename):
        frame = frame.f_back
    frame = frame or first
    return frame.f_code.co_filename, frame.f_lineno

"""The switches: the ``TPU_CLOSURE_FIX`` environment variable, and two finer ones.

Every activation mode (import, .pth/.start auto-enable, entry points,
sitecustomize, ``tpu-closure-fix run``) asks :func:`enabled_from_environment`,
so the variable means the same thing everywhere.

* ``TPU_CLOSURE_FIX_LOG=debug|info|warning|error``: the level of the ``tpu_closure_fix`` logger, with one
  handler writing to stderr (:func:`log_level_from_environment`, applied by ``activation.activate()``).
* ``TPU_CLOSURE_FIX_DISABLE=accelerate,optimum_neuron``: integrations whose sites are left alone
  (:func:`disabled_from_environment`, read by ``engine.enable()``; their sites are ``disabled``).

A bad value of any of them gives one :class:`TPUClosureFixWarning` naming the variable, the value, the
accepted values, what applies instead (the default) and a next step, in lines of at most 120 columns
(:func:`bad_value_message`), and is then ignored.
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
ON_VALUES = frozenset(("1", "true", "on", "yes"))
OFF_VALUES = frozenset(("0", "false", "off", "no"))
#: ``TPU_CLOSURE_FIX_LOG``'s accepted values, in the order messages list them, with their ``logging`` levels.
LOG_LEVELS = (("debug", logging.DEBUG), ("info", logging.INFO), ("warning", logging.WARNING),
              ("error", logging.ERROR))


class TPUClosureFixWarning(UserWarning):
    """Something a user of tpu-closure-fix must know: a site left unpatched, a bad setting, a late enable."""


_warned_values = set()

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


def parse_switch(raw):
    """Return (enabled, problem) for a raw value of TPU_CLOSURE_FIX.

    Unset or empty means enabled; ASCII whitespace around the value and ASCII case are ignored, nothing else
    (the same under every locale). ``problem`` is a message naming the variable
    and the accepted values when the value is not one of them (then the default,
    enabled, applies); otherwise None.
    """
    if raw is None:
        return True, None
    value = raw.strip(ASCII_WHITESPACE)
    value = value.lower() if value.isascii() else None  # a non-ASCII value is never an accepted word
    if value == "" or value in ON_VALUES:
        return True, None
    if value in OFF_VALUES:
        return False, None
    return True, bad_value_message(
        ENV_VAR, raw, "1/true/on/yes (enable, the default) or 0/false/off/no (disable), any case",
        "Using the default: enabled.",
        "`unset %s` (enabled), or `export %s=0` (disabled)" % (ENV_VAR, ENV_VAR))


def enabled_from_environment(environ=None):
    """Read TPU_CLOSURE_FIX; warn once per distinct bad value."""
    raw = (os.environ if environ is None else environ).get(ENV_VAR)
    enabled, problem = parse_switch(raw)
    if problem is not None and raw not in _warned_values:
        _warned_values.add(raw)
        _warn_about(ENV_VAR, raw, problem)
    return enabled


def _warn_once(variable, raw, problem):
    """One warning per variable and distinct bad value."""
    if problem is not None and (variable, raw) not in _warned_values:
        _warned_values.add((variable, raw))
        _warn_about(variable, raw, problem)


def _warn_about(variable, raw, problem):
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


def _word(raw):
    """``raw`` without ASCII whitespace around it, in lower case; None for a non-ASCII value (never a word)."""
    value = raw.strip(ASCII_WHITESPACE)
    return value.lower() if value.isascii() else None


def parse_log_level(raw):
    """Return (level, problem) for a raw value of TPU_CLOSURE_FIX_LOG.

    Unset or empty: (None, None), the logging configuration is left as it is. ``debug``, ``info``,
    ``warning``, ``error``, ASCII whitespace around the value and ASCII case ignored: that ``logging``
    level. Anything else: (None, a message naming the variable and the accepted values).
    """
    if raw is None:
        return None, None
    value = _word(raw)
    if value == "":
        return None, None
    levels = dict(LOG_LEVELS)
    if value in levels:
        return levels[value], None
    return None, bad_value_message(
        LOG_VAR, raw, "%s, any case" % "/".join(name for name, _ in LOG_LEVELS),
        "Ignored: the logging configuration is left as it is.",
        "`export %s=info`, or `unset %s`" % (LOG_VAR, LOG_VAR))


def log_level_from_environment(environ=None):
    """Read TPU_CLOSURE_FIX_LOG: a ``logging`` level or None; warn once per distinct bad value."""
    raw = (os.environ if environ is None else environ).get(LOG_VAR)
    level, problem = parse_log_level(raw)
    _warn_once(LOG_VAR, raw, problem)
    return level


def integration_name(word):
    """An integration's name as the code spells it (``optimum_neuron``) from a user's word: ASCII whitespace
    around it and ASCII case ignored, the distribution spelling's ``-`` read as ``_``; None for a non-ASCII word."""
    value = _word(word)
    return value.replace("-", "_") if value is not None else None


def parse_disable(raw, names):
    """Return (disabled, problem) for a raw value of TPU_CLOSURE_FIX_DISABLE.

    ``names``: the integrations the code knows (``integrations.NAMES``). ``disabled`` is the frozenset of
    those the comma-separated value names (:func:`integration_name`; empty items are ignored); ``problem``
    a message naming every other item and the accepted names (the known ones still apply), or None.
    """
    if raw is None:
        return frozenset(), None
    disabled, unknown = set(), []
    for item in raw.split(","):
        name = integration_name(item)
        if name == "":
            continue
        if name in names:
            disabled.add(name)
        else:
            unknown.append(quote_value(item.strip(ASCII_WHITESPACE)))
    if not unknown:
        return frozenset(disabled), None
    kept = ",".join(name for name in names if name in disabled)
    return frozenset(disabled), bad_value_message(
        DISABLE_VAR, raw, "%s (also with '-' for '_'), any case, comma-separated" % ", ".join(names),
        "Unknown names are ignored; disabled: %s." % (", ".join(sorted(disabled)) or "nothing"),
        "`export %s=%s` (the names it knows)" % (DISABLE_VAR, kept) if kept else "`unset %s`" % DISABLE_VAR,
        complaint="names no integration %s" % ", ".join(unknown))


def disabled_from_environment(names, environ=None):
    """Read TPU_CLOSURE_FIX_DISABLE: the frozenset of ``names`` it names; warn once per distinct bad value."""
    raw = (os.environ if environ is None else environ).get(DISABLE_VAR)
    disabled, problem = parse_disable(raw, names)
    _warn_once(DISABLE_VAR, raw, problem)
    return disabled

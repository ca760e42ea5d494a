"""The one switch: the ``TPU_CLOSURE_FIX`` environment variable.

Every activation mode (import, .pth/.start auto-enable, entry points,
sitecustomize, ``tpu-closure-fix run``) asks :func:`enabled_from_environment`,
so the variable means the same thing everywhere.
"""
import os
import warnings

ENV_VAR = "TPU_CLOSURE_FIX"
#: Arms the zero-code SyncCheck (tpu_closure_fix.synccheck.hook): N optimizer steps between checks.
SYNC_CHECK_VAR = "TPU_CLOSURE_FIX_SYNC_CHECK"
ON_VALUES = frozenset(("1", "true", "on", "yes"))
OFF_VALUES = frozenset(("0", "false", "off", "no"))


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
    return True, (
        "%s=%s is not an accepted value; accepted: 1/true/on/yes (enable, the default) "
        "or 0/false/off/no (disable), any case. Using the default: enabled." % (ENV_VAR, quote_value(raw))
    )


def enabled_from_environment(environ=None):
    """Read TPU_CLOSURE_FIX; warn once per distinct bad value."""
    raw = (os.environ if environ is None else environ).get(ENV_VAR)
    enabled, problem = parse_switch(raw)
    if problem is not None and raw not in _warned_values:
        _warned_values.add(raw)
        warnings.warn(problem, TPUClosureFixWarning, stacklevel=3)
    return enabled

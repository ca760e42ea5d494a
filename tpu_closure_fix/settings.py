"""Every ``TPU_CLOSURE_FIX*`` setting in one table, read once into one :class:`Settings` object.

:data:`TABLE` holds one :class:`Setting` per variable: its name, its parse rule, its default, the values it
accepts, what a bad value does and where that is said. :func:`current` reads every row from ``os.environ`` the
first time any part of the package asks (at activation) and keeps the result; every reader of these variables
asks that object (:meth:`Settings.get`), never the environment. :func:`reload` reads the environment again
(tests that change it). One variable is also read later, by its row (:func:`read_now`): the sync check's channel,
which the package sets in its own process when it starts torch_xla's replicas.

A bad value is said once per variable and value in the process (one set of said keys, :data:`_said`), when a
reader first asks for it: as a :class:`~.config.TPUClosureFixWarning` at the user's importing line, or, for the
sync check's variables, as a report on the ``tpu_closure_fix.synccheck`` logger (no warnings filter mutes it;
its words are :func:`~.config.bad_value_message`'s). The environment of another process (``status`` looking at
the training's) is read with :class:`Settings` over that mapping and :meth:`Settings.peek`, which says nothing.

docs/settings.md lists the settings, rendered from :data:`TABLE` (``scripts/doc_samples.py``).
"""
import collections
import os

from . import integrations  # its names only (the integration modules are loaded by the engine)
from .config import (ASCII_WHITESPACE, CHANNEL_VAR, DISABLE_VAR, ENV_VAR, GROUP_VAR, LOG_LEVELS, LOG_VAR,
                     OFF_VALUES, ON_DIVERGENCE_VAR, ON_VALUES, SYNC_CHECK_VAR, TIMEOUT_VAR, bad_value_message,
                     quote_value)

#: Where a bad value is said: a ``TPUClosureFixWarning`` (warnings filters apply), or the sync check's logger.
WARNING = "warning"
SYNC_LOGGER = "sync check logger"

#: ``TPU_CLOSURE_FIX_SYNC_CHECK_ON_DIVERGENCE``'s and ``..._GROUP``'s accepted values; the first is the default.
ACTIONS = ("warn", "raise")
GROUPS = ("auto", "world")
DEFAULT_ACTION, DEFAULT_GROUP = ACTIONS[0], GROUPS[0]
#: More digits than any real step count; a longer value is refused before ``int()`` reads it.
MAX_DIGITS = 12
#: Seconds a rank waits for the others to reach the same check (or for the check's collective) before it stands
#: down. Long enough for the first check of a job, whose first step on XLA includes compiling the training graph.
DEFAULT_TIMEOUT = 300
#: The last field of a channel whose store the process that started the replicas made (and serves).
MADE = "made"
#: The fewest hexadecimal digits of a job's secret (``secrets.token_hex(16)`` gives 32).
SECRET_DIGITS = 32


class Setting(collections.namedtuple("Setting", "name parse default unset accepted on_bad said example")):
    """One variable: ``parse(raw, environ)`` -> ``(value, problem)`` (``raw`` None: unset; ``problem``: the whole
    message for a bad value, else None); ``default``: the value when unset or empty, which ``unset`` says in
    words; ``accepted``: the accepted values as every bad-value message names them; ``on_bad``: what applies
    instead; ``said``: :data:`WARNING` or :data:`SYNC_LOGGER`; ``example``: an accepted value other than the
    default."""


# --------------------------------------------------------------------------- the parse rules
def _word(raw):
    """``raw`` without ASCII whitespace around it, in lower case; None for a non-ASCII value (never a word)."""
    value = raw.strip(ASCII_WHITESPACE)
    return value.lower() if value.isascii() else None


SWITCH_ACCEPTED = "1/true/on/yes (enable, the default) or 0/false/off/no (disable), any case"


def parse_switch(raw):
    """Return (enabled, problem) for a raw value of TPU_CLOSURE_FIX.

    Unset or empty means enabled; ASCII whitespace around the value and ASCII case are ignored, nothing else
    (the same under every locale). ``problem`` is a message naming the variable and the accepted values when
    the value is not one of them (then the default, enabled, applies); otherwise None.
    """
    if raw is None:
        return True, None
    value = _word(raw)  # a non-ASCII value is never an accepted word
    if value == "" or value in ON_VALUES:
        return True, None
    if value in OFF_VALUES:
        return False, None
    return True, bad_value_message(ENV_VAR, raw, SWITCH_ACCEPTED, "Using the default: enabled.",
                                   "`unset %s` (enabled), or `export %s=0` (disabled)" % (ENV_VAR, ENV_VAR))


LOG_ACCEPTED = "%s, any case" % "/".join(name for name, _ in LOG_LEVELS)


def parse_log_level(raw):
    """Return (level, problem) for a raw value of TPU_CLOSURE_FIX_LOG.

    Unset or empty: (None, None), the logging configuration is left as it is. ``debug``, ``info``,
    ``warning``, ``error``, ASCII whitespace around the value and ASCII case ignored: that ``logging``
    level. Anything else: (None, a message naming the variable and the accepted values).
    """
    value = "" if raw is None else _word(raw)
    if value == "":
        return None, None
    levels = dict(LOG_LEVELS)
    if value in levels:
        return levels[value], None
    return None, bad_value_message(LOG_VAR, raw, LOG_ACCEPTED, "Ignored: the logging configuration is left as it is.",
                                   "`export %s=info`, or `unset %s`" % (LOG_VAR, LOG_VAR))


def integration_name(word):
    """An integration's name as the code spells it (``optimum_neuron``) from a user's word: ASCII whitespace
    around it and ASCII case ignored, the distribution spelling's ``-`` read as ``_``; None for a non-ASCII word."""
    value = _word(word)
    return value.replace("-", "_") if value is not None else None


def disable_accepted(names):
    return "%s (also with '-' for '_'), any case, comma-separated" % ", ".join(names)


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
        DISABLE_VAR, raw, disable_accepted(names),
        "Unknown names are ignored; disabled: %s." % (", ".join(sorted(disabled)) or "nothing"),
        "`export %s=%s` (the names it knows)" % (DISABLE_VAR, kept) if kept else "`unset %s`" % DISABLE_VAR,
        complaint="names no integration %s" % ", ".join(unknown))


EVERY_ACCEPTED = "a whole number of optimizer steps between checks (ASCII digits, e.g. 100), or 0 / unset (off)"


def parse_every(raw):
    """(every, problem) for a raw value of TPU_CLOSURE_FIX_SYNC_CHECK: unset/empty/0 -> (0, None) (off).

    Accepted: ASCII digits only (surrounding white space ignored). Anything else gives every 0 and a
    message naming the variable and the accepted values."""
    value = "" if raw is None else raw.strip(ASCII_WHITESPACE)
    if value == "":
        return 0, None
    if len(value) <= MAX_DIGITS and value.isascii() and value.isdigit():
        return int(value), None
    return 0, bad_value_message(
        SYNC_CHECK_VAR, raw, EVERY_ACCEPTED, "The zero-code sync check stays off.",
        "`export %s=100` (a check every 100 optimizer steps), or `unset %s`" % (SYNC_CHECK_VAR, SYNC_CHECK_VAR))


def _choice(variable, choices, accepted, instead, next_step):
    """The parse rule of a variable taking one of ``choices`` (the first: the default), any ASCII case."""
    def parse(raw):
        value = "" if raw is None else raw.strip(ASCII_WHITESPACE)
        if value == "":
            return choices[0], None
        if value.isascii() and value.lower() in choices:
            return value.lower(), None
        return choices[0], bad_value_message(variable, raw, accepted, instead, next_step)

    return parse


ACTION_ACCEPTED = "warn (the default) or raise"
#: (action, problem) for a raw value of TPU_CLOSURE_FIX_SYNC_CHECK_ON_DIVERGENCE: unset/empty -> warn.
parse_action = _choice(ON_DIVERGENCE_VAR, ACTIONS, ACTION_ACCEPTED, "Using warn.",
                       "`unset %s` (warn), or `export %s=raise`" % (ON_DIVERGENCE_VAR, ON_DIVERGENCE_VAR))
GROUP_ACCEPTED = ("auto (the default: decided at each optimizer's first check) or world (every rank holds the same "
                  "model)")
#: (group, problem) for a raw value of TPU_CLOSURE_FIX_SYNC_CHECK_GROUP: unset/empty -> auto.
parse_group = _choice(GROUP_VAR, GROUPS, GROUP_ACCEPTED, "Using auto.",
                      "`unset %s` (auto), or `export %s=world` where every rank holds the same model"
                      % (GROUP_VAR, GROUP_VAR))

TIMEOUT_ACCEPTED = "a whole number of seconds > 0 (ASCII digits, e.g. 600), or unset (%d)" % DEFAULT_TIMEOUT


def parse_timeout(raw):
    """(seconds, problem) for a raw value of TPU_CLOSURE_FIX_SYNC_CHECK_TIMEOUT (unset/empty: the default)."""
    value = "" if raw is None else raw.strip(ASCII_WHITESPACE)
    if value == "":
        return DEFAULT_TIMEOUT, None
    if len(value) <= 7 and value.isascii() and value.isdigit() and int(value) > 0:
        return int(value), None
    return DEFAULT_TIMEOUT, bad_value_message(
        TIMEOUT_VAR, raw, TIMEOUT_ACCEPTED, "Using %d." % DEFAULT_TIMEOUT,
        "`unset %s` (%d s), or `export %s=600`" % (TIMEOUT_VAR, DEFAULT_TIMEOUT, TIMEOUT_VAR))


#: A channel handed to the replicas: its store's host and port, the job's secret (every key's prefix), and
#: whether the process that started the replicas made it (else process 0 makes it).
Channel = collections.namedtuple("Channel", "host port secret made")
CHANNEL_ACCEPTED = ("HOST:PORT:SECRET, the same on every host (SECRET: %d or more hexadecimal digits), or unset "
                    "(handed over by xmp.spawn / torch_xla.launch)" % SECRET_DIGITS)
CHANNEL_INSTEAD = "The sync check stands down on torch_xla without a process group."


def parse_channel(raw):
    """(:class:`Channel` or None, problem) of a raw value of ``TPU_CLOSURE_FIX_SYNC_CHECK_CHANNEL``:
    ``HOST:PORT:SECRET``, where process 0 makes the check's store, or ``HOST:PORT:SECRET:made``, a store the
    process that started the replicas already made (:func:`.synccheck.launch.handing_over`). SECRET: at least
    :data:`SECRET_DIGITS` hexadecimal digits. Unset or empty: (None, None), nothing handed over."""
    value = "" if raw is None else raw.strip(ASCII_WHITESPACE)
    if value == "":
        return None, None
    fields = value.rsplit(":", 3)
    made = len(fields) == 4 and fields[3] == MADE
    host, port, secret = (fields[:3] if made else (value.rsplit(":", 2) + ["", "", ""])[:3])
    host, port = host.strip("[]"), port_number(port)
    if host and port is not None and _is_secret(secret):
        return Channel(host, port, secret, made), None
    return None, bad_value_message(
        CHANNEL_VAR, raw, CHANNEL_ACCEPTED, CHANNEL_INSTEAD,
        "`unset %s` on one host (xmp.spawn hands a channel over); across hosts, one value on every host: process "
        "0's host, a free port and a secret of 32 hexadecimal digits (Python's secrets.token_hex(16))" % CHANNEL_VAR)


def _is_secret(text):
    return len(text) >= SECRET_DIGITS and text.isascii() and all(c in "0123456789abcdefABCDEF" for c in text)


def port_number(raw):
    """``raw`` as a TCP port number (1-65535, ASCII digits, whitespace around ignored), else None."""
    value = (raw or "").strip()
    if 0 < len(value) <= 5 and value.isascii() and value.isdigit() and 0 < int(value) <= 65535:
        return int(value)
    return None


def _disable_of(raw, environ):
    return parse_disable(raw, integrations.NAMES)


def _raw_only(parse):
    """A rule of the value alone as a row's ``parse(raw, environ)``."""
    def of_raw(raw, environ):
        return parse(raw)

    of_raw.__name__ = parse.__name__
    return of_raw


# --------------------------------------------------------------------------- the table
TABLE = (
    Setting(ENV_VAR, _raw_only(parse_switch), True, "enabled", SWITCH_ACCEPTED, "the default (enabled) applies",
            WARNING, "0"),
    Setting(LOG_VAR, _raw_only(parse_log_level), None, "the logging configuration is left as it is", LOG_ACCEPTED,
            "ignored (the logging configuration is left as it is)", WARNING, "info"),
    Setting(DISABLE_VAR, _disable_of, frozenset(), "no integration is disabled",
            disable_accepted(integrations.NAMES),
            "unknown names are ignored, the known ones apply", WARNING, "accelerate"),
    Setting(SYNC_CHECK_VAR, _raw_only(parse_every), 0, "off", EVERY_ACCEPTED, "the zero-code sync check stays off",
            SYNC_LOGGER, "100"),
    Setting(ON_DIVERGENCE_VAR, _raw_only(parse_action), DEFAULT_ACTION, DEFAULT_ACTION, ACTION_ACCEPTED,
            "%s applies" % DEFAULT_ACTION, SYNC_LOGGER, "raise"),
    Setting(GROUP_VAR, _raw_only(parse_group), DEFAULT_GROUP, DEFAULT_GROUP, GROUP_ACCEPTED,
            "%s applies" % DEFAULT_GROUP, SYNC_LOGGER, "world"),
    Setting(TIMEOUT_VAR, _raw_only(parse_timeout), DEFAULT_TIMEOUT, "%d seconds" % DEFAULT_TIMEOUT, TIMEOUT_ACCEPTED,
            "%d seconds apply" % DEFAULT_TIMEOUT, SYNC_LOGGER, "600"),
    Setting(CHANNEL_VAR, _raw_only(parse_channel), None, "xmp.spawn / torch_xla.launch hand one to the replicas "
            "they start on one host; none handed over, the check stands down", CHANNEL_ACCEPTED,
            "the sync check stands down on torch_xla without a process group", SYNC_LOGGER,
            "10.0.0.7:29600:" + "0123456789abcdef" * 2),
)

#: Names of this package's prefix that are no user settings: variables it sets for its own child processes
#: (the bootstrap directory in use; the graph check's dump time), and the mark of a verify child's result line.
INTERNAL = ("TPU_CLOSURE_FIX_BOOTSTRAP", "TPU_CLOSURE_FIX_GRAPHCHECK_DUMP_AFTER", "TPU_CLOSURE_FIX_RESULT")


def row(name):
    """The :class:`Setting` of the variable ``name``."""
    for setting in TABLE:
        if setting.name == name:
            return setting
    raise KeyError(name)


# --------------------------------------------------------------------------- the one object
class Settings(object):
    """Every row of :data:`TABLE` read from ``environ`` (a mapping): each raw value (``raw[name]``, None: unset)
    and what it parses to, parsed once here."""

    def __init__(self, environ):
        self.rows = {setting.name: setting for setting in TABLE}
        self.raw = {name: environ.get(name) for name in self.rows}
        self._parsed = {name: setting.parse(self.raw[name], environ) for name, setting in self.rows.items()}

    def get(self, name):
        """The value of the variable ``name``; a bad value is said (once per variable and value in the process)
        and its default, or what its message says, is returned."""
        value, problem = self._parsed[name]
        if problem is not None:
            say_bad_value(self.rows[name], self.raw[name], problem)
        return value

    def peek(self, name):
        """``(value, problem)`` of the variable ``name``, saying nothing (another process's environment)."""
        return self._parsed[name]


#: (variable, raw value) of every bad value said in this process: each is said once.
_said = set()
_current = None


def say_bad_value(setting, raw, problem):
    """Say ``problem``, the message for the bad value ``raw`` of ``setting``, unless said already: on the sync
    check's logger at the user's line (no warnings filter mutes it), or as a warning."""
    if (setting.name, raw) in _said:
        return
    _said.add((setting.name, raw))
    from . import config

    if setting.said == SYNC_LOGGER:
        from .synccheck import report

        report.say(problem, config.user_location())
    else:
        config.warn_about(setting.name, raw, problem)


def current():
    """The settings of this process, read from ``os.environ`` at the first call and kept."""
    global _current
    if _current is None:
        _current = Settings(os.environ)
    return _current


def reload(environ=None):
    """Read the settings again, from ``environ`` (default ``os.environ``), and keep them; returns them."""
    global _current
    _current = Settings(os.environ if environ is None else environ)
    return _current


def of(environ=None):
    """The kept settings (``environ`` None), or those of the given mapping, read now and not kept."""
    return current() if environ is None else Settings(environ)


def read_now(name, environ=None):
    """The value of the variable ``name`` read from ``environ`` (default ``os.environ``) at this call, by its row,
    a bad value said through the one warn-once; not kept, the other rows not read.

    Only for the variable the package itself puts into its environment while it runs: the sync check's channel
    (:data:`~.config.CHANNEL_VAR`), set by the process that starts torch_xla's replicas, after its own settings
    were read (:mod:`.synccheck.launch`). Its replicas read it here when they reach the check's store: replicas that
    are threads of that process, and children forked from it, hold settings read before it was set; a child
    started afresh reads it either way.
    """
    environ = os.environ if environ is None else environ
    setting, raw = row(name), environ.get(name)
    value, problem = setting.parse(raw, environ)
    if problem is not None:
        say_bad_value(setting, raw, problem)
    return value

"""The settings table (``tpu_closure_fix.settings.TABLE``): every ``TPU_CLOSURE_FIX*`` variable in one table, read
once into one object; a bad value said once, naming the variable and its accepted values; a good one said never.

Every test over the rows is parametrized by the table itself, so a new row is tested as soon as it is written.
The rules a row must keep (:func:`faults`) are checked against planted faults too: a changed default, a parse
rule that drifted from its row, an accepted-values text the message no longer names.
"""
import logging
import os
import re
import warnings

import pytest

from support.said import fresh, said
from tpu_closure_fix import activation, config, engine, settings

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROWS = [pytest.param(row, id=row.name) for row in settings.TABLE]
#: A value no row accepts (a row that accepts it would need its own bad value here).
BAD = "bogus"


def _flat(text):
    return " ".join(text.split())


def faults(row):
    """What is wrong with ``row``: its rule's value when unset or empty is not its default, its example is
    refused or is the default, a bad value's message does not name the variable and the accepted values, or the
    row says nowhere how a bad value is said."""
    found = []
    for raw in (None, ""):
        if row.parse(raw, {}) != (row.default, None):
            found.append("%r parses to %r, not the default %r" % (raw, row.parse(raw, {}), row.default))
    value, problem = row.parse(row.example, {})
    if problem is not None or value == row.default:
        found.append("the example %r parses to %r (%s)" % (row.example, value, problem))
    value, problem = row.parse(BAD, {})
    if problem is None or "%s=%r" % (row.name, BAD) not in _flat(problem) or row.accepted not in _flat(problem):
        found.append("a bad value's message does not name %s and %r: %r" % (row.name, row.accepted, problem))
    if row.said not in (settings.WARNING, settings.SYNC_LOGGER):
        found.append("said %r" % (row.said,))
    return found


@pytest.mark.parametrize("row", ROWS)
def test_every_row_keeps_its_rules(row):
    assert faults(row) == []


def _bad_default(row):
    return row._replace(default=row.example)


def _drifted_rule(row):
    """The row with a parse rule whose own default moved away from the row's (the row still says the old one)."""
    return row._replace(parse=lambda raw, environ: row.parse(row.example if not raw else raw, environ))


def _accepted_reworded(row):
    return row._replace(accepted=row.accepted + " (or anything else)")


@pytest.mark.parametrize("plant", [_bad_default, _drifted_rule, _accepted_reworded])
@pytest.mark.parametrize("row", ROWS)
def test_twin_a_fault_planted_in_a_row_is_found(row, plant):
    assert faults(plant(row)) != []


def test_twin_a_timeout_rule_with_another_default_is_found(monkeypatch):
    """A fault planted in the rule itself, as an edit of the code would: the default seconds changed."""
    monkeypatch.setattr(settings, "DEFAULT_TIMEOUT", 301)
    assert settings.parse_timeout(None) == (301, None)
    assert faults(settings.row(config.TIMEOUT_VAR)) != []


# --------------------------------------------------------------------------- said once, or never
def _what_is_said(environ, name, reads=3):
    """(warnings, sync check reports) while the variable ``name`` is read ``reads`` times from settings read anew
    from ``environ`` each time (as many objects as reads: only the one set of said keys can keep it to once)."""
    fresh()
    with warnings.catch_warnings(record=True) as caught, said(logging.WARNING) as heard:
        warnings.simplefilter("always")
        for _ in range(reads):
            settings.of(environ).get(name)
    return [str(w.message) for w in caught if w.category is config.TPUClosureFixWarning], heard.spoken


@pytest.mark.parametrize("row", ROWS)
def test_a_bad_value_is_said_once_naming_the_variable_and_the_accepted_values(row):
    warned, reported = _what_is_said({row.name: BAD}, row.name)
    (message,) = warned + reported
    assert (len(warned), len(reported)) == ((1, 0) if row.said == settings.WARNING else (0, 1))
    assert _flat(message).startswith("%s=%r" % (row.name, BAD)) and row.accepted in _flat(message), message


@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("good", ["example", "unset", "empty"])
def test_twin_a_good_value_is_said_never(row, good):
    environ = {"example": {row.name: row.example}, "unset": {}, "empty": {row.name: ""}}[good]
    assert _what_is_said(environ, row.name) == ([], [])
    assert settings.of(environ).get(row.name) == (row.parse(row.example, {})[0] if good == "example" else row.default)


@pytest.mark.parametrize("row", ROWS)
def test_each_distinct_bad_value_is_said_once(row):
    fresh()
    with warnings.catch_warnings(record=True) as caught, said(logging.WARNING) as heard:
        warnings.simplefilter("always")
        for raw in (BAD, BAD, BAD + "2", BAD + "2", "", None):
            settings.of({} if raw is None else {row.name: raw}).get(row.name)
    assert len([w for w in caught if w.category is config.TPUClosureFixWarning]) + len(heard.spoken) == 2


# --------------------------------------------------------------------------- read once
@pytest.fixture
def counted(monkeypatch):
    """{variable: parses so far}: every row's rule counted, the settings read anew from an environment arming
    the check (its hooks not put into torch)."""
    counts = dict((row.name, 0) for row in settings.TABLE)

    def counting(row):
        def parse(raw, environ):
            counts[row.name] += 1
            return row.parse(raw, environ)

        return row._replace(parse=parse)

    monkeypatch.setattr(settings, "TABLE", tuple(counting(row) for row in settings.TABLE))
    for name in counts:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(config.SYNC_CHECK_VAR, "5")
    from tpu_closure_fix.synccheck import hook

    monkeypatch.setattr(hook, "arm", lambda *args: None)
    settings.reload()
    return counts


def test_the_settings_are_read_once_across_every_reader(counted):
    from tpu_closure_fix.synccheck import comm, hook, worker

    activation.arm_sync_check()  # the arming path of import and start-up
    assert hook.arm_from_environment() == 5  # the hook's own
    activation.configure_logging()
    engine._integrations_switched_off()
    comm._timeout(None)
    worker.drain_bound()
    assert counted == dict((row.name, 1) for row in settings.TABLE)


def test_the_channel_alone_is_read_again_where_the_store_is_reached(counted):
    """The launcher sets the channel in its own process after the settings were read (its replicas may be its
    threads): the store reads that one row again, and no other."""
    from tpu_closure_fix.synccheck import comm

    settings.current()
    comm.handed_channel()
    assert counted == dict((row.name, 2 if row.name == config.CHANNEL_VAR else 1) for row in settings.TABLE)


def test_twin_a_reload_reads_them_again(counted):
    settings.reload()
    assert counted == dict((row.name, 2) for row in settings.TABLE)


def test_a_reader_given_an_environment_reads_that_one():
    from tpu_closure_fix.synccheck import hook

    assert hook.arm_from_environment({config.SYNC_CHECK_VAR: "0"}) == 0
    assert settings.of({config.TIMEOUT_VAR: "7"}).get(config.TIMEOUT_VAR) == 7


# --------------------------------------------------------------------------- every variable is a row
def _names_in(folder):
    names = set()
    for root, _, files in os.walk(folder):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(root, name), encoding="utf-8") as handle:
                    names.update(re.findall(r"TPU_CLOSURE_FIX[A-Z0-9_]*", handle.read()))
    return names


def test_every_variable_the_package_names_is_a_row_or_internal():
    named = _names_in(os.path.join(REPO, "tpu_closure_fix")) | _names_in(os.path.join(REPO, "startup"))
    rows = set(row.name for row in settings.TABLE)
    assert named - rows - set(settings.INTERNAL) == set()
    assert rows <= named


def test_twin_a_variable_outside_the_table_is_found(tmp_path):
    (tmp_path / "reader.py").write_text('import os\nos.environ.get("TPU_CLOSURE_FIX_NEW_KNOB")\n')
    assert _names_in(str(tmp_path)) - set(row.name for row in settings.TABLE) == {"TPU_CLOSURE_FIX_NEW_KNOB"}


#: Modules that name a row's variable in ``environ[...]`` or ``environ.get(...)`` and why that is no reading of a
#: setting by the package.
CHILD_SCRIPTS = {os.path.join("verify", "fresh.py"): "the source of a fresh interpreter's first statements, which "
                 "record the raw switch (parsed by the asking process) and hold the shim back",
                 os.path.join("synccheck", "launch.py"): "the hand-over of the check's channel: it writes the variable "
                 "into the environment the replicas inherit, and takes out only the value it wrote"}


def test_no_module_but_the_settings_reads_a_setting_from_the_environment():
    """``os.environ.get(NAME)`` / ``environ.get(NAME_VAR)`` of a row's variable appears in settings.py alone."""
    names = "|".join(re.escape(row.name) for row in settings.TABLE)
    constants = "ENV_VAR|SYNC_CHECK_VAR|LOG_VAR|DISABLE_VAR|ON_DIVERGENCE_VAR|GROUP_VAR|TIMEOUT_VAR|CHANNEL_VAR"
    pattern = re.compile(r"environ(\.get\(|\[)\s*(\"(%s)\"|(\w+\.)?(%s)\b)" % (names, constants))
    readers = []
    package = os.path.join(REPO, "tpu_closure_fix")
    for root, _, files in os.walk(package):
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(".py") and os.path.relpath(path, package) not in set(CHILD_SCRIPTS) | {"settings.py"}:
                with open(path, encoding="utf-8") as handle:
                    if pattern.search(handle.read()):
                        readers.append(os.path.relpath(path, REPO))
    assert readers == []
    assert pattern.search('raw = os.environ.get(SYNC_CHECK_VAR)')  # the twin: such a read is found

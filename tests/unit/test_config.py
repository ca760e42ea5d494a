"""TPU_CLOSURE_FIX parsing, and the startup module's copy of the switch and package list."""
import importlib.util
import os
import sys
import warnings

import pytest

from support.switch_warnings import assert_bad_value_lines
from tpu_closure_fix import config, settings, sites

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_startup():
    path = os.path.join(REPO, "startup", "_tpu_closure_fix_startup.py")
    spec = importlib.util.spec_from_file_location("_startup_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("raw", [None, "", "1", "true", "TRUE", "On", "yes", " YES ", "True"])
def test_enabling_values(raw):
    assert settings.parse_switch(raw) == (True, None)


@pytest.mark.parametrize("raw", ["0", "false", "FALSE", "off", "Off", "no", "NO", " 0 "])
def test_disabling_values(raw):
    assert settings.parse_switch(raw) == (False, None)


@pytest.mark.parametrize("raw", ["2", "maybe", "disable", "enabled", "-1", "0.0", "nope"])
def test_other_values_default_on_with_a_message(raw):
    enabled, problem = settings.parse_switch(raw)
    assert enabled is True
    assert "TPU_CLOSURE_FIX=%r" % raw in problem
    assert "1/true/on/yes" in problem and "0/false/off/no" in problem


def test_bad_value_warns_once(monkeypatch):
    monkeypatch.setattr(settings, "_said", set())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert settings.of({"TPU_CLOSURE_FIX": "bogus"}).get(config.ENV_VAR) is True
        assert settings.of({"TPU_CLOSURE_FIX": "bogus"}).get(config.ENV_VAR) is True
    assert [w.category for w in seen] == [config.TPUClosureFixWarning]


def test_startup_module_agrees_with_package():
    startup = load_startup()
    assert startup.OFF_VALUES == config.OFF_VALUES
    assert startup.WATCHED_PACKAGES == sites.top_level_packages()


def test_entry_points_name_the_watched_packages():
    """pyproject.toml's entry-point group ``tpu_closure_fix`` (wrapt, autowrapt) names every watched package."""
    with open(os.path.join(REPO, "pyproject.toml")) as handle:
        section = handle.read().split("[project.entry-points.tpu_closure_fix]", 1)[1].split("\n[", 1)[0]
    names = {}
    for line in section.splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = (part.strip() for part in line.split("=", 1))
            names[key.strip('"')] = value.strip('"')  # a dotted name is a quoted TOML key
    assert set(names) == sites.top_level_packages()
    assert set(names.values()) == {"_tpu_closure_fix_startup:on_watched_import"}


@pytest.mark.parametrize("raw,disabled", [("0", True), ("OFF", True), ("1", False), ("maybe", False), (None, False)])
def test_startup_module_switch(raw, disabled, monkeypatch):
    startup = load_startup()
    if raw is None:
        monkeypatch.delenv("TPU_CLOSURE_FIX", raising=False)
    else:
        monkeypatch.setenv("TPU_CLOSURE_FIX", raw)
    assert startup._disabled_by_environment() is disabled


def test_release_of_a_package_still_initializing_comes_only_from_its_own_distribution(tmp_path):
    """While a top-level package's __init__ runs (no __version__ yet), its release is read from the
    installed distribution of that name only when that distribution's __init__.py is the loaded file."""
    import types

    from tpu_closure_fix import releases

    wrapt_module = sys.modules["wrapt"] if "wrapt" in sys.modules else __import__("wrapt")
    fake = types.ModuleType("wrapt")
    fake.__spec__ = types.SimpleNamespace(_initializing=True)
    fake.__file__ = wrapt_module.__file__  # the installed distribution's own file: its release counts
    from importlib import metadata

    assert releases._release_while_initializing(fake) == metadata.version("wrapt")
    fake.__file__ = str(tmp_path / "wrapt" / "__init__.py")  # a copy elsewhere: never another copy's release
    assert releases._release_while_initializing(fake) is None
    fake.__file__ = wrapt_module.__file__
    fake.__spec__ = types.SimpleNamespace(_initializing=False)  # fully imported without __version__: unknown
    assert releases._release_while_initializing(fake) is None


@pytest.mark.parametrize("raw", ["0\u2003", "\u20030", "off\u00a0", "0\udce2\udc80\udc83", "\uff2f\uff26\uff26"])
def test_only_ascii_whitespace_and_case_are_ignored(raw):
    """The same under every locale: a C locale decodes U+2003 to surrogates, which str.strip() keeps, while
    a UTF-8 one strips U+2003 itself; so neither is stripped (the value is bad: warned about, enabled)."""
    enabled, problem = settings.parse_switch(raw)
    assert enabled is True and problem is not None
    assert "TPU_CLOSURE_FIX=%s is not an accepted value" % config.quote_value(raw) in problem  # escaped, one piece
    assert_bad_value_lines(problem)


@pytest.mark.parametrize("raw", ["off\n", "\t0 ", "\x0bNO\x0c", "\r\noff"])
def test_ascii_whitespace_is_ignored(raw):
    assert settings.parse_switch(raw) == (False, None)


@pytest.mark.parametrize("raw", ["0\u2003", "off\n", "\u20030", "0\udce2\udc80\udc83", " 0 ", "\uff2f\uff26\uff26"])
def test_startup_module_parses_like_the_package(raw, monkeypatch):
    startup = load_startup()
    monkeypatch.setenv("TPU_CLOSURE_FIX", raw)
    assert startup._disabled_by_environment() is (settings.parse_switch(raw)[0] is False)


@pytest.mark.parametrize("raw,shown", [("0", "0"), ("off", "off"), ("off\n", "'off\\n'"),
                                       ("0\u2003", "'0\\u2003'"), ("", "''"), ("a b", "'a b'")])
def test_values_are_shown_ascii_escaped_on_one_line(raw, shown):
    assert config.show_value(raw) == shown


@pytest.mark.parametrize("raw, every, bad", [
    ("\u2003", 0, True), ("5\u2003", 0, True), ("\u00a00", 0, True), ("0\udce2\udc80\udc83", 0, True),
    (" 7\n", 7, False), ("\t", 0, False), (" 0 ", 0, False)])
def test_sync_check_variable_parses_the_same_under_every_locale(raw, every, bad, monkeypatch):
    """TPU_CLOSURE_FIX_SYNC_CHECK: only ASCII whitespace is ignored, in the package and the start-up module:
    a Unicode space is a bad value, not 'unset', whatever the locale decodes it to."""
    parsed, problem = settings.parse_every(raw)
    assert (parsed, problem is not None) == (every, bad)
    startup = load_startup()
    monkeypatch.setenv("TPU_CLOSURE_FIX", "0")
    monkeypatch.setenv(config.SYNC_CHECK_VAR, raw)
    # the start-up module stays idle only when the sync check is plainly off (unset, empty, 0)
    assert startup._disabled_by_environment() is (every == 0 and not bad)

"""Every bad-value warning of a ``TPU_CLOSURE_FIX*`` variable fits 120 columns per line, as the user sees it.

Python prints a warning as ``path:line: TPUClosureFixWarning: `` + the message + the source line, so the message
starts on the line after that prefix (its first line is empty) and its own lines are wrapped at 120 columns
(``config.bad_value_message``). In-process: each variable's parser with short, long, spaced and non-ASCII
values. In a child interpreter (a script in ``tmp_path`` importing the shim, real start-up): each variable's
bad value, every stderr line at most 120 columns; the twin shows the same check refusing the message joined
into one line, the shape these warnings had before.
"""
import os
import subprocess
import sys
import warnings

import pytest

from support.switch_warnings import assert_bad_value_lines, too_wide
from tpu_closure_fix import config, integrations, settings
from tpu_closure_fix.config import CHANNEL_VAR, GROUP_VAR, ON_DIVERGENCE_VAR, TIMEOUT_VAR

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _disable(raw):
    return settings.parse_disable(raw, integrations.NAMES)


#: variable -> (its parser, what else the child's environment needs for the variable to be read, a bad value,
#: a command the next step must name)
VARIABLES = {
    config.ENV_VAR: (settings.parse_switch, {}, "maybe", "`export TPU_CLOSURE_FIX=0`"),
    config.LOG_VAR: (settings.parse_log_level, {}, "loud", "`unset TPU_CLOSURE_FIX_LOG`"),
    config.DISABLE_VAR: (_disable, {}, "accelerate,bogus", "`export TPU_CLOSURE_FIX_DISABLE=accelerate`"),
    config.SYNC_CHECK_VAR: (settings.parse_every, {}, "often", "`unset TPU_CLOSURE_FIX_SYNC_CHECK`"),
    ON_DIVERGENCE_VAR: (settings.parse_action, {config.SYNC_CHECK_VAR: "5"}, "stop",
                        "`export TPU_CLOSURE_FIX_SYNC_CHECK_ON_DIVERGENCE=raise`"),
    GROUP_VAR: (settings.parse_group, {config.SYNC_CHECK_VAR: "5"}, "all",
                "`export TPU_CLOSURE_FIX_SYNC_CHECK_GROUP=world`"),
    TIMEOUT_VAR: (settings.parse_timeout, {config.SYNC_CHECK_VAR: "5"}, "soon",
                  "`unset TPU_CLOSURE_FIX_SYNC_CHECK_TIMEOUT`"),
    CHANNEL_VAR: (settings.parse_channel, {config.SYNC_CHECK_VAR: "5"}, "any",
                  "`unset TPU_CLOSURE_FIX_SYNC_CHECK_CHANNEL`"),
}
#: The sync check's variables: their bad values go out on its logger, which no warnings filter mutes (a bad
#: ``..._ON_DIVERGENCE`` under ``-W ignore`` would silently leave ``warn``); the others are warnings.
ON_THE_LOGGER = (config.SYNC_CHECK_VAR, ON_DIVERGENCE_VAR, GROUP_VAR, TIMEOUT_VAR, CHANNEL_VAR)
#: Bad values of every kind a message quotes: a word, a huge value, one with spaces (wrapped at them), one of
#: escaped non-ASCII characters (10 columns each, no space: cut), a line break.
WIDE_VALUES = ["x" * 120000, "a rather long value " * 8, "\U0001f600" * 60, "-1\n", "0\u2003"]


@pytest.mark.parametrize("variable", sorted(VARIABLES))
@pytest.mark.parametrize("raw", ["bogus"] + WIDE_VALUES, ids=["word", "huge", "spaced", "emoji", "newline", "em-space"])
def test_every_bad_value_message_starts_after_the_prefix_and_keeps_to_120_columns(variable, raw):
    parse, _, _, _ = VARIABLES[variable]
    _, problem = parse(raw)
    assert problem is not None
    assert_bad_value_lines(problem)
    flat = " ".join(problem.split())
    assert flat.startswith("%s=%s" % (variable, " ".join(config.quote_value(raw).split())[:30])), flat
    assert "accepted:" in flat


@pytest.mark.parametrize("variable", sorted(VARIABLES))
def test_every_next_step_is_a_command_the_variable_accepts(variable):
    """Each command a message names (`export NAME=VALUE`, `unset NAME`) sets a value the variable's own parser
    takes without a warning."""
    parse, _, raw, command = VARIABLES[variable]
    _, problem = parse(raw)
    commands = problem.split("`")[1::2]
    assert "`%s`" % commands[0] in problem and command.strip("`") in commands
    for each in commands:
        verb, assignment = each.split(" ", 1)
        if verb == "export":
            name, value = assignment.split("=", 1)
            assert name == variable and parse(value)[1] is None, each
        else:
            assert (verb, assignment) == ("unset", variable) and parse(None)[1] is None, each


def _run_script(tmp_path, environ, warnings_option="default"):
    """A training script in ``tmp_path`` importing the shim, run as a user runs it (this interpreter, the
    installed start-up hook, this working tree's package first on the path), every inherited TPU_CLOSURE_FIX*
    variable removed and ``environ`` set; -W default: each warning shown once, whatever the caller's filters."""
    script = tmp_path / "train.py"
    script.write_text("import tpu_closure_fix\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith("TPU_CLOSURE_FIX")}
    env.pop("PYTHONWARNINGS", None)
    env["PYTHONPATH"] = os.pathsep.join((REPO, os.path.join(REPO, "startup")))
    env.update(environ)
    return subprocess.run([sys.executable, "-W", warnings_option, str(script)], env=env, capture_output=True, text=True,
                          timeout=300, cwd=str(tmp_path))


@pytest.mark.parametrize("variable", sorted(VARIABLES))
def test_a_bad_value_at_start_up_prints_lines_of_at_most_120_columns(variable, tmp_path):
    _, needs, raw, command = VARIABLES[variable]
    proc = _run_script(tmp_path, dict(needs, **{variable: raw}))
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    # the report points at the user's import line, not at the shim's own files
    location = "%s:1: %s" % (tmp_path / "train.py", "\n" if variable in ON_THE_LOGGER else "TPUClosureFixWarning:")
    assert proc.stderr.count(location) == 1, proc.stderr
    assert "%s=%s" % (variable, config.quote_value(raw)) in proc.stderr and command in proc.stderr, proc.stderr
    assert too_wide(proc.stderr) == [], proc.stderr


@pytest.mark.parametrize("variable", ON_THE_LOGGER)
@pytest.mark.parametrize("muted", ["-W", "PYTHONWARNINGS"])
def test_a_bad_sync_check_value_is_said_whatever_the_warnings_filters(variable, muted, tmp_path):
    _, needs, raw, command = VARIABLES[variable]
    environ = dict(needs, **{variable: raw})
    if muted == "PYTHONWARNINGS":
        environ["PYTHONWARNINGS"] = "ignore"
    proc = _run_script(tmp_path, environ, "ignore" if muted == "-W" else "default")
    assert proc.returncode == 0 and proc.stderr.count("%s=%s" % (variable, config.quote_value(raw))) == 1, proc.stderr


@pytest.mark.parametrize("variable", [config.LOG_VAR])
def test_twin_a_warning_is_muted_by_the_filters(variable, tmp_path):
    """What the logger path is for: a bad value said as a warning vanishes under ``-W ignore``."""
    _, needs, raw, _ = VARIABLES[variable]
    proc = _run_script(tmp_path, dict(needs, **{variable: raw}), "ignore")
    assert proc.returncode == 0 and variable not in proc.stderr, proc.stderr


@pytest.mark.parametrize("variable", sorted(VARIABLES))
def test_twin_the_same_message_on_one_line_is_refused_by_the_width_check(variable, tmp_path):
    """The one-line shape these warnings had (the whole message after Python's prefix) fails the check the
    start-up test applies, even at the shortest location a warning has there (the script's own line)."""
    parse, _, raw, _ = VARIABLES[variable]
    _, problem = parse(raw)
    script = str(tmp_path / "train.py")
    one_line = " ".join(problem.split())
    assert len(too_wide(warnings.formatwarning(one_line, config.TPUClosureFixWarning, script, 1))) == 1
    assert too_wide(warnings.formatwarning(problem, config.TPUClosureFixWarning, script, 1)) == []


def test_status_names_a_bad_sync_check_value_on_one_line(monkeypatch):
    """``status`` quotes the warning's first sentence on its own line, not the warning's line breaks."""
    from tpu_closure_fix.outcome import sync_line

    line = sync_line.line({}, (True, "armed"), {config.SYNC_CHECK_VAR: "often"})
    assert line == ("zero-code sync check: off: TPU_CLOSURE_FIX_SYNC_CHECK='often' is not an accepted value (the "
                    "training process warns and leaves it off)")


@pytest.mark.parametrize("variable", sorted(VARIABLES))
def test_a_backquote_in_the_bad_value_never_glues_the_accepted_values_into_one_cut_word(variable):
    """A value holding a backquote (found by the property test: ``'\\x1f\\x08`'``) is the user's text, not a
    command: the accepted values still wrap at spaces, never cut mid-word."""
    parse, _, _, _ = VARIABLES[variable]
    _, problem = parse("\x1f\x08`")
    _, plain = parse("bogus")
    first_plain = " ".join(plain.split("\n")[1:3])
    accepted = first_plain.split("accepted: ", 1)[1].split(".")[0].split()
    assert all(word in problem.split() or word.strip("()") in problem for word in accepted), problem
    assert_bad_value_lines(problem)

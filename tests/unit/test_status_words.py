"""Words that say what will happen: ``status`` speaks of the training process, never of the CLI's own.

* the zero-code sync check's line: what the training process will do with ``TPU_CLOSURE_FIX_SYNC_CHECK``, rule
  by rule (the CLI's process imports no ``torch.optim``: it used to say "not armed" because of that);
* a switch's bad value seen by the CLI: the warning points at the environment, not at the CLI's source line;
* ``--python`` to an interpreter that hangs: one line on stderr after a few seconds saying what is awaited, and
  ``--timeout SECONDS`` (a bad value: a short message naming the flag and the accepted values).

(A relative ``PYTHONPATH``: tests/unit/test_fresh_status.py.)
"""
import os
import subprocess
import sys
import time

import pytest

from tpu_closure_fix import cli
from tpu_closure_fix.outcome import sync_line
from tpu_closure_fix.verify import fresh

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ACTIVE = (True, "armed at interpreter start by the start-up module")
VAR = "TPU_CLOSURE_FIX_SYNC_CHECK"


# --------------------------------------------------------------------------- the zero-code sync check's line
@pytest.mark.parametrize("environ, flags, hook, expected", [
    # 1. unset or empty: off
    ({}, {}, ACTIVE, "off (TPU_CLOSURE_FIX_SYNC_CHECK unset)"),
    ({VAR: " "}, {}, ACTIVE, "off (TPU_CLOSURE_FIX_SYNC_CHECK unset)"),
    # 2. the interpreter ignores the environment
    ({VAR: "5"}, {"ignore_environment": True}, ACTIVE,
     "off: python -E/-I ignores the environment, TPU_CLOSURE_FIX_SYNC_CHECK included"),
    # 3. a bad value: the training process warns and leaves it off
    ({VAR: "often"}, {}, ACTIVE, "off: TPU_CLOSURE_FIX_SYNC_CHECK='often' is not an accepted value (the training "
                                 "process warns and leaves it off)"),
    # 4. zero: off
    ({VAR: "0"}, {}, ACTIVE, "off (TPU_CLOSURE_FIX_SYNC_CHECK=0)"),
    # 5. the shim never activates there
    ({VAR: "5"}, {}, (False, "tpu_closure_fix is not installed"),
     "not armed: the start-up hook does not run there, and only the shim's activation arms it (a training script "
     "that imports tpu_closure_fix arms it)"),
    # 6. armed: what the training process will do
    ({VAR: "5"}, {}, ACTIVE, "armed at the first optimizer step of a process that imports torch: every 5 steps, "
                             "on divergence: warn"),
    ({VAR: "1", VAR + "_ON_DIVERGENCE": "raise"}, {}, ACTIVE,
     "armed at the first optimizer step of a process that imports torch: every 1 step, on divergence: raise"),
    ({VAR: "5", VAR + "_ON_DIVERGENCE": "stop"}, {}, (None, "not asked"),
     "armed at the first optimizer step of a process that imports torch: every 5 steps, on divergence: warn "
     "(TPU_CLOSURE_FIX_SYNC_CHECK_ON_DIVERGENCE='stop' is not an accepted value)"),
])
def test_the_sync_check_line_rule_by_rule(environ, flags, hook, expected):
    assert sync_line.line({"flags": flags}, hook, environ) == sync_line.HEAD + expected


def test_status_in_a_torch_only_venv_says_the_training_process_arms_the_check(tmp_path):
    """The real command in this venv (torch, no framework): the CLI's process never imports torch.optim; the
    line says what a training process that does will do."""
    env = dict(os.environ, PYTHONPATH=REPO, TPU_CLOSURE_FIX_SYNC_CHECK="5")
    env.pop("TPU_CLOSURE_FIX", None)
    proc = subprocess.run([sys.executable, "-m", "tpu_closure_fix", "status"], env=env, capture_output=True,
                          text=True, timeout=300, cwd=str(tmp_path))
    said = " ".join(proc.stdout.split())
    assert ("zero-code sync check: armed at the first optimizer step of a process that imports torch: every 5 steps, "
            "on divergence: warn") in said, proc.stdout
    assert "not imported in this process" not in said


# --------------------------------------------------------------------------- a switch's bad value seen by the CLI
def _console_script(tmp_path):
    """A console script as pip writes it, named as the command is."""
    script = tmp_path / "bin" / "tpu-closure-fix"
    script.parent.mkdir()
    script.write_text("import re\nimport sys\nfrom tpu_closure_fix.cli import main\nif __name__ == '__main__':\n"
                      "    sys.exit(main())\n")
    return str(script)


@pytest.mark.parametrize("how", ["console script", "python -m"])
def test_a_bad_switch_seen_by_the_cli_points_at_the_environment(tmp_path, how):
    argv = [sys.executable] + ([_console_script(tmp_path)] if how == "console script" else ["-m", "tpu_closure_fix"])
    env = dict(os.environ, PYTHONPATH=REPO, TPU_CLOSURE_FIX="bogus")
    proc = subprocess.run(argv + ["--version"], env=env, capture_output=True, text=True, timeout=300,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith("the environment variable TPU_CLOSURE_FIX=bogus:"), proc.stderr
    assert "from tpu_closure_fix.cli import main" not in proc.stderr and "runpy" not in proc.stderr, proc.stderr
    assert "TPU_CLOSURE_FIX='bogus' is not an accepted value" in proc.stderr


def test_twin_a_bad_switch_seen_by_a_user_script_points_at_its_import_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import tpu_closure_fix\n")
    env = dict(os.environ, PYTHONPATH=REPO, TPU_CLOSURE_FIX="bogus")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300,
                          cwd=str(tmp_path))
    assert proc.stderr.splitlines()[0].startswith("%s:1: TPUClosureFixWarning" % script), proc.stderr


# --------------------------------------------------------------------------- an interpreter that hangs
def _hanging_python(tmp_path):
    """An executable that never answers (as an interpreter stuck on a network file system does)."""
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\nsleep 300\n")
    path.chmod(0o755)
    return str(path)


def test_waiting_for_an_interpreter_says_what_it_waits_for_once(tmp_path):
    said = []
    started = time.monotonic()
    got, error = fresh.run_status(python=_hanging_python(tmp_path), flags=[], timeout=2, notice_after=0.5,
                                  notice=said.append)
    assert time.monotonic() - started < 30 and got is None, error
    assert error.startswith("%s did not list its call sites within 2 s (--timeout; its processes were ended). Fix: "
                            "make `%s -c pass` return, or give it more time: `--timeout SECONDS`"
                            % ((tmp_path / "python",) * 2)), error
    assert said == [fresh.waiting_line(str(tmp_path / "python"), 2)], said
    assert said[0].startswith("tpu-closure-fix: waiting for %s to list its call sites" % (tmp_path / "python"))
    assert "--timeout SECONDS" in said[0]


def test_twin_an_interpreter_that_answers_in_time_gets_no_waiting_line():
    said = []
    fresh.run_status(flags=[], notice_after=120, notice=said.append)
    assert said == []


def test_status_timeout_flag_ends_the_wait_with_its_line_on_stderr(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, COLUMNS="80")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tpu_closure_fix", "status", "--python", _hanging_python(tmp_path),
                           "--timeout", "7"], env=env, capture_output=True, text=True, timeout=300,
                          cwd=str(tmp_path))
    assert proc.returncode == 3 and time.monotonic() - started < 60, proc.stdout + proc.stderr
    waited = " ".join(proc.stderr.split())
    assert waited.startswith("tpu-closure-fix: waiting for %s to list its call sites" % (tmp_path / "python"))
    assert "gives up after 7 s" in waited and max(len(line) for line in proc.stderr.splitlines()) <= 80
    assert "did not list its call sites within 7 s" in " ".join(proc.stdout.split()), proc.stdout


@pytest.mark.parametrize("command", ["status", "check"])
@pytest.mark.parametrize("value", ["soon", "0", "-1", "nan"])
def test_a_bad_timeout_names_the_flag_and_the_accepted_values(command, value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--timeout", value])
    err = " ".join(capsys.readouterr().err.split())
    assert exit_info.value.code == 2
    assert "error: argument --timeout: %r is not a number of seconds > 0 (e.g. 600)" % value in err, err


def test_the_timeout_flag_is_documented_in_the_help(capsys):
    for command in ("status", "check"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        assert "--timeout SECONDS" in capsys.readouterr().out

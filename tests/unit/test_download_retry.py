"""A failed package download is tried once more before a run fails: the rule of scripts/download_retry.py (the
Python scripts) and scripts/retry.sh (the shell scripts), each with a command that fails once."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))

import download_retry  # noqa: E402


class Result(object):
    def __init__(self, returncode):
        self.returncode = returncode


def attempts(*codes):
    """An attempt that returns these exit codes in turn, and the list of its calls."""
    calls = []

    def attempt():
        calls.append(len(calls))
        return Result(codes[len(calls) - 1])
    return attempt, calls


def test_a_command_failing_once_succeeds_on_its_second_try(monkeypatch):
    monkeypatch.setenv("TPU_CLOSURE_FIX_RETRY_PAUSE", "0")
    said = []
    attempt, calls = attempts(1, 0)
    assert download_retry.retry_once(attempt, "fetching x", log=said.append).returncode == 0
    assert len(calls) == 2 and said == ["== fetching x failed; trying once more in 0 s"]


def test_a_command_failing_twice_fails_and_one_that_succeeds_runs_once(monkeypatch):
    monkeypatch.setenv("TPU_CLOSURE_FIX_RETRY_PAUSE", "0")
    attempt, calls = attempts(2, 3, 0)
    assert download_retry.retry_once(attempt, "x", log=lambda line: None).returncode == 3 and len(calls) == 2
    attempt, calls = attempts(0)
    assert download_retry.retry_once(attempt, "x", log=lambda line: None).returncode == 0 and len(calls) == 1


def shell(command, tmp_path):
    env = dict(os.environ, TPU_CLOSURE_FIX_RETRY_PAUSE="0", MARK=str(tmp_path / "tried"))
    return subprocess.run(["bash", "-c", 'set -euo pipefail; source "%s"; %s' % (
        os.path.join(REPO, "scripts", "retry.sh"), command)], env=env, capture_output=True, text=True, timeout=60)


def test_the_shell_rule_retries_a_command_failing_once(tmp_path):
    proc = shell('retry_once bash -c \'[ -e "$MARK" ] || { touch "$MARK"; exit 3; }\'; echo after', tmp_path)
    assert proc.returncode == 0 and proc.stdout == "after\n", proc.stderr
    assert "failed (exit 3); trying once more" in proc.stderr


def test_the_shell_rule_fails_a_command_failing_twice(tmp_path):
    proc = shell('retry_once bash -c \'echo try >> "$MARK"; exit 4\'; echo after', tmp_path)
    assert proc.returncode == 4 and "after" not in proc.stdout
    assert (tmp_path / "tried").read_text() == "try\ntry\n"

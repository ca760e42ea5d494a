"""Every SyncCheck report takes one path (``report.say``): the ``tpu_closure_fix.synccheck`` logger, never
``warnings``. Where no logging is configured it reaches stderr through Python's last-resort handler (the package
logger's NullHandler does not swallow it); where the program configured logging it goes through those handlers,
once; no warnings filter and no root threshold mutes it; its record points at the user's line.
"""
import io
import logging
import os
import subprocess
import sys
import warnings

import pytest

from tpu_closure_fix.synccheck import report

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Stderr(object):
    def __init__(self, capsys):
        self.capsys = capsys

    def getvalue(self):
        return self.capsys.readouterr().err


@pytest.fixture
def unconfigured(monkeypatch, capsys):
    """No logging configured; what reaches stderr (pytest's capture of it). pytest puts its own handlers on the
    root logger for the test's call: ``logging.root.handlers`` is replaced by an empty list that ignores them."""
    class Unconfigured(list):
        def append(self, handler):  # pytest's capture handler, added once the test's call starts
            pass

    monkeypatch.setattr(logging.root, "handlers", Unconfigured())
    return Stderr(capsys)


def test_with_no_logging_configured_a_report_reaches_stderr_once_through_the_last_resort(unconfigured):
    report.say("SyncCheck: a report", where=("train.py", 7))
    assert unconfigured.getvalue() == "train.py:7: SyncCheck: a report\n"


def test_twin_without_the_last_resort_the_package_loggers_null_handler_would_swallow_it(unconfigured, monkeypatch):
    """What ``say`` adds: Python's own rule finds the package logger's NullHandler and writes nothing."""
    logging.getLogger(report.logger.name).warning("a plain record")
    assert unconfigured.getvalue() == ""
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("tpu_closure_fix").handlers)


def test_where_logging_is_configured_the_report_goes_through_its_handlers_once(unconfigured, monkeypatch):
    configured = io.StringIO()
    handler = logging.StreamHandler(configured)
    handler.setFormatter(logging.Formatter("%(levelname)s %(pathname)s:%(lineno)d %(sync_check_message)s"))
    monkeypatch.setattr(logging.root, "handlers", [handler])
    report.say("SyncCheck: a report", where=("train.py", 7))
    assert configured.getvalue() == "WARNING train.py:7 SyncCheck: a report\n" and unconfigured.getvalue() == ""


@pytest.mark.parametrize("mute", ["filter", "root-threshold"])
def test_no_warnings_filter_and_no_root_threshold_mutes_a_report(unconfigured, monkeypatch, mute):
    if mute == "root-threshold":
        monkeypatch.setattr(logging.root, "level", logging.CRITICAL)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report.say("SyncCheck: a report", where=("train.py", 7))
    assert unconfigured.getvalue().count("SyncCheck: a report") == 1


def test_a_rank_that_does_not_speak_logs_at_debug_only(unconfigured):
    report.say("SyncCheck: a report", where=("train.py", 7), speaker=False)
    assert unconfigured.getvalue() == ""


def test_the_info_line_is_rank_0s_alone(monkeypatch):
    from support.said import said

    with said() as heard:
        report.info("sync check at step 5: identical over ranks 0-1", 0)
        report.info("sync check at step 5: identical over ranks 0-1", 1)
    assert [r.levelno for r in heard.records] == [logging.INFO, logging.DEBUG]


def test_in_a_fresh_interpreter_with_pythonwarnings_ignore_a_report_is_on_stderr():
    code = "from tpu_closure_fix.synccheck import report; report.say('SyncCheck: a report', ('t.py', 1))"
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0 and proc.stderr.count("t.py:1: SyncCheck: a report") == 1, proc.stderr


def _modules_saying(words):
    """The package's modules whose code holds ``words`` (a message written there)."""
    found = []
    package = os.path.join(REPO, "tpu_closure_fix")
    for root, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(root, name), encoding="utf-8") as handle:
                    if words in handle.read():
                        found.append(os.path.relpath(os.path.join(root, name), package))
    return found


@pytest.mark.parametrize("words", ["sync check stands down for", "Every rank raises ReplicaDivergenceError at"])
def test_each_message_of_the_zero_code_check_is_written_once_in_the_report_module(words):
    assert _modules_saying(words) == [os.path.join("synccheck", "report.py")]


def test_twin_a_message_written_in_many_modules_is_found():
    assert _modules_saying("def say(message") == [os.path.join("synccheck", "report.py")]
    assert _modules_saying("import ") != [os.path.join("synccheck", "report.py")]


def test_a_stand_down_is_said_once_per_key_naming_the_optimizer_and_the_step():
    from support.said import fresh, said

    fresh()
    with said() as heard:
        for _ in range(2):
            report.stood_down("SGD over fc.weight", 7, "a peer gone", ("stood down", "key-1"))
        report.stood_down("SGD over fc.weight", 9, "a peer gone", ("stood down", "key-2"))
    assert heard.spoken == ["tpu-closure-fix: the zero-code sync check stands down for SGD over fc.weight at step %d: "
                            "a peer gone. Training goes on." % step for step in (7, 9)]

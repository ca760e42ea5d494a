"""Every line ``status`` and ``check`` print fits the terminal, for every outcome; ``--json`` stays complete.

The renderer is driven with payloads of each outcome class, made as wide as real ones were: a 1.8.6 release
whose every site is skipped with a long reason, an import error quoting a long message, a ``--target`` folder
deep in a home directory, ``--all`` with the longest site names, check's self-test failures and IR excerpts;
at ``COLUMNS`` 60, 80, 120 and unset (120 at most, the terminal's width where it is narrower, down to 60).
The CLI's argparse usage and errors fit the same widths.
"""
import os
import subprocess
import sys

import pytest

from support.outcomes import evidence as evidence_of
from tpu_closure_fix import check, textfit
from tpu_closure_fix.outcome import decide, render
from tpu_closure_fix.outcome.records import IMPORT_FAILED

WIDTH = 120
#: ``COLUMNS`` as a terminal sets it (None: unset) and the widest line it allows.
TERMINALS = [(None, 120), ("60", 60), ("80", 80), ("120", 120), ("200", 120), ("40", 60)]
SITE = "/home/user/venv/lib/python3.11/site-packages"
DEEP = "/home/user/projects/a-rather-long-project-name/with/a/deep/folder/structure/for/its/dependencies/deps"
FABRIC = ("lightning_fabric.plugins.precision.xla", "XLAPrecision.optimizer_step")
LONGEST = ("pytorch_lightning.core.optimizer", "LightningOptimizer._LightningOptimizer__optimizer_step")
LONG_REASON = ("cannot read the release of pytorch_lightning (no __version__): ModuleNotFoundError: No module "
               "named 'pkg_resources' raised while importing pytorch_lightning.utilities.imports from "
               + SITE + "/pytorch_lightning/utilities/imports.py")


def facts(**changes):
    base = {"executable": "/home/user/venv/bin/python", "version": "3.11.7", "startup_loaded": True,
            "startup_armed": True, "shim_at_start": False, "switch": None,
            "flags": {"no_site": False, "isolated": False, "ignore_environment": False, "no_user_site": False},
            "shim_origin": SITE + "/tpu_closure_fix/__init__.py", "site_dirs": [SITE], "pth_in": [SITE]}
    base.update(changes)
    return base


def record(verdict, site=FABRIC, reason="", distribution="pytorch-lightning (vendored pytorch_lightning)",
           release="1.8.6"):
    return {"distribution": distribution, "release": release, "module": site[0], "method": site[1],
            "verdict": verdict, "reason": reason, "variant": None, "integration": "lightning"}


def payload(records, uncovered=(), **fact_changes):
    return {"facts": facts(**fact_changes), "records": records, "shim_version": "0.1.0", "shim_path": SITE,
            "sync_check": "zero-code sync check: off (TPU_CLOSURE_FIX_SYNC_CHECK unset)",
            "uncovered": list(uncovered), "scan_error": None, "compiled_only": []}


SKIPPED = [record("skipped", (LONGEST[0] + str(i), LONGEST[1]), LONG_REASON) for i in range(5)]
UNCOVERED = [{"file": SITE + "/some_framework/strategies/xla_strategy_with_a_long_name.py", "line": 1234,
              "module": "some_framework.strategies.xla_strategy_with_a_long_name",
              "function": "XLAStrategyWithALongName.optimizer_step_with_closure"}] * 3
#: (outcome, payload, error, --all) of every status outcome class, each as wide as found in real runs
STATUS_CASES = {
    "protected": (payload([record("patched"), record("guarded", LONGEST), record("fixed upstream")]), None, False),
    "nothing to protect (--all)": (payload([record("not installed", LONGEST, release=None),
                                            record("not in this release", FABRIC)]), None, True),
    "unprotected (skipped sites)": (payload([record("patched")] + SKIPPED), None, False),
    "unprotected (start-up hook inactive)": (payload([record("patched", LONGEST)] * 4, startup_armed=False,
                                                     shim_origin=DEEP + "/tpu_closure_fix/__init__.py",
                                                     pth_in=[]), None, False),
    "unprotected (switched off)": (payload([record("disabled", reason="TPU_CLOSURE_FIX=0")], switch="0",
                                           startup_armed=False), None, False),
    "could not verify (import failed)": (payload([record("failed", LONGEST, IMPORT_FAILED + LONG_REASON)]),
                                         None, False),
    "could not verify (uncovered)": (payload([record("patched")], uncovered=UNCOVERED), None, False),
    "could not verify (no report)": (None, "PYTHONPATH holds 'deps', relative to the working directory: "
                                           + LONG_REASON, False),
}


def widest(text):
    return max(len(line) for line in text.splitlines())


def words(text):
    """The characters of ``text`` but its white space and the shell continuations (`` \\`` at a line's end) of a
    command laid out on lines of its own: a word longer than a narrow terminal's line is cut there."""
    return ["".join(text.replace(" \\\n", " ").split())]


@pytest.mark.parametrize("columns, limit", TERMINALS)
@pytest.mark.parametrize("case", sorted(STATUS_CASES))
def test_every_status_line_fits_the_terminal(case, columns, limit, monkeypatch):
    _terminal(monkeypatch, columns)
    given, error, show_all = STATUS_CASES[case]
    evidence = evidence_of(given, error)
    outcome = decide.decide(evidence)
    assert case.startswith(outcome.name), (case, outcome.name)  # the payload gives its class
    text = render.text(evidence, outcome, show_all=show_all)
    assert widest(text) <= limit, "%s: a line of %d columns:\n%s" % (case, widest(text), text)
    # the outcome is wrapped, never shortened: its words are all there, in order
    assert " ".join(words(outcome.reason)) in " ".join(words(text)), text
    # the distribution and release cells are never cut
    for site in (given or {}).get("records") or []:
        if show_all or site["verdict"] not in ("not installed", "not in this release"):
            assert site["distribution"] in text and (site["release"] or "-") in text, text


def _terminal(monkeypatch, columns):
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)


def test_the_json_keeps_what_the_text_elides():
    given = payload([record("not installed", LONGEST, release=None)])
    evidence = evidence_of(given)
    outcome = decide.decide(evidence)
    result = render.json_object(evidence, outcome)
    text = render.text(evidence, outcome, show_all=True, width=120)
    assert all(record["method"] == LONGEST[1] for record in result["sites"])
    assert "%s:%s" % LONGEST not in text and textfit.ELLIPSIS in text  # elided in the table only


def events_of(sites, untested=(), error=None):
    return {"ok": False, "error": error, "sites": sites, "untested": list(untested)}


def graph_of(sites, error=None, untested=()):
    return {"ok": error is None, "error": error, "sites": sites, "untested": list(untested)}


SITE_NAME = "%s:%s" % LONGEST
IR = ["%%%d = f32[128,1024]{1,0} xla::cross_replica_sum(%%%d), replica_groups=((0, 1, 2, 3, 4, 5, 6, 7)), "
      "scale=0.125, pin_layout=false, groups=8, xla_shape=f32[128,1024]{1,0}" % (i, i - 1) for i in range(1, 6)]
BUGGY = ["reduce_gradients(no grads)", "forward", "backward", "step", "mark_step", "barrier", "zero_grad",
         "forward", "backward"]


def check_case(name):
    """(outcome, status, events, graph, graph_unavailable) of each outcome class of ``check``."""
    good_graph = graph_of({SITE_NAME: {"verdict": "patched", "wrapped_by_shim": True, "all_reduce_count": 1,
                                       "operands_from_backward": True, "update_consumes_all_reduce": True,
                                       "excerpt": IR}})
    good_events = events_of([{"site": SITE_NAME, "verdict": "patched", "ok": True, "error": None,
                              "events": ["forward", "backward", "reduce_gradients", "step", "mark_step"] * 3}],
                            untested=[{"site": "x" * 90 + ":Step.step", "verdict": "guarded",
                                       "reason": LONG_REASON}])
    if name == "protected":
        given = payload([record("patched", LONGEST), record("guarded", ("x" * 90, "Step.step"))])
        tests = decide.SelfTests(good_events, good_graph, None)
    elif name == "unprotected":
        given = payload([record("patched", LONGEST)] + SKIPPED)
        bad = events_of([{"site": SITE_NAME, "verdict": "patched", "ok": False, "error": None, "events": BUGGY}])
        tests = decide.SelfTests(bad, graph_of({SITE_NAME: {
            "verdict": "patched", "all_reduce_count": 0, "operands_from_backward": False,
            "update_consumes_all_reduce": False, "excerpt": IR}}), None)
    elif name == "could not verify":
        given = payload([record("failed", LONGEST, IMPORT_FAILED + LONG_REASON)])
        failed = events_of([{"site": SITE_NAME, "verdict": "patched", "ok": False, "events": [],
                             "error": "TypeError: " + LONG_REASON}], error=LONG_REASON)
        tests = decide.SelfTests(failed, graph_of({SITE_NAME: {"verdict": "patched",
                                                                "error": "RuntimeError: " + LONG_REASON}}), None)
    else:
        given = payload([record("not installed", LONGEST, release=None)])
        tests = decide.SelfTests(check._not_run(check.NOT_RUN[3]), None, check.NOT_RUN[3])
    evidence = evidence_of(given)
    return evidence, decide.decide(evidence, tests), tests


@pytest.mark.parametrize("columns, limit", TERMINALS)
@pytest.mark.parametrize("name", ["protected", "unprotected", "could not verify", "nothing to protect"])
def test_every_check_line_fits_the_terminal(name, columns, limit, monkeypatch):
    _terminal(monkeypatch, columns)
    evidence, outcome, tests = check_case(name)
    assert outcome.name == name, outcome
    text = render.text(evidence, outcome, sections=check.self_test_sections(tests, evidence.records))
    assert widest(text) <= limit, "%s: a line of %d columns:\n%s" % (name, widest(text), text)
    assert " ".join(words(outcome.reason)) in " ".join(words(text)), text


# --------------------------------------------------------------------------- the helpers, rule by rule
def test_elide_keeps_both_ends_and_the_width():
    assert textfit.elide("short", 10) == "short"
    cut = textfit.elide("abcdefghijklmnopqrstuvwxyz", 12)
    assert len(cut) == 12 and cut.startswith("abcd") and cut.endswith("vwxyz") and textfit.ELLIPSIS in cut
    assert textfit.elide("abcdefghijklmnopqrstuvwxyz", 12, keep_end=False) == "abcdefghi" + textfit.ELLIPSIS


def test_wrap_breaks_at_spaces_indents_continuations_and_cuts_only_overlong_words():
    line = "  " + " ".join("word%d" % i for i in range(60))
    lines = textfit.wrap(line, 50)
    assert len(lines) > 1 and all(len(piece) <= 50 for piece in lines)
    assert lines[0].startswith("  word0") and all(piece.startswith("  " + textfit.CONTINUATION + "word")
                                                  for piece in lines[1:])
    assert " ".join(" ".join(lines).split()) == line.strip()
    assert textfit.wrap("fits", 50) == ["fits"]
    long_path = "/" + "x" * 130
    assert all(len(piece) <= 120 for piece in textfit.wrap("at " + long_path))


def test_wrap_never_breaks_a_command_a_reader_copies():
    line = "UNPROTECTED: " + "word " * 19 + "Fix: `unset TPU_CLOSURE_FIX` and `pip install /home/user/clone` then more."
    lines = textfit.wrap(line, 120)
    assert len(lines) > 1 and all(len(piece) <= 120 for piece in lines)
    assert any("`unset TPU_CLOSURE_FIX`" in piece for piece in lines), lines
    assert any("`pip install /home/user/clone`" in piece for piece in lines), lines
    assert " ".join(" ".join(lines).split()) == line


def test_hanging_wraps_the_last_cell_under_its_column():
    lines = textfit.hanging("a" * 40 + "  ", "b " * 80, 120)
    assert len(lines) > 1 and all(len(line) <= 120 for line in lines)
    assert all(line.startswith(" " * 42 + "b") for line in lines[1:])


def test_a_table_keeps_short_reasons_on_their_rows_and_long_ones_below_full_site_names():
    short = [record("disabled", FABRIC, "TPU_CLOSURE_FIX=0", distribution="lightning-fabric", release="2.6.6"),
             record("patched", LONGEST, distribution="pytorch-lightning", release="1.8.6")]
    lines = render.table(short, width=WIDTH).splitlines()
    assert len(lines) == 4 and lines[2].endswith("disabled (TPU_CLOSURE_FIX=0)"), lines
    long = [record("skipped", FABRIC, LONG_REASON, distribution="lightning-fabric", release="2.6.6")]
    lines = render.table(long, width=WIDTH).splitlines()
    assert "%s:%s  skipped" % FABRIC in lines[2], lines  # the site is not elided; the reason wraps below
    assert " ".join(" ".join(lines[2:]).split()).endswith("skipped (%s)" % LONG_REASON)
    assert len(lines) > 3 and all(len(line) <= WIDTH for line in lines), lines


@pytest.mark.parametrize("case", sorted(STATUS_CASES))
def test_every_table_line_fits_before_the_outcome_is_wrapped(case):
    """The table fits on its own: its heading and rule are never wrapped by the outcome's wrapping (a heading
    broken after ``site`` puts ``verdict`` on a line of its own, above no column)."""
    given, _, show_all = STATUS_CASES[case]
    if not given:
        return
    table = render.table(given["records"], show_all=show_all, width=WIDTH)
    assert widest(table) <= WIDTH, "%s: a line of %d columns:\n%s" % (case, widest(table), table)


@pytest.mark.parametrize("verdict", ["failed", "patched", "disabled"])
def test_the_heading_holds_every_column_whatever_the_verdicts_width(verdict):
    """Every verdict shorter than the word ``verdict`` (pytorch-lightning 1.8.6 without pkg_resources: every row
    ``failed`` with a long reason): the heading and its rule still fit one line each."""
    rows = [record(verdict, LONGEST, IMPORT_FAILED + LONG_REASON, distribution="lightning-lite | "
                   "pytorch-lightning", release="-")]
    lines = render.table(rows, width=WIDTH).splitlines()
    assert lines[0].split() == ["distribution", "release", "site", "verdict"], lines[:2]
    assert len(lines[0]) <= WIDTH and len(lines[1]) <= WIDTH, lines[:2]
    assert len(lines[1].split()) == 4 and lines[1].split()[-1] == "-" * 7, lines[:2]


# --------------------------------------------------------------------------- the CLI's usage, help and errors
LONG_PATH = "/nonexistent/home/user/projects/a-rather-long-project-name/with/a/deep/folder/venv/bin/python"
#: Every error argparse gives for what a user types wrong, and every help page.
CLI_ARGS = {
    "status --python missing": ["status", "--python", LONG_PATH],
    "status --python not on PATH": ["status", "--python", "python3.99-that-is-not-installed"],
    "status --script missing": ["status", "--script", LONG_PATH.replace("bin/python", "train_on_tpu.py")],
    "status --timeout bad": ["status", "--timeout", "soon"],
    "status unknown option": ["status", "--verbose-and-a-rather-long-option-name"],
    "check --python missing": ["check", "--python", LONG_PATH],
    "check --xla-python missing": ["check", "--xla-python", LONG_PATH],
    "check --script missing": ["check", "--script", LONG_PATH.replace("bin/python", "train_on_tpu.py")],
    "check --timeout bad": ["check", "--timeout", "0"],
    "run --sync-check bad": ["run", "--sync-check", "often", "--", "python"],
    "unknown command": ["statuss"],
    "help": ["--help"],
    "status --help": ["status", "--help"],
    "check --help": ["check", "--help"],
    "run --help": ["run", "--help"],
    "demo --help": ["demo", "--help"],
}


@pytest.mark.parametrize("columns, limit", TERMINALS)
@pytest.mark.parametrize("case", sorted(CLI_ARGS))
def test_every_cli_usage_help_and_error_line_fits_the_terminal(case, columns, limit, monkeypatch, capsys):
    from tpu_closure_fix import cli

    _terminal(monkeypatch, columns)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(CLI_ARGS[case])
    out, err = capsys.readouterr()
    printed = out + err
    assert exit_info.value.code == (0 if "help" in case else 2), printed
    assert printed.strip() and widest(printed) <= limit, "%s: a line of %d columns:\n%s" % (case, widest(printed),
                                                                                           printed)
    if "help" not in case:
        assert "error: " in err and "usage: " in err, err


def test_the_real_console_error_of_a_missing_python_fits_80_columns(tmp_path):
    """The command as a user runs it: ``status --python /nonexistent/python`` was one line of 162 columns."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, COLUMNS="80", PYTHONPATH=repo)
    proc = subprocess.run([sys.executable, "-m", "tpu_closure_fix", "status", "--python", LONG_PATH], env=env,
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 2 and widest(proc.stderr) <= 80, proc.stderr
    assert "is not an executable file" in " ".join(proc.stderr.split())


@pytest.mark.parametrize("columns, expected", [(None, 120), ("", 120), ("abc", 120), ("80", 80), ("60", 60),
                                               ("59", 60), ("20", 60), ("121", 120), ("500", 120), (" 100 ", 100)])
def test_the_width_reads_columns_clamped_to_60_through_120(columns, expected):
    assert textfit.width({} if columns is None else {"COLUMNS": columns}) == expected


def test_a_narrow_terminal_lists_each_site_as_a_block_with_its_distribution_and_release_whole():
    rows = [record("failed", LONGEST, IMPORT_FAILED + LONG_REASON, distribution="lightning-lite | pytorch-lightning",
                   release="1.8.6")]
    narrow = render.table(rows, width=60).splitlines()
    assert narrow[0] == "lightning-lite | pytorch-lightning 1.8.6", narrow
    assert all(len(line) <= 60 for line in narrow) and narrow[2].lstrip().startswith("failed (import failed: ")
    # the twin: at 120 columns the same row is a table row, its distribution and release whole on it
    wide = render.table(rows, width=120).splitlines()
    assert wide[0].split() == ["distribution", "release", "site", "verdict"]
    assert wide[2].startswith("lightning-lite | pytorch-lightning  1.8.6  "), wide

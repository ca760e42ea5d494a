"""``check``'s four outcomes: the one decision of ``status`` and ``check``, its self-tests' results added.

:func:`tpu_closure_fix.outcome.decide.decide` is a pure function of the interpreter's payload and the
self-tests' results; these tests feed it the shapes of result each step produces (taken from real runs: an
all-good run, a site switched off, a self-test child that crashed, a graph check that raised) and pin the
outcome, the exit code and the one-line reason.  The same decisions made by the real command are in
tests/target/test_check.py (event order) and tests/xla (graph check).
"""
import argparse

import pytest

from support.outcomes import check_outcome, status_outcome
from tpu_closure_fix import arguments, check
from tpu_closure_fix.outcome import decide, render

FABRIC = "lightning_fabric.plugins.precision.xla:XLAPrecision.optimizer_step"
TRAINER = "pytorch_lightning.plugins.precision.xla:XLAPrecision.optimizer_step"
GOOD_ORDER = ["forward", "backward", "reduce_gradients", "step", "mark_step"]
BUGGY_ORDER = ["reduce_gradients(no grads)", "forward", "backward", "step", "mark_step"]
PROTECTED_HEAD = "PROTECTED: every installed affected site is patched, guarded or fixed upstream "


def event_site(site, verdict="patched", events=GOOD_ORDER, ok=True, error=None):
    return {"site": site, "variant": "v", "verdict": verdict, "events": list(events), "ok": ok, "error": error}


def events_of(*sites, error=None):
    return {"ok": bool(sites) and all(s["ok"] for s in sites) and error is None, "error": error, "sites": list(sites)}


def graph_site(count=1, from_backward=True, feeds=True, error=None, verdict="patched"):
    site = {"verdict": verdict, "all_reduce_count": count, "operands_from_backward": from_backward,
            "update_consumes_all_reduce": feeds, "excerpt": []}
    if error:
        site = {"verdict": verdict, "error": error}
    return site


def graph_of(sites, error=None):
    return {"ok": error is None, "error": error, "sites": sites}


def record(site, verdict, reason=""):
    module, method = site.split(":")
    return {"distribution": "lightning-fabric", "release": "2.6.6", "module": module, "method": method,
            "verdict": verdict, "reason": reason, "variant": None, "integration": "lightning"}


def payload(*records):
    """The payload of an interpreter whose start-up hook runs, with ``records`` (default: FABRIC patched)."""
    facts = {"executable": "/venv/bin/python", "version": "3.11.7", "startup_loaded": True, "startup_armed": True,
             "shim_at_start": False, "switch": None, "flags": {}, "site_dirs": ["/s"], "pth_in": ["/s"],
             "shim_origin": "/s/tpu_closure_fix/__init__.py"}
    return {"facts": facts, "records": list(records) or [record(FABRIC, "patched")]}


def test_protected_with_graph():
    out = check_outcome(payload(record(FABRIC, "patched"), record(TRAINER, "fixed upstream")),
                        events_of(event_site(FABRIC), event_site(TRAINER, "fixed upstream")),
                        graph_of({FABRIC: graph_site(), TRAINER: graph_site(verdict="fixed upstream")}))
    assert (out.name, out.exit_code) == ("protected", 0)
    assert out.reason == (PROTECTED_HEAD + "(2 site(s)); start-up hook active; self-tests: event order and XLA graph "
                          "(2 traced) right.")


def test_the_count_is_the_interpreter_s_installed_sites_in_status_and_in_check():
    """The graph child may trace a site the event child did not drive: the count is still the interpreter's
    installed sites, the same number ``status`` gives."""
    given = payload(record(FABRIC, "patched"), record(GUARD, "patched"))
    out = check_outcome(given, events_of(event_site(FABRIC)), graph_of({FABRIC: graph_site(), GUARD: graph_site()}))
    assert out.reason.startswith(PROTECTED_HEAD + "(2 site(s)); ") and "XLA graph (2 traced) right" in out.reason
    assert status_outcome(given).reason == PROTECTED_HEAD + "(2 site(s)); start-up hook active."


@pytest.mark.parametrize("graph, why", [(None, "torch_xla is not importable here"), (False, "--no-graph")])
def test_protected_without_graph_says_the_graph_was_not_checked(graph, why):
    out = check_outcome(payload(), events_of(event_site(FABRIC)), graph)
    assert (out.name, out.exit_code) == ("protected", 0)
    assert out.reason.endswith("event order right, XLA graph not checked (%s)." % why)


#: The fix a site only a self-test found buggy names: a pin of its newest row (the code in place is not the
#: one a verified release runs).
PIN = "Fix: pin a release docs/support.md lists: `pip install 'lightning-fabric>=2.1.0,<2.6.7'`."
BUGGY_HEAD = "UNPROTECTED: 1 of 1 installed affected site(s) run the buggy code: "


def test_unprotected_names_the_disabled_site_and_why():
    out = check_outcome(payload(record(FABRIC, "disabled", "TPU_CLOSURE_FIX=0")),
                        events_of(event_site(FABRIC, "disabled", BUGGY_ORDER, ok=False)), None)
    assert (out.name, out.exit_code) == ("unprotected", 1)
    assert out.reason.startswith(BUGGY_HEAD + "%s (disabled: TPU_CLOSURE_FIX=0)" % FABRIC), out.reason
    assert "; also" not in out.reason  # the self-test's finding on the same site counts once
    assert out.reason.endswith(". Fix: `unset TPU_CLOSURE_FIX`.")  # the one step that puts the fix in place


def test_unprotected_when_the_self_test_sees_the_buggy_order_on_a_patched_site():
    out = check_outcome(payload(), events_of(event_site(FABRIC, "patched", BUGGY_ORDER, ok=False)), None)
    assert out.name == "unprotected" and out.exit_code == 1
    assert out.reason == (BUGGY_HEAD + "%s: the event-order self-test saw the gradients reduced before the "
                          "backward (reduce_gradients(no grads) > forward > backward > step > mark_step). %s"
                          % (FABRIC, PIN))


def test_a_site_only_the_graph_interpreter_holds_is_counted_apart_from_the_installed_ones():
    """The graph check runs in another interpreter (torch_xla installed there): a buggy site it traced beyond the
    training interpreter's installed sites is counted as traced, so UNPROTECTED counts as PROTECTED does."""
    out = check_outcome(payload(record(FABRIC, "disabled", reason="TPU_CLOSURE_FIX=0")), events_of(),
                        graph_of({GUARD: graph_site(0, False, False)}))
    assert out.reason.startswith("UNPROTECTED: 1 of 1 installed affected site(s) and 1 site(s) a self-test traced "
                                 "run the buggy code: "), out.reason


def test_unprotected_when_the_graph_holds_no_all_reduce():
    out = check_outcome(payload(), events_of(event_site(FABRIC)), graph_of({FABRIC: graph_site(0, False, False)}))
    assert (out.name, out.exit_code) == ("unprotected", 1)
    assert out.reason == (BUGGY_HEAD + "%s: the traced XLA step holds 0 all-reduce(s), from the backward: False, "
                          "feeding the update: False. %s" % (FABRIC, PIN))


def test_graph_that_raised_is_could_not_verify_with_the_exception_line():
    error = "AttributeError: module 'torch_xla.core.xla_model' has no attribute 'get_ordinal'"
    out = check_outcome(payload(), events_of(event_site(FABRIC)), graph_of({FABRIC: graph_site(error=error)},
                                                                           error="%s: %s" % (FABRIC, error)))
    assert (out.name, out.exit_code) == ("could not verify", 3)
    assert out.reason.startswith("COULD NOT VERIFY: the XLA graph check of %s: %s. What you can do: " % (FABRIC, error))
    assert "--no-graph" in out.reason and "UNPROTECTED" not in out.reason


def test_graph_child_that_died_is_could_not_verify():
    out = check_outcome(payload(), events_of(event_site(FABRIC)),
                        graph_of({}, error="graph-check process timed out after 600 s (process group killed)"))
    assert out.exit_code == 3
    assert out.reason.startswith("COULD NOT VERIFY: the XLA graph check failed: graph-check process timed out")


def test_xla_python_without_torch_xla_is_could_not_verify():
    out = check_outcome(payload(), events_of(event_site(FABRIC)), None,
                        "--xla-python /x/bin/python cannot import torch_xla")
    assert out.exit_code == 3 and "--xla-python /x/bin/python cannot import torch_xla" in out.reason


def test_self_test_child_that_crashed_is_could_not_verify():
    events = events_of(error="self-test process exited with code 1: ImportError: cannot import name 'x'")
    out = check_outcome(payload(), events, None)
    assert (out.name, out.exit_code) == ("could not verify", 3)
    assert out.reason.startswith("COULD NOT VERIFY: the event-order self-test failed: self-test process exited with "
                                 "code 1: ImportError: cannot import name 'x'.")


def test_a_site_whose_step_raised_is_could_not_verify_not_unprotected():
    site = event_site(FABRIC, events=["forward"], ok=False, error="TypeError: step() got an unexpected keyword")
    out = check_outcome(payload(), events_of(site), None)
    assert out.exit_code == 3
    assert "the event-order self-test of %s failed: TypeError: step() got an unexpected keyword" % FABRIC in out.reason


def test_an_installed_site_no_self_test_drove_is_could_not_verify_and_nothing_installed_nothing_to_protect():
    out = check_outcome(payload(), events_of(), None)
    assert out.exit_code == 3 and "the event-order self-test drove no installed call site" in out.reason
    nothing = payload(record(FABRIC, "not installed"))
    assert check_outcome(nothing, events_of(), None) == status_outcome(nothing) == (
        "nothing to protect", 0, "NOTHING TO PROTECT: no framework or torch_xla release the shim covers is installed "
                                 "for /venv/bin/python.")


def test_unprotected_wins_over_could_not_verify():
    """A site known to run the buggy code is reported, even when a self-test also failed to run."""
    out = check_outcome(payload(record(FABRIC, "skipped", "unknown release 9.9")), events_of(error="boom"), None)
    assert out.exit_code == 1 and FABRIC in out.reason


NOT_VERIFIED = "unknown release 9.9 of lightning_fabric: not verified (known: >=2.1.0,<2.6.7); left untouched"


def test_a_site_status_could_not_verify_is_judged_by_its_recorded_order():
    """A release no row names: where the event-order self-test ran its call, that order decides."""
    given = payload(record(FABRIC, "skipped", NOT_VERIFIED))
    right = check_outcome(given, events_of(event_site(FABRIC, "skipped")), False)
    assert right.exit_code == 0, right.reason
    assert "1 not verified by status, judged by the order their call ran: %s" % FABRIC in right.reason
    wrong = check_outcome(given, events_of(event_site(FABRIC, "skipped", BUGGY_ORDER, ok=False)), False)
    assert wrong.exit_code == 1 and "saw the gradients reduced before the backward" in wrong.reason, wrong.reason
    # Its step could not run: status's word stands (the buggy code may run), never "protected".
    failed = check_outcome(given, events_of(event_site(FABRIC, "skipped", [], ok=False, error="TypeError: x")), False)
    assert failed.exit_code == 1 and "%s (skipped: " % FABRIC in failed.reason, failed.reason
    assert failed == status_outcome(given)  # the same words as status: the self-test added nothing


GUARD = "torch_xla.core.xla_model:optimizer_step"
NO_DRIVER = {"site": GUARD, "variant": "torch_xla-2.1+", "verdict": "patched",
             "reason": "the torch_xla integration has no verification driver "
                       "(tpu_closure_fix/integrations/torch_xla/verify.py)"}


def test_a_site_without_a_driver_is_named_but_does_not_fail_the_check():
    events = events_of(event_site(FABRIC))
    events["untested"] = [NO_DRIVER]
    out = check_outcome(payload(record(FABRIC, "patched"), record(GUARD, "patched")), events, None)
    assert (out.name, out.exit_code) == ("protected", 0)
    assert out.reason.endswith("; 1 site(s) without a self-test: %s." % GUARD), out.reason
    assert out.reason.startswith(PROTECTED_HEAD + "(2 site(s))")
    assert check.render_events(events)[-2:] == ["  --   %s (patched)" % GUARD, "       not self-tested: " + NO_DRIVER["reason"]]


def test_a_site_without_a_driver_seen_only_by_the_graph_check_is_named_once():
    given = payload(record(FABRIC, "patched"), record(GUARD, "patched"))
    events = events_of(event_site(FABRIC))
    events["untested"] = [NO_DRIVER]
    graph = graph_of({FABRIC: graph_site()})
    graph["untested"] = [NO_DRIVER]
    assert check_outcome(given, events, graph).reason.endswith("; 1 site(s) without a self-test: %s." % GUARD)
    del events["untested"]
    out = check_outcome(given, events, graph)
    assert out.exit_code == 0 and out.reason.endswith("; 1 site(s) without a self-test: %s." % GUARD), out.reason


def test_only_sites_without_a_driver_is_could_not_verify():
    events = events_of()
    events["untested"] = [NO_DRIVER]
    out = check_outcome(payload(record(GUARD, "patched")), events, None)
    assert out.exit_code == 3
    assert out.reason.startswith("COULD NOT VERIFY: no self-test covers %s (the torch_xla integration" % GUARD)


def test_exit_codes_tell_a_gate_pass_from_unprotected_from_unverified():
    # a CI gate passes on 0 only: protected, or nothing to protect (said as such in the reason)
    assert check.EXIT_CODES == {"protected": 0, "nothing to protect": 0, "unprotected": 1, "could not verify": 3}


@pytest.mark.parametrize("graph, unavailable, expected", [
    (False, None, "  not run (--no-graph)"),
    (None, None, "  not run: torch_xla is not importable here"),
    (graph_of({}, error="graph-check process exited with code -11"), None,
     "  could not run: graph-check process exited with code -11"),
    (graph_of({FABRIC: graph_site(error="MissingXlaAPI: no ordinal")}, error="x"), None,
     "  FAIL %s (patched)\n       could not trace: MissingXlaAPI: no ordinal" % FABRIC),
])
def test_graph_section_never_has_an_empty_heading(graph, unavailable, expected):
    lines = check.render_graph(graph, unavailable)
    assert lines[0].endswith(":") and len(lines) >= 2
    assert lines[1] == expected


@pytest.mark.parametrize("events, expected", [
    (events_of(), "  nothing to test: no installed call site"),
    (events_of(error="self-test process timed out after 600 s (process group killed)"),
     "  could not run: self-test process timed out after 600 s (process group killed)"),
])
def test_event_section_never_has_an_empty_heading(events, expected):
    lines = check.render_events(events)
    assert lines == ["Event-order self-test (recording stand-in for torch_xla, no hardware):", expected]


@pytest.mark.parametrize("value", ["0", "-5", "soon", "nan"])
def test_bad_timeout_is_refused_with_the_accepted_values(value):
    with pytest.raises(argparse.ArgumentTypeError, match="not a number of seconds > 0"):
        arguments.positive_seconds(value)


def test_missing_xla_python_is_refused_naming_it(tmp_path):
    with pytest.raises(argparse.ArgumentTypeError, match="is not an executable file"):
        arguments.existing_python(str(tmp_path / "nope" / "python"))


XLA_SITE = "torch_xla.core.xla_model:optimizer_step"
BROKEN_XLA = "import failed: ImportError: libtpu.so: cannot open shared object file"


def test_a_site_that_cannot_be_imported_is_could_not_verify_naming_the_error():
    """Code that cannot be imported runs no order at all: not a verdict on the shim (was UNPROTECTED, exit 1)."""
    given = payload(record(XLA_SITE, "failed", BROKEN_XLA), record(FABRIC, "patched"))
    out = check_outcome(given, events_of(event_site(FABRIC)), None)
    assert (out.name, out.exit_code) == ("could not verify", 3), out.reason
    assert out.reason.startswith("COULD NOT VERIFY: %s cannot be imported (%s)" % (XLA_SITE, BROKEN_XLA))


def test_an_import_failure_names_its_fix_not_the_details_of_a_self_test():
    """The next step of a site that cannot be imported: the import that shows the whole error, in the interpreter
    asked about; with a known cause, that cause's fix alone. A self-test's failure keeps pointing at --json."""
    module = XLA_SITE.split(":")[0]
    out = check_outcome(payload(record(XLA_SITE, "failed", BROKEN_XLA), record(FABRIC, "patched")),
                        events_of(event_site(FABRIC)), None)
    assert out.reason.endswith(". Fix: make `/venv/bin/python -c 'import %s'` succeed (it shows the whole error)."
                               % module), out.reason
    known = BROKEN_XLA + "; fix: pip install 'setuptools<81'"
    out = check_outcome(payload(record(XLA_SITE, "failed", known), record(FABRIC, "patched")),
                        events_of(event_site(FABRIC)), None)
    assert out.reason == ("COULD NOT VERIFY: %s cannot be imported (%s). Fix: `/venv/bin/python -m pip install "
                          "'setuptools<81'`." % (XLA_SITE, BROKEN_XLA)), out.reason
    out = check_outcome(payload(), {"sites": [], "error": "boom"}, None)
    assert out.reason.endswith("What you can do: %s." % decide.WHAT_TO_DO), out.reason


def test_an_import_failure_does_not_hide_a_site_that_runs_the_buggy_order():
    given = payload(record(XLA_SITE, "failed", BROKEN_XLA), record(FABRIC, "disabled", "TPU_CLOSURE_FIX=0"))
    out = check_outcome(given, events_of(event_site(FABRIC, "disabled", BUGGY_ORDER, ok=False)), None)
    assert (out.name, out.exit_code) == ("unprotected", 1)
    assert out.reason.startswith(BUGGY_HEAD.replace("1 of 1", "1 of 2") + "%s (disabled" % FABRIC)


def test_a_failure_of_the_shim_stays_unprotected_twin():
    """Only an import failure changes the outcome: a patch that failed leaves the buggy code running."""
    out = check_outcome(payload(record(FABRIC, "failed", "RuntimeError: boom")),
                        events_of(event_site(FABRIC, "failed")), None)
    assert (out.name, out.exit_code) == ("unprotected", 1)


def run_check_with_broken_torch_xla(tmp_path, init_source, args, env_extra=None, **run_options):
    """The real ``tpu-closure-fix check ARGS`` in a child whose only torch_xla is a package under ``tmp_path``
    whose ``__init__`` is ``init_source`` (one that raises, as a broken libtpu does); returns the finished
    process. ``run_options`` go to subprocess.run (``text=True`` for str output)."""
    import os
    import subprocess
    import sys

    site = tmp_path / "site"
    (site / "torch_xla").mkdir(parents=True)
    (site / "torch_xla" / "__init__.py").write_text(init_source)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k not in ("TPU_CLOSURE_FIX", "PYTHONPATH")}
    env.update(env_extra or {}, PYTHONPATH=os.pathsep.join([repo, str(site)]))
    return subprocess.run([sys.executable, "-m", "tpu_closure_fix", "check"] + list(args), env=env,
                          capture_output=True, timeout=400, cwd=str(tmp_path), **run_options)


def outcome_paragraph(stdout):
    """The outcome ``check`` prints last, wrapped at 120 columns, as one line."""
    return " ".join(stdout.rstrip().split("\n\n")[-1].split())


def test_check_with_a_torch_xla_that_cannot_be_imported_exits_3_naming_the_error(tmp_path):
    """The real command: a torch_xla whose import raises (a broken libtpu) is "could not verify", exit 3."""
    proc = run_check_with_broken_torch_xla(
        tmp_path, "raise ImportError('libtpu.so: cannot open shared object file')\n",
        ["--no-graph", "--timeout", "300"], text=True)
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert outcome_paragraph(proc.stdout).startswith(
        "COULD NOT VERIFY: torch_xla.core.xla_model:optimizer_step cannot be imported (import failed: ImportError: "
        "libtpu.so: cannot open shared object file)"), proc.stdout


def test_status_table_rows_are_printable_ascii_one_line_each():
    """A reason or release holding a line break or non-ASCII text (read from the environment) never splits
    a row and never makes an ASCII stdout raise: each cell is ASCII-escaped."""
    records = [dict(record(XLA_SITE, "failed", "import failed: ImportError: caf\u00e9\nsecond line"),
                    distribution="torch-xla", release="2.1\u2003"),
               dict(record(FABRIC, "patched"), distribution="lightning-fabric", release="2.6.6")]
    lines = render.table(records, width=120).splitlines()
    rows = [line for line in lines if not line.startswith(" ")]  # a long verdict wraps in its column
    assert len(rows) == 4, lines  # header, rule, one row per record
    assert all(line.isascii() and line.isprintable() and len(line) <= 120 for line in lines), lines
    failed = " ".join(" ".join(lines[2:-1]).split())
    assert failed.endswith("failed (import failed: ImportError: caf\\xe9\\nsecond line)") and "2.1\\u2003" in rows[2]
    assert rows[3].endswith("  patched") and "2.6.6" in rows[3]  # a plain row is unchanged


def test_check_text_output_prints_on_an_ascii_stdout(tmp_path):
    """A child's exception line with non-ASCII text (a torch_xla import error naming a path) is escaped."""
    proc = run_check_with_broken_torch_xla(
        tmp_path, "raise ImportError('/opt/caf\\u00e9/libtpu.so: cannot open')\n", ["--timeout", "300"],
        env_extra={"PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 3 and b"Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "caf\\xe9" in outcome_paragraph(proc.stdout.decode("ascii")), proc.stdout[-2000:]


def test_a_self_test_not_run_says_why_never_nothing_to_test():
    lines = check.render_events(check._not_run(check.NOT_RUN[4]))
    assert lines[1:] == ["  not run: " + check.NOT_RUN[4]]
    assert check.render_events(check._not_run(None))[1:] == ["  nothing to test: no installed call site"]


def _check_json(monkeypatch, capsys, payload):
    """``check --json`` over a fresh interpreter's ``payload``; the self-tests fail the test if they start."""
    import json

    from tpu_closure_fix.verify import events, fresh

    monkeypatch.setattr(fresh, "run_status", lambda **kwargs: (payload, None))
    monkeypatch.setattr(events, "run_event_check", lambda **kwargs: pytest.fail("the event self-test ran"))
    monkeypatch.setattr(check, "_run_graph", lambda args: pytest.fail("the graph check ran"))
    args = argparse.Namespace(python=None, timeout=10, script=None, json=True, no_graph=True, xla_python=None)
    code = check.run(args)
    return code, json.loads(capsys.readouterr().out)


def _fresh_payload(**facts):
    base = {"executable": "/venv/bin/python", "version": "3.11.7", "startup_loaded": True, "startup_armed": True,
            "shim_at_start": False, "switch": None, "flags": {}, "site_dirs": ["/s"], "pth_in": ["/s"],
            "shim_origin": "/s/tpu_closure_fix/__init__.py"}
    base.update(facts)
    return {"facts": base, "records": [dict(record(FABRIC, "unpatched", "start-up hook inactive"),
                                            distribution="lightning-fabric", release="2.6.6", variant=None,
                                            integration="lightning")], "beside_script": {"directory": "/w", "found": []}}


def test_check_runs_no_self_test_where_the_start_up_hook_does_not_run(monkeypatch, capsys):
    code, out = _check_json(monkeypatch, capsys, _fresh_payload(startup_armed=False, shim_origin=None))
    assert (code, out["outcome"]) == (1, "unprotected") and out["event_check"]["not_run"] == check.NOT_RUN[4]


def test_check_runs_no_self_test_beside_a_framework_in_the_script_directory(monkeypatch, capsys):
    payload = _fresh_payload()
    payload["beside_script"]["found"] = [{"package": "pytorch_lightning", "path": "/w/pytorch_lightning",
                                          "release": None}]
    code, out = _check_json(monkeypatch, capsys, payload)
    assert (code, out["outcome"]) == (3, "could not verify") and out["beside_script"] == payload["beside_script"]["found"]


def test_check_twin_with_the_hook_active_runs_the_self_tests(monkeypatch, capsys):
    import json

    from tpu_closure_fix.verify import events, fresh

    payload = _fresh_payload()
    payload["records"][0].update(verdict="patched", reason="")
    ran = []
    monkeypatch.setattr(fresh, "run_status", lambda **kwargs: (payload, None))
    monkeypatch.setattr(events, "run_event_check", lambda **kwargs: ran.append("events") or events_of(event_site(FABRIC)))
    args = argparse.Namespace(python=None, timeout=10, script=None, json=True, no_graph=True, xla_python=None)
    assert check.run(args) == 0 and ran == ["events"]
    assert json.loads(capsys.readouterr().out)["outcome"] == "protected"

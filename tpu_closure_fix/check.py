"""``tpu-closure-fix check``: am I affected, and am I protected?

1. the status table (every installed call site, imported now);
2. the event-order self-test against the code actually in place (child process, recording
   stand-in for torch_xla: needs no hardware);
3. where torch_xla is importable: the graph check on the real runtime (CPU thread replicas here,
   real devices on a TPU VM), which never executes a collective: exactly one all-reduce per step,
   fed by the backward, feeding the update.

Both self-tests drive the class and method of the call-site table's row that matched the loaded
release (:mod:`tpu_closure_fix.verify.table`).  The result is one of three outcomes, each with its
exit code and a one-line reason (:func:`decide`):

* ``protected`` (0): every installed affected site is patched, guarded or fixed upstream, and every
  self-test that ran shows the fixed order (a site whose integration has no verification driver
  yet is named in the reason as having no self-test);
* ``unprotected`` (1): a site runs the buggy code, or a self-test saw the buggy order; the reason
  names the site and why;
* ``could not verify`` (3): a self-test could not run, an installed call-site module (torch_xla, a
  framework) cannot be imported, or nothing is installed to test; the reason names what failed, with
  its exception line, and what to do.  Never reported as unprotected: a failing check says nothing
  about the training code, and code that cannot be imported runs no order at all.
"""
import json
import os
from collections import namedtuple

from .report import EXIT_CODES, NOT_VERIFIED, NOTHING_TO_PROTECT, PROTECTED, UNPROTECTED  # noqa: F401

Outcome = namedtuple("Outcome", "name exit_code reason")

NOTHING_INSTALLED = ("-", "no installed call site to test (nothing the shim patches or verifies is installed here)")

_WHAT_TO_DO = ("run `tpu-closure-fix check --json` for the details (the child's traceback); `--no-graph` "
               "runs the event-order self-test alone")


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "check", help="status + self-tests (event order; XLA graph where torch_xla is importable), about a "
                      "fresh interpreter; exit 0 protected or nothing to protect, 1 unprotected, 3 could not verify")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--no-graph", action="store_true", help="skip the torch_xla graph check")
    parser.add_argument("--python", metavar="PATH", type=_existing_python,
                        help="ask about another interpreter (e.g. the venv a job uses; default: this one)")
    from .verify.script_dir import SCRIPT_HELP, script_argument

    parser.add_argument("--script", metavar="PATH", type=script_argument, help=SCRIPT_HELP)
    parser.add_argument("--xla-python", type=_existing_python,
                        help="python of an environment with torch_xla for the graph check (default: --python, or "
                             "this interpreter)")
    parser.add_argument("--timeout", type=_positive_seconds, default=600,
                        help="seconds per self-test process (default 600)")
    parser.set_defaults(func=run)
    return parser


def _existing_python(text):
    """An ``argparse`` type: an executable interpreter, by path or by a name looked up on PATH as a shell does
    (never in the working directory: :func:`.verify.child.interpreter_path`)."""
    import argparse

    from .verify.child import interpreter_path

    path = interpreter_path(text)
    if path is None:
        raise argparse.ArgumentTypeError("%s is not an executable file%s (give the python of an environment "
                                         "with torch_xla, e.g. /path/to/venv/bin/python)"
                                         % (text, " on PATH" if os.sep not in text else ""))
    return path


def _positive_seconds(text):
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError("%r is not a number of seconds > 0 (e.g. 600)" % text)
    return value


# ----------------------------------------------------------------------------------------------
# the outcome: a pure function of what the three steps found
# ----------------------------------------------------------------------------------------------

def _first_and_more(items):
    """The first finding, and how many more things failed (several findings about one site count once)."""
    keys = []
    for key, _ in items:
        if key not in keys:
            keys.append(key)
    more = len(keys) - 1
    return items[0][1] + ("" if more == 0 else " (and %d more)" % more)


def _order_of(events, limit=6):
    return " > ".join(events[:limit]) + (" ..." if len(events) > limit else "")


def _graph_sites(graph):
    return (graph or {}).get("sites") or {}


def _judged_by_events(events):
    """Sites whose step the event-order self-test ran to the end: for a site status could not verify
    (a release no row names), that recorded order is the verdict."""
    return {site["site"] for site in events.get("sites", []) if site.get("error") is None}


def _unprotected_reasons(unprotected, events, graph):
    reasons = []
    judged = _judged_by_events(events)
    for r in unprotected:
        site = "%s:%s" % (r["module"], r["method"])
        if r["verdict"] == "skipped" and site in judged:
            continue  # not verified by status: its recorded order (below) decides
        reasons.append((site, "%s runs the buggy order (%s%s)" % (site, r["verdict"],
                                                                  ": " + r["reason"] if r.get("reason") else "")))
    for site in events.get("sites", []):
        if site.get("error") is None and not site.get("ok"):
            reasons.append((site["site"], "%s: the event-order self-test saw the gradients reduced before the "
                                          "backward (%s)" % (site["site"], _order_of(site.get("events", [])))))
    from .verify.graph import site_ok

    for name, info in _graph_sites(graph).items():
        if not info.get("error") and not site_ok(info):
            reasons.append((name, "%s: the traced XLA step holds %s all-reduce(s), from the backward: %s, feeding "
                                  "the update: %s" % (name, info.get("all_reduce_count"),
                                                      info.get("operands_from_backward"),
                                                      info.get("update_consumes_all_reduce"))))
    return reasons


def _fix(unprotected, reasons):
    """The one step that puts the first named site's fix in place (:func:`tpu_closure_fix.report.site_fix`):
    its status record's, or for a site only a self-test found buggy, a pin of its newest row."""
    from .report import site_fix

    first = reasons[0][0]
    for record in unprotected:
        if "%s:%s" % (record["module"], record["method"]) == first:
            return site_fix(record)
    module, _, method = first.partition(":")
    return site_fix({"module": module, "method": method, "verdict": "buggy order", "reason": ""})


def _not_verified_reasons(events, graph, graph_unavailable, import_failures=()):
    from .report import import_error

    reasons = [("%s:%s" % (r["module"], r["method"]),
                "%s:%s cannot be imported (%s)" % (r["module"], r["method"], import_error(r))) for r in import_failures]
    if events.get("error"):
        reasons.append(("self-test", "the event-order self-test failed: %s" % events["error"]))
    for site in events.get("sites", []):
        if site.get("error"):
            reasons.append((site["site"], "the event-order self-test of %s failed: %s" % (site["site"], site["error"])))
    if graph_unavailable:
        reasons.append(("graph", graph_unavailable))
    if graph:
        site_errors = [(name, "the XLA graph check of %s: %s" % (name, info["error"]))
                       for name, info in _graph_sites(graph).items() if info.get("error")]
        if site_errors:
            reasons.extend(site_errors)
        elif graph.get("error"):
            reasons.append(("graph", "the XLA graph check failed: %s" % graph["error"]))
    if not reasons and not events.get("sites"):
        untested = events.get("untested") or []
        if untested:
            reasons.extend((u["site"], "no self-test covers %s (%s)" % (u["site"], u["reason"])) for u in untested)
        else:
            reasons.append(NOTHING_INSTALLED)
    return reasons


def _next_step(reasons, import_failures, python):
    """What follows a COULD NOT VERIFY: for a first reason that is an import failure, the step that fixes it (the
    fix its reason names where the cause is known, else the import to make succeed); else where the details are."""
    from .report import import_fix

    failed = {"%s:%s" % (r["module"], r["method"]): r for r in import_failures}
    if reasons[0][0] in failed:
        return import_fix(failed[reasons[0][0]], python)
    return " What you can do: %s." % _WHAT_TO_DO


def _untested(events, graph):
    """Protected sites no self-test covers (no driver), from both self-tests, each once."""
    seen, entries = set(), []
    for entry in (events.get("untested") or []) + ((graph or {}).get("untested") or []):
        if entry["site"] not in seen:
            seen.add(entry["site"])
            entries.append(entry)
    return entries


def decide(unprotected, events, graph, graph_unavailable=None, installed=None, startup_gap=None, uncovered=None,
           python=None):
    """The outcome of a check.

    ``unprotected``: status records of installed sites that run the buggy code (a site whose module failed
    to import is among them for ``status``; here it makes the outcome "could not verify"); ``events``: the
    event-order self-test's result; ``graph``: the graph check's result, or None when it did not
    run (``False``: not asked for); ``graph_unavailable``: why a graph check that was asked for
    could not start, or None; ``installed``: how many call sites the fresh interpreter has installed
    (None: not known); ``startup_gap``: why its start-up hook leaves installed sites unpatched, or None
    (:func:`tpu_closure_fix.report.startup_gap`); ``uncovered``: why an installed framework's XLA
    optimizer step has no row, or None (:func:`tpu_closure_fix.report.uncovered_reason`); ``python``: the
    interpreter asked about (the import a fix names runs there).
    """
    from .report import import_failed

    # 1. A training script started as the user starts it does not get the shim.
    if startup_gap:
        return Outcome(UNPROTECTED, EXIT_CODES[UNPROTECTED], "UNPROTECTED: " + startup_gap)
    # a site whose module cannot be imported runs no code at all: neither order is shown, so not "unprotected"
    import_failures = [r for r in unprotected if import_failed(r)]
    unprotected = [r for r in unprotected if not import_failed(r)]
    reasons = _unprotected_reasons(unprotected, events, graph)
    # 2. A site runs the buggy code, or a self-test saw the buggy order.
    if reasons:
        return Outcome(UNPROTECTED, EXIT_CODES[UNPROTECTED], "UNPROTECTED: %s. Fix: %s." % (
            _first_and_more(reasons), _fix(unprotected, reasons)))
    # 3. An installed framework holds an XLA optimizer step no row covers: no verdict on it.
    if uncovered:
        return Outcome(NOT_VERIFIED, EXIT_CODES[NOT_VERIFIED], "COULD NOT VERIFY: " + uncovered)
    reasons = _not_verified_reasons(events, graph, graph_unavailable, import_failures)
    # 4. Nothing failed, and nothing the shim covers is installed: said as such, not as a failed check.
    if installed == 0 and reasons == [NOTHING_INSTALLED]:
        return Outcome(NOTHING_TO_PROTECT, EXIT_CODES[NOTHING_TO_PROTECT],
                       "NOTHING TO PROTECT: no framework or torch_xla release the shim covers is installed here.")
    # 5. A self-test or an import failed, or a site has no self-test and nothing else was tested.
    if reasons:
        return Outcome(NOT_VERIFIED, EXIT_CODES[NOT_VERIFIED],
                       "COULD NOT VERIFY: %s.%s" % (_first_and_more(reasons), _next_step(reasons, import_failures,
                                                                                          python)))
    # 6. Protected: every installed site patched, guarded or fixed upstream, and every self-test right.
    untested = _untested(events, graph)
    # Each site once, whichever self-test saw it: the graph child may import what this process has
    # not (the torch_xla guard is only patched where torch_xla is imported).
    sites = len({e["site"] for e in events.get("sites", [])} | set(_graph_sites(graph))
                | {u["site"] for u in untested})
    if graph:
        evidence = "event order and XLA graph (%d traced) right" % len(_graph_sites(graph))
    else:
        evidence = "event order right; XLA graph not checked (%s)" % ("--no-graph" if graph is False else
                                                                      "torch_xla is not importable here")
    judged = [e["site"] for e in events.get("sites", []) if e.get("verdict") == "skipped"]
    if judged:
        evidence += "; %d not verified by status, judged by the order their call ran: %s" % (len(judged),
                                                                                             ", ".join(judged))
    if untested:
        evidence += "; %d site(s) without a self-test: %s" % (len(untested), ", ".join(u["site"] for u in untested))
    return Outcome(PROTECTED, EXIT_CODES[PROTECTED],
                   "PROTECTED: %d call site(s) patched, guarded or fixed upstream; %s." % (sites, evidence))


# ----------------------------------------------------------------------------------------------
# running the steps and printing
# ----------------------------------------------------------------------------------------------

def _run_graph(args):
    """(graph result or None, why it could not start or None).  ``False`` for --no-graph."""
    if args.no_graph:
        return False, None
    from .verify import graph as graphcheck

    python = args.xla_python or args.python  # the interpreter asked about, unless the graph gets its own
    if not graphcheck.graph_check_available(python=python):
        if args.xla_python:
            return None, "--xla-python %s cannot import torch_xla" % args.xla_python
        return None, None
    # a separate graph interpreter has its own site-packages: our PYTHONPATH (e.g. a --target install of a
    # framework built for this interpreter's torch) must not leak into it
    env = {"PYTHONPATH": ""} if args.xla_python else None
    return graphcheck.run_graph_check(timeout=args.timeout, python=python, env=env), None


#: Why the self-tests did not run, by the status rule that decided without them.
NOT_RUN_BESIDE_SCRIPT = "a framework in the script's directory is what runs there (see the outcome)"
NOT_RUN_NO_HOOK = "the start-up hook does not run there: a script started there runs no fix (see the outcome)"
NOT_RUN_NO_SITES = "no list of that interpreter's sites to drive (see the outcome)"
NOT_RUN_SCAN_FAILED = "the script's directory could not be scanned: what runs there is unknown (see the outcome)"


def run(args):
    from . import report
    from .verify import events as eventcheck
    from .verify import fresh

    payload, error = fresh.run_status(python=args.python, timeout=args.timeout, script=args.script)
    # no records, or a framework beside the script or a failed scan there (what runs is not what the self-tests
    # would drive, or is unknown): no verdict
    beside = (payload or {}).get("beside_script") or {}
    if payload is None or "records" not in payload or beside.get("found") or beside.get("error"):
        status = report.status_json(payload, error)
        outcome = Outcome(status["outcome"], status["exit_code"], status["reason"])
        why = NOT_RUN_NO_SITES if payload is None or "records" not in payload else (
            NOT_RUN_SCAN_FAILED if beside.get("error") else NOT_RUN_BESIDE_SCRIPT)
        return _print_result(args, outcome, status, _not_run(why), None, why)
    records = payload["records"]
    unprotected = report.unprotected(records)
    gap = report.startup_gap(payload)
    if gap:
        # the self-tests would drive the shim's fix, which a script started there never gets: the table and the
        # outcome say what runs, and no self-test line says "patched" beside them
        events, graph, graph_unavailable = _not_run(NOT_RUN_NO_HOOK), None, NOT_RUN_NO_HOOK
    else:
        events = eventcheck.run_event_check(timeout=args.timeout, python=args.python)
        graph, graph_unavailable = _run_graph(args)
    outcome = decide(unprotected, events, graph, graph_unavailable, installed=len(report.installed(records)),
                     startup_gap=gap, uncovered=report.uncovered_reason(payload),
                     python=payload["facts"].get("executable"))
    return _print_result(args, outcome, report.status_json(payload, error), events, graph, graph_unavailable)


def _not_run(why):
    """The event-order result of a self-test that was not run, and why (None: nothing to say)."""
    return {"ok": False, "error": None, "sites": [], "untested": [], "not_run": why}


def _print_result(args, outcome, status, events, graph, graph_unavailable):
    from . import report

    records = status["sites"]
    if args.json:
        result = dict(status, command="check", outcome=outcome.name, exit_code=outcome.exit_code,
                      reason=outcome.reason, ok=outcome.name == PROTECTED, status=records, event_check=events,
                      graph_check=graph if graph is not False else None)
        print(json.dumps(result, indent=2, default=str))
        return outcome.exit_code
    print(render_check(outcome, status, events, graph, graph_unavailable))
    return outcome.exit_code


def render_check(outcome, status, events, graph, graph_unavailable):
    """The text ``check`` prints: the status part, both self-tests, the outcome; every line at most
    :data:`tpu_closure_fix.textfit.WIDTH` columns (``--json`` holds every value complete)."""
    from . import report
    from .textfit import fit

    lines = [report.render_header(status), report.render_table(status["sites"])]
    lines.extend(report.render_uncovered(status.get("uncovered")) +
                 report.render_compiled_only(status.get("compiled_only")))
    lines.extend(["", _ascii("\n".join(render_events(events))), "", _ascii("\n".join(render_graph(graph,
                                                                                           graph_unavailable)))])
    lines.extend(["", _ascii(outcome.reason)])
    return fit("\n".join(lines))


def _ascii(text):
    """``text`` with every non-ASCII character escaped: exception lines of the children may hold any text, and
    the report must print on an ASCII stdout too."""
    return text.encode("ascii", "backslashreplace").decode("ascii")


def render_events(events):
    lines = ["Event-order self-test (recording stand-in for torch_xla, no hardware):"]
    for site in events.get("sites", []):
        lines.append("  %-4s %s (%s)" % ("ok" if site["ok"] else "FAIL", site["site"], site["verdict"]))
        if site.get("error"):
            lines.append("       could not run: " + site["error"])
        else:
            lines.append("       " + _order_of(site.get("events", []), 8))
    lines.extend(_render_untested(events))
    if events.get("error"):
        lines.append("  could not run: " + events["error"])
    elif events.get("not_run"):
        lines.append("  not run: " + events["not_run"])
    elif not events.get("sites") and not events.get("untested"):
        lines.append("  nothing to test: no installed call site")
    return lines


def _render_untested(result):
    lines = []
    for entry in result.get("untested") or []:
        lines.append("  --   %s (%s)" % (entry["site"], entry["verdict"]))
        lines.append("       not self-tested: " + entry["reason"])
    return lines


def render_graph(graph, graph_unavailable=None):
    lines = ["XLA graph check (real torch_xla, collectives traced, never executed):"]
    if graph is False:
        return lines + ["  not run (--no-graph)"]
    if graph is None:
        return lines + ["  not run: " + (graph_unavailable or "torch_xla is not importable here")]
    from .verify.graph import site_ok

    sites = _graph_sites(graph)
    for name, info in sites.items():
        state = info.get("verdict", "?") + (", wrapped by the shim" if info.get("wrapped_by_shim") else "")
        if info.get("error"):
            lines.append("  FAIL %s (%s)\n       could not trace: %s" % (name, state, info["error"]))
            continue
        lines.append("  %-4s %s (%s): all-reduce per step = %s, from backward = %s, feeds update = %s" % (
            "ok" if site_ok(info) else "FAIL", name, state, info.get("all_reduce_count"),
            info.get("operands_from_backward"), info.get("update_consumes_all_reduce")))
        for ir_line in info.get("excerpt", [])[-5:]:
            lines.append("         " + ir_line.split(", xla_shape=")[0])
    lines.extend(_render_untested(graph))
    if graph.get("error") and not any(info.get("error") for info in sites.values()):
        lines.append("  could not run: " + graph["error"])
    elif not sites and not graph.get("untested"):
        lines.append("  nothing traced")
    return lines

"""``tpu-closure-fix check``: am I affected, and am I protected?

What only ``check`` does, on top of ``status`` (:mod:`tpu_closure_fix.outcome`):

1. the event-order self-test against the code actually in place (child process, recording
   stand-in for torch_xla: needs no hardware);
2. where torch_xla is importable: the graph check on the real runtime (CPU thread replicas here,
   real devices on a TPU VM), which never executes a collective: exactly one all-reduce per step,
   fed by the backward, feeding the update.

Both self-tests drive the class and method of the call-site table's row that matched the loaded
release (:mod:`tpu_closure_fix.verify.table`). They run only where the interpreter's report leaves the
outcome open (:data:`tpu_closure_fix.outcome.decide.BEFORE_SELF_TESTS`), and only add evidence to the one
decision of ``status`` and ``check`` (:func:`tpu_closure_fix.outcome.decide.decide`), whose four outcomes,
each with its exit code and a one-line reason, are:

* ``protected`` (0): every installed affected site is patched, guarded or fixed upstream, and every
  self-test that ran shows the fixed order (a site whose integration has no verification driver
  yet is named in the reason as having no self-test);
* ``nothing to protect`` (0): no framework or torch_xla release the shim covers is installed;
* ``unprotected`` (1): a site runs the buggy code, or a self-test saw the buggy order; the reason
  names the site and why;
* ``could not verify`` (3): a self-test could not run, an installed call-site module (torch_xla, a
  framework) cannot be imported, or the interpreter could not report; the reason names what failed, with
  its exception line, and what to do.  Never reported as unprotected: a failing check says nothing
  about the training code, and code that cannot be imported runs no order at all.
"""
import json

from .outcome.decide import EXIT_CODES, PROTECTED, SelfTests, graph_sites, order_of  # noqa: F401


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "check", help="status + self-tests (event order; XLA graph where torch_xla is importable), about a "
                      "fresh interpreter; exit 0 protected or nothing to protect, 1 unprotected, 3 could not verify")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--no-graph", action="store_true", help="skip the torch_xla graph check")
    from .arguments import TIMEOUT_HELP, existing_python, positive_seconds

    parser.add_argument("--python", metavar="PATH", type=existing_python,
                        help="ask about another interpreter (e.g. the venv a job uses; default: this one)")
    from .verify.script_dir import SCRIPT_HELP, script_argument

    parser.add_argument("--script", metavar="PATH", type=script_argument, help=SCRIPT_HELP)
    parser.add_argument("--xla-python", metavar="PATH", type=existing_python,
                        help="python of an environment with torch_xla for the graph check (default: --python, or "
                             "this interpreter)")
    parser.add_argument("--timeout", metavar="SECONDS", type=positive_seconds, default=600,
                        help=TIMEOUT_HELP + ", and for each self-test process")
    parser.set_defaults(func=run)
    return parser


# ----------------------------------------------------------------------------------------------
# running the steps and printing
# ----------------------------------------------------------------------------------------------

def _run_graph(args):
    """(graph result or None, why it could not start or None).  ``False`` for --no-graph."""
    if args.no_graph:
        return False, None
    from .verify import graph as graphcheck

    python = args.xla_python or args.python  # the interpreter asked about, unless the graph gets its own
    # a separate graph interpreter has its own site-packages: our PYTHONPATH (e.g. a --target install of a
    # framework built for this interpreter's torch) must not leak into it, nor into the question put to it
    env = {"PYTHONPATH": ""} if args.xla_python else None
    if not graphcheck.graph_check_available(python=python, env=env):
        if args.xla_python:
            return None, "--xla-python %s cannot import torch_xla" % args.xla_python
        return None, None
    return graphcheck.run_graph_check(timeout=args.timeout, python=python, env=env), None


#: Why the self-tests did not run, by the rule of the one decision that decided without them.
NOT_RUN = {
    1: "no list of that interpreter's sites to drive (see the outcome)",
    2: "a framework in the script's directory is what runs there, or what is there is unknown (see the outcome)",
    3: "no installed call site to test (see the outcome)",
    4: "the start-up hook does not run there: a script started there runs no fix (see the outcome)",
}


def run(args):
    from .outcome import decide, payload, render
    from .verify import events as eventcheck
    from .verify import fresh

    evidence = payload.receive(*fresh.run_status(python=args.python, timeout=args.timeout, script=args.script),
                               asked=args.python)
    outcome = decide.decide(evidence)
    if outcome.rule in decide.BEFORE_SELF_TESTS:
        # the self-tests would drive what does not run there (or nothing): the outcome stands without them
        why = NOT_RUN[outcome.rule]
        tests = SelfTests(_not_run(why), None, why)
    else:
        graph, graph_unavailable = _run_graph(args)
        tests = SelfTests(eventcheck.run_event_check(timeout=args.timeout, python=args.python), graph,
                          graph_unavailable)
        outcome = decide.decide(evidence, tests)
    if args.json:
        extra = {"command": "check", "ok": outcome.name == PROTECTED, "status": evidence.records or [],
                 "event_check": tests.events, "graph_check": tests.graph if tests.graph is not False else None}
        print(json.dumps(render.json_object(evidence, outcome, "check", extra), indent=2, default=str))
    else:
        print(render.text(evidence, outcome, sections=self_test_sections(tests, evidence.records)))
    return outcome.exit_code


def _not_run(why):
    """The event-order result of a self-test that was not run, and why (None: nothing to say)."""
    return {"ok": False, "error": None, "sites": [], "untested": [], "not_run": why}


def self_test_sections(tests, records=None):
    """The two self-test sections of ``check``'s text, each a list of lines (``records``: the interpreter's,
    which name why nothing was tested)."""
    return [_ascii_lines(render_events(tests.events, records)),
            _ascii_lines(render_graph(tests.graph, tests.graph_unavailable))]


def _ascii_lines(lines):
    """``lines`` with every non-ASCII character escaped: exception lines of the children may hold any text, and
    the report must print on an ASCII stdout too."""
    return [piece.encode("ascii", "backslashreplace").decode("ascii") for line in lines for piece in line.split("\n")]


def render_events(events, records=None):
    """The event-order self-test's section (``records``: the interpreter's, which name why nothing was tested)."""
    lines = ["Event-order self-test (recording stand-in for torch_xla, no hardware):"]
    for site in events.get("sites", []):
        lines.append("  %-4s %s (%s)" % ("ok" if site["ok"] else "FAIL", site["site"], site["verdict"]))
        if site.get("error"):
            lines.append("       could not run: " + site["error"])
        else:
            lines.append("       " + order_of(site.get("events", []), 8))
    lines.extend(_render_untested(events))
    if events.get("error"):
        lines.append("  could not run: " + events["error"])
    elif events.get("not_run"):
        lines.append("  not run: " + events["not_run"])
    elif not events.get("sites") and not events.get("untested"):
        lines.append("  " + _nothing_tested(records))
    return lines


def _nothing_tested(records):
    """Why the event-order self-test drove no site: the installed ones cannot be imported, or none is installed."""
    from .outcome import records as _records

    installed = _records.installed(records or [])
    broken = [r for r in installed if _records.import_failed(r)]
    if broken:
        return "nothing to test: %d of %d installed call site(s) cannot be imported (see the outcome)" % (
            len(broken), len(installed))
    if installed:
        return "nothing to test: no driver could run the %d installed call site(s) (see the outcome)" % len(installed)
    return "nothing to test: no installed call site"


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

    sites = graph_sites(graph)
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

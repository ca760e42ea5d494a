"""``tpu-closure-fix check``: am I affected, and am I protected?

1. the status table (every installed call site, imported now);
2. the event-order self-test against the classes actually installed (child
   process, recording stand-in for torch_xla: needs no hardware);
3. where torch_xla is importable: the graph check on the real runtime (CPU
   thread replicas here, real devices on a TPU VM), which never executes a
   collective: exactly one all-reduce per step, fed by the backward, feeding
   the update.

One verdict line; exit 1 when an affected site is unprotected or a self-test fails.
"""
import json
import os


def add_parser(subparsers):
    parser = subparsers.add_parser("check", help="status + self-tests (event order; XLA graph where torch_xla "
                                                 "is importable); exit 1 if unprotected")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--no-graph", action="store_true", help="skip the torch_xla graph check")
    parser.add_argument("--xla-python", help="python of an environment with torch_xla for the graph check "
                                             "(default: this interpreter)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per self-test process (default 600)")
    parser.set_defaults(func=run)
    return parser


def run(args):
    from . import report, selftest

    failures = report.import_installed_sites()
    records = report.status(import_errors=failures)
    unprotected = report.unprotected(records)
    events = selftest.run_event_check(timeout=args.timeout)
    graph = None
    if not args.no_graph:
        from . import graphcheck

        xla_python = os.path.abspath(args.xla_python) if args.xla_python else None
        if graphcheck.graph_check_available(python=xla_python):
            # another interpreter has its own site-packages: our PYTHONPATH (e.g. a --target install of
            # Lightning built for this interpreter's torch) must not leak into it
            env = {"PYTHONPATH": ""} if xla_python else None
            graph = graphcheck.run_graph_check(timeout=args.timeout, python=xla_python, env=env)
    graph_ok = graph is None or _graph_ok(graph)
    events_ok = bool(events) and all(e["ok"] for e in events)
    ok = not unprotected and events_ok and graph_ok
    if ok:
        line = "PROTECTED: %d call site(s) patched or fixed upstream; event order%s right." % (
            sum(r["verdict"] in ("patched", "fixed upstream") for r in records),
            " and XLA graph" if graph is not None else "")
    elif not events:
        line = "NOT VERIFIED: no installed Lightning TPU call site to test."
    else:
        line = "UNPROTECTED: %d site(s) run the buggy code; %d self-test(s) failed." % (
            len(unprotected), sum(not e["ok"] for e in events) + (0 if graph_ok else 1))
    if args.json:
        print(json.dumps({"ok": ok, "verdict": line, "status": records, "event_check": events, "graph_check": graph},
                         indent=2, default=str))
        return 0 if ok else 1
    print(report.render_table(records))
    print("\nEvent-order self-test (recording stand-in for torch_xla, no hardware):")
    for e in events:
        order = " > ".join(e["events"][:8]) + (" ..." if len(e["events"]) > 8 else "")
        print("  %-4s %s\n       %s%s" % ("ok" if e["ok"] else "FAIL", e["site"], order,
                                         ("\n       error: " + e["error"]) if e["error"] else ""))
    if graph is not None:
        print("\nXLA graph check (real torch_xla, collectives traced, never executed):")
        for path, info in sorted(_graph_paths(graph).items()):
            if info.get("error"):
                print("  FAIL %s: %s" % (path, info["error"]))
                continue
            print("  %-4s %s: all-reduce per step = %s, from backward = %s, feeds update = %s" % (
                "ok" if _path_ok(info) else "FAIL", path, info.get("all_reduce_count"),
                info.get("operands_from_backward"), info.get("update_consumes_all_reduce")))
            for ir_line in info.get("excerpt", [])[-5:]:
                print("         " + ir_line.split(", xla_shape=")[0])
    elif not args.no_graph:
        print("\nXLA graph check: skipped (torch_xla is not importable here).")
    print("\n" + line)
    return 0 if ok else 1


def _graph_paths(graph):
    paths = graph.get("paths", graph) if isinstance(graph, dict) else {}
    # a path that raised counts (as a failure); one with nothing installed to trace ("skipped") does not
    return {k: v for k, v in paths.items() if isinstance(v, dict) and "skipped" not in v}


def _path_ok(info):
    return info.get("all_reduce_count") == 1 and bool(info.get("operands_from_backward")) and \
        bool(info.get("update_consumes_all_reduce"))


def _graph_ok(graph):
    paths = _graph_paths(graph)
    return bool(paths) and all(_path_ok(info) for info in paths.values())

"""The one decision: the outcome of ``status`` and of ``check``, one numbered rule at a time (:func:`decide`).

``status`` decides from the evidence of the interpreter that trains (:class:`.payload.Evidence`); ``check``
decides with the same rules, given its self-tests' results too (:class:`SelfTests`). A self-test only adds
evidence: the buggy order seen, a self-test that could not run, the recorded order of a site status could not
verify. So the same environment gets the same counts and the same words from both commands.
"""
from collections import namedtuple

from . import records as _records

PROTECTED, NOTHING_TO_PROTECT, UNPROTECTED, NOT_VERIFIED = ("protected", "nothing to protect", "unprotected",
                                                            "could not verify")
#: Every outcome of ``status`` and ``check`` with its exit code.
EXIT_CODES = {PROTECTED: 0, NOTHING_TO_PROTECT: 0, UNPROTECTED: 1, NOT_VERIFIED: 3}
#: The rules that decide from the interpreter's report alone: ``check`` runs no self-test after them.
BEFORE_SELF_TESTS = (1, 2, 3, 4)

#: Where the details of a self-test that failed are, and how to run the other alone.
WHAT_TO_DO = ("run `tpu-closure-fix check --json` for the details (the child's traceback); `--no-graph` "
              "runs the event-order self-test alone")


class Outcome(namedtuple("Outcome", "name exit_code reason")):
    """The answer: its name, exit code and one-line reason; ``rule``: the number of the rule of :func:`decide`
    that gave it."""

    def __new__(cls, name, exit_code, reason, rule=None):
        self = super().__new__(cls, name, exit_code, reason)
        self.rule = rule
        return self


class SelfTests(namedtuple("SelfTests", "events graph graph_unavailable")):
    """What ``check``'s self-tests found: ``events``, the event-order self-test's result; ``graph``, the XLA graph
    check's result, None when it did not run, False when not asked for (``--no-graph``); ``graph_unavailable``:
    why a graph check that was asked for could not start, or None."""

    __slots__ = ()


def _outcome(name, rule, reason):
    return Outcome(name, EXIT_CODES[name], reason, rule)


def decide(evidence, tests=None):
    """The outcome of ``status`` (``tests`` None) or ``check`` (``tests``: :class:`SelfTests`) about the
    interpreter of ``evidence``. The first rule that applies decides."""
    # 1. The interpreter listed no sites: nothing is known about what runs there.
    if evidence.records is None:
        return _outcome(NOT_VERIFIED, 1, "COULD NOT VERIFY: " + no_records_reason(evidence))
    # 2. A framework in the training script's directory is what a script run from there imports (the child never
    #    searched that directory), or that directory could not be scanned: no verdict is about what runs.
    beside = beside_script_reason(evidence)
    if beside:
        return _outcome(NOT_VERIFIED, 2, "COULD NOT VERIFY: %s." % beside)
    sites = _records.installed(evidence.records)
    uncovered = uncovered_reason(evidence.payload)
    # 3. No site the shim covers is installed and no uncovered XLA step found: said as such, never "protected".
    if not sites and not uncovered:
        return _outcome(NOTHING_TO_PROTECT, 3, "NOTHING TO PROTECT: no framework or torch_xla release the shim "
                                               "covers is installed for %s." % evidence.python)
    # 4. The start-up hook does not run there: a script that does not import the shim runs the sites that need
    #    it unpatched, whatever the shim would do once imported.
    gap = startup_gap(evidence)
    if gap:
        return _outcome(UNPROTECTED, 4, "UNPROTECTED: " + gap)
    # 5. An installed site runs the buggy code, or a self-test saw the buggy order (a module that cannot be
    #    imported runs no code at all: rule 7).
    buggy = buggy_findings(sites, tests)
    if buggy:
        return _outcome(UNPROTECTED, 5, "UNPROTECTED: %s run the buggy code: %s. Fix: %s." % (
            buggy_count(buggy, sites), _first_then_names(buggy), _fix_of(buggy[0], sites)))
    # 6. An installed framework holds an XLA optimizer step no row covers (or the search failed): no verdict.
    if uncovered:
        return _outcome(NOT_VERIFIED, 6, "COULD NOT VERIFY: " + uncovered)
    # 7. An installed site's module cannot be imported: it runs no order, buggy or fixed.
    broken = [r for r in sites if _records.import_failed(r)]
    if broken:
        more = " (and %d more, of %d installed call site(s))" % (len(broken) - 1, len(sites)) if broken[1:] else ""
        return _outcome(NOT_VERIFIED, 7, "COULD NOT VERIFY: %s cannot be imported (%s)%s.%s" % (
            _records.site_name(broken[0]), _records.import_error(broken[0]), more,
            import_fix(broken[0], evidence.facts.get("executable"))))
    # 8. A self-test could not run, or none drove an installed site.
    failed = self_test_failures(tests)
    if failed:
        return _outcome(NOT_VERIFIED, 8, "COULD NOT VERIFY: %s. What you can do: %s." % (_first_then_names(failed),
                                                                                          WHAT_TO_DO))
    # 9. Every installed site is patched, guarded or fixed upstream (and every self-test that ran agrees).
    return _outcome(PROTECTED, 9, "PROTECTED: every installed affected site is patched, guarded or fixed upstream "
                                  "(%d site(s)); %s%s." % (len(sites), _hook_phrase(evidence.hook[0]),
                                                           self_test_evidence(tests)))


# --------------------------------------------------------------------------- rule 1: no records
def no_records_reason(evidence):
    """Why the interpreter gave no records, with the next step."""
    facts = evidence.facts
    if evidence.error or not facts.get("error"):  # the error names its fix (verify.fresh.run_status)
        return "%s." % (evidence.error or "%s gave no report" % evidence.python)
    return "%s could not list its sites (%s). Fix: %s." % (facts.get("executable"), facts["error"],
                                                             unlisted_fix(facts))


def unlisted_fix(facts):
    """The step after an interpreter that started but whose copy of the shim failed to list the sites: its own
    copy (another release) or the one lent to it. Installing this release there gives it one that lists them."""
    from .. import install

    command = install.install_command(facts.get("executable"))
    if facts.get("shim_origin"):  # its own copy, installed: replaced, files and all
        command = command.replace(" -m pip install ", " -m pip install --force-reinstall ", 1)
    return "install this release of tpu-closure-fix into it: `%s`" % command


# --------------------------------------------------------------------------- rule 2: beside the script
def beside_script_reason(evidence):
    """Why the frameworks in the training script's directory leave no verdict, or None."""
    beside = (evidence.payload or {}).get("beside_script") or {}
    if beside.get("error"):  # the scan of that directory failed: what a script run from there imports is unknown
        return beside["error"]
    if beside.get("found"):
        from ..verify import script_dir

        return script_dir.reason(beside["found"], beside["directory"], evidence.python)
    return None


# --------------------------------------------------------------------------- rule 4: the start-up hook
def startup_gap(evidence):
    """Why a training script started in the interpreter runs installed sites unpatched although the shim would
    patch them once imported (its start-up hook does not run there), or None."""
    from .. import engine, install

    active, why = evidence.hook
    if active is not False:  # active, or not asked
        return None
    # switched off, the sites' own records say so ("disabled"): that is the reason to give; a site whose module
    # cannot be imported runs nothing at all (rule 7 names it)
    needing = [r for r in _records.installed(evidence.records)
               if r["verdict"] not in (engine.FIXED_UPSTREAM, engine.DISABLED) and not _records.import_failed(r)]
    if not needing:
        return None
    return ("the start-up hook does not run in %s (%s): a training script that does not import tpu_closure_fix "
            "runs %d affected site(s) unpatched (%s). Fix: %s." % (
                evidence.python, why, len(needing), _some(_records.site_name(r) for r in needing),
                install.startup_fix(evidence.facts)))


def _hook_phrase(active):
    return {True: "start-up hook active", False: "start-up hook inactive, no site needs it",
            None: "start-up hook not asked"}[active]


# --------------------------------------------------------------------------- rule 5: the buggy code
def buggy_count(buggy, sites):
    """How many sites run the buggy code, counted as PROTECTED counts them (the installed sites of the interpreter
    that trains) plus those only a self-test traced (the graph check's interpreter): ``1 of 4 installed affected
    site(s) and 1 site(s) a self-test traced``."""
    installed = set(_records.site_name(r) for r in sites)
    here = [name for name, _ in buggy if name in installed]
    traced = len(buggy) - len(here)
    parts = ["%d of %d installed affected site(s)" % (len(here), len(sites))] if here else []
    if traced:
        parts.append("%d site(s) a self-test traced" % traced)
    return " and ".join(parts)


def buggy_findings(sites, tests=None):
    """``[(site, finding)]``, each site once: the installed sites that run the buggy code (their records) and
    the buggy orders a self-test saw. A site whose module cannot be imported runs no code (not here); a site
    status could not verify (``skipped``) whose call the event-order self-test ran to its end is judged by
    that recorded order instead of its record."""
    events = tests.events if tests else {}
    judged = {site["site"] for site in events.get("sites", []) if site.get("error") is None}
    found = []
    for r in _records.unprotected(sites):
        name = _records.site_name(r)
        if _records.import_failed(r) or (r["verdict"] == "skipped" and name in judged):
            continue
        found.append((name, "%s (%s%s)" % (name, r["verdict"], ": " + r["reason"] if r.get("reason") else "")))
    for site in events.get("sites", []):
        if site.get("error") is None and not site.get("ok"):
            found.append((site["site"], "%s: the event-order self-test saw the gradients reduced before the "
                                        "backward (%s)" % (site["site"], order_of(site.get("events", [])))))
    if tests:
        from ..verify.graph import site_ok

        for name, info in graph_sites(tests.graph).items():
            if not info.get("error") and not site_ok(info):
                found.append((name, "%s: the traced XLA step holds %s all-reduce(s), from the backward: %s, "
                                    "feeding the update: %s" % (name, info.get("all_reduce_count"),
                                                                info.get("operands_from_backward"),
                                                                info.get("update_consumes_all_reduce"))))
    return _each_site_once(found)


def _fix_of(finding, sites):
    """The one step that puts the first named site's fix in place: its record's, or for a site only a self-test
    found buggy, a pin of its newest row."""
    for record in sites:
        if _records.site_name(record) == finding[0]:
            return site_fix(record)
    module, _, method = finding[0].partition(":")
    return site_fix({"module": module, "method": method, "verdict": "buggy order", "reason": ""})


def site_fix(record):
    """The one step that puts the fix of an unprotected site in place (:func:`tpu_closure_fix.install.site_fix`,
    a pin naming the newest row of the site's table)."""
    from .. import install
    from .. import sites as _sites

    key = (record["module"], record["method"])
    rows = _sites.rows_for(*key) if key in set(_sites.site_keys()) else []
    return install.site_fix(record, rows[-1] if rows else None)


# --------------------------------------------------------------------------- rule 6: uncovered steps
def uncovered_reason(payload):
    """Why no verdict can be given for an installed framework (:mod:`..verify.scan`): an XLA optimizer step
    that no row covers, named by file and line, or the search failing; None when neither."""
    from .. import install

    payload = payload or {}
    if payload.get("scan_error"):
        return "searching the installed frameworks for XLA optimizer steps failed (%s)." % payload["scan_error"]
    found = payload.get("uncovered") or []
    if not found:
        return None
    first = found[0]
    row = install.newest_row(first["module"])
    pin = ": `%s`" % install.pin_command(row) if row is not None else ""
    return ("%s:%d (%s:%s) holds an XLA optimizer step (the gradients reduced before the closure runs) that no "
            "row of the call-site table covers%s: this release is not verified, nothing of it is patched. Fix: pin "
            "a release docs/support.md lists%s (meanwhile `tpu_closure_fix.check_sync`, SyncCheck, detects "
            "divergence)." % (first["file"], first["line"], first["module"], first["function"],
                              _more(len(found) - 1), pin))


# --------------------------------------------------------------------------- rule 7: import failures
def import_fix(record, python):
    """`` Fix: ...``, the one step after a site's import failure: the install of a known cause's fix into
    ``python`` (the interpreter asked about; a bare ``pip`` may be another environment's), else the import to make
    succeed, which shows the whole error (the reason holds its last line only)."""
    import shlex

    known = (record.get("reason") or "").partition(_records.KNOWN_FIX)[2]
    if known:
        return " Fix: `%s`." % ("%s -m %s" % (shlex.quote(python), known) if python else known)
    return " Fix: make `%s -c %s` succeed (it shows the whole error)." % (
        shlex.quote(python or "python"), shlex.quote("import %s" % record["module"]))


# --------------------------------------------------------------------------- rule 8: self-tests that failed
def self_test_failures(tests):
    """``[(what, finding)]``: each self-test that could not run, each site it could not drive, a graph check
    that could not start; or, when nothing failed and the event-order self-test drove no site, why not. Empty
    for ``status`` (``tests`` None)."""
    if not tests:
        return []
    events, graph = tests.events, tests.graph
    found = []
    if events.get("error"):
        found.append(("self-test", "the event-order self-test failed: %s" % events["error"]))
    for site in events.get("sites", []):
        if site.get("error"):
            found.append((site["site"], "the event-order self-test of %s failed: %s" % (site["site"], site["error"])))
    if tests.graph_unavailable:
        found.append(("graph", tests.graph_unavailable))
    if graph:
        site_errors = [(name, "the XLA graph check of %s: %s" % (name, info["error"]))
                       for name, info in graph_sites(graph).items() if info.get("error")]
        found.extend(site_errors or ([("graph", "the XLA graph check failed: %s" % graph["error"])]
                                     if graph.get("error") else []))
    if not found and not events.get("sites"):
        untested = events.get("untested") or []
        found.extend((u["site"], "no self-test covers %s (%s)" % (u["site"], u["reason"])) for u in untested)
        if not untested:
            found.append(("self-test", "the event-order self-test drove no installed call site"))
    return _each_site_once(found)


# --------------------------------------------------------------------------- rule 9: the evidence of protected
def self_test_evidence(tests):
    """What the self-tests that ran add to a protected outcome (empty for ``status``)."""
    if not tests:
        return ""
    events, graph = tests.events, tests.graph
    if graph:
        said = "; self-tests: event order and XLA graph (%d traced) right" % len(graph_sites(graph))
    else:
        said = "; self-tests: event order right, XLA graph not checked (%s)" % (
            "--no-graph" if graph is False else "torch_xla is not importable here")
    judged = [e["site"] for e in events.get("sites", []) if e.get("verdict") == "skipped"]
    if judged:
        said += "; %d not verified by status, judged by the order their call ran: %s" % (len(judged),
                                                                                          ", ".join(judged))
    untested = untested_sites(tests)
    if untested:
        said += "; %d site(s) without a self-test: %s" % (len(untested), ", ".join(u["site"] for u in untested))
    return said


def untested_sites(tests):
    """Protected sites no self-test covers (no driver), from both self-tests, each once."""
    seen, entries = set(), []
    for entry in (tests.events.get("untested") or []) + ((tests.graph or {}).get("untested") or []):
        if entry["site"] not in seen:
            seen.add(entry["site"])
            entries.append(entry)
    return entries


# --------------------------------------------------------------------------- wording
def graph_sites(graph):
    """``{site: result}`` of a graph check's result (none when it did not run)."""
    return (graph or {}).get("sites") or {}


def order_of(events, limit=6):
    """The first ``limit`` events of a recorded order, as ``a > b > c ...``."""
    return " > ".join(events[:limit]) + (" ..." if len(events) > limit else "")


def _each_site_once(findings):
    """``findings`` with only the first one of each site (several findings about one site count once)."""
    seen, kept = set(), []
    for key, text in findings:
        if key not in seen:
            seen.add(key)
            kept.append((key, text))
    return kept


def _first_then_names(findings):
    """The first finding in full, then the other sites by name."""
    rest = [key for key, _ in findings[1:]]
    return findings[0][1] + ("; also %s" % _some(rest) if rest else "")


def _more(count):
    return " (and %d more)" % count if count > 0 else ""


def _some(names, shown=3):
    names = list(names)
    return ", ".join(names[:shown]) + (" and %d more" % (len(names) - shown) if len(names) > shown else "")

#!/usr/bin/env python
"""Generate the support tables from the call-site table and the matrix results.

Usage::

    python scripts/support_table.py                  # rewrite docs/support.md's table and README's summary
    python scripts/support_table.py --check          # exit 1 if either is out of date
    python scripts/support_table.py --update-results # copy results/matrix.json -> docs/matrix-results.json, then rewrite
    python scripts/support_table.py --merge-results DIR/matrix.json  # a partial run's targets into it, then rewrite
    python scripts/support_table.py --print          # print the full table only

Two generated blocks: the full table in docs/support.md (one list entry per call-site
row, with its matrix evidence, lines of at most 120 columns) and README.md's compact summary (framework x
release range x verdict: consecutive rows of one package with the same verdict
merged into one range, and how many matrix targets passed on them).

One row per entry of ``tpu_closure_fix.sites.CALL_SITES``: release range,
call site (module:Class.method), verdict (patched / fixed upstream, an inheriting subclass: its base's, via it),
fix strategy (``fix.describe()``), and which matrix targets verified it and
what was verified. The matrix results come from ``docs/matrix-results.json``
(committed; a trimmed copy of ``results/matrix.json`` written by
``--update-results``), so the table can be regenerated without re-running the
matrix. Only the text between the two markers in README.md is touched; the
markers are appended to README.md if absent.

Python 3.8+, standard library only (plus this repository's package).
"""
from __future__ import print_function

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
README = os.path.join(REPO, "README.md")
SUPPORT = os.path.join(REPO, "docs", "support.md")
DOCS_RESULTS = os.path.join(REPO, "docs", "matrix-results.json")
RUN_RESULTS = os.path.join(REPO, "results", "matrix.json")
START = "<!-- support-table:start -->"
END = "<!-- support-table:end -->"
SUMMARY_START = "<!-- support-summary:start -->"
SUMMARY_END = "<!-- support-summary:end -->"

sys.path.insert(0, REPO)


# --------------------------------------------------------------------------- results
def trim(matrix):
    """What the table needs from results/matrix.json (no local paths, no logs)."""
    out = {k: matrix.get(k) for k in ("generated", "python", "torch", "wall_seconds", "order")}
    out["targets"] = {}
    for name, row in sorted(matrix.get("targets", {}).items()):
        summary = row.get("summary") or {}
        out["targets"][name] = {
            "verdict": row.get("verdict"),
            "wrapt": row.get("wrapt"),
            "status": [{k: r.get(k) for k in ("module", "method", "release", "verdict", "variant")}
                       for r in row.get("status") or []],
            "lightning": summary.get("lightning"),
            "scenarios_run": summary.get("scenarios_run"),
            "not_applicable": summary.get("not_applicable"),
            "steps_compared": summary.get("steps_compared"),
            "max_divergence_with_shim": summary.get("max_divergence_with_shim"),
            "max_divergence_without_shim": summary.get("max_divergence_without_shim"),
            "max_reference_diff_with_shim": summary.get("max_reference_diff_with_shim"),
            "scenarios": summary.get("scenarios"),
        }
    return out


def _matrix_targets():
    """The matrix's targets, in its order (scripts/targets.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tpu_closure_fix_targets", os.path.join(REPO, "scripts", "targets.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TARGETS


def merge(documented, run, order):
    """``documented`` with the targets of a partial matrix ``run`` (both trimmed) put in or replaced, listed in
    ``order`` (the matrix's own target order); the run's date is kept beside the targets it measured."""
    merged = dict(documented, targets=dict(documented.get("targets", {})))
    merged["targets"].update(run["targets"])
    names = set(documented.get("order") or ()) | set(run.get("order") or ())
    merged["order"] = [n for n in order if n in names] + sorted(n for n in names if n not in order)
    merged["merged"] = list(documented.get("merged") or ()) + [
        {"generated": run.get("generated"), "targets": sorted(run["targets"])}]
    return merged


def load_results(path):
    if not os.path.exists(path):
        return {"targets": {}, "order": []}
    with open(path) as handle:
        return json.load(handle)


# --------------------------------------------------------------------------- table
def verdict_of(site):
    """The verdict word ``status`` prints for the row's site: ``patched`` or ``fixed upstream``; a subclass that
    inherits the method gets its base's, with the ``via`` its reason names (status: "patched (via Base.method)")."""
    if site.inherits:
        bases = {verdict_of(base) for base in _bases_of(site)}
        word = bases.pop() if len(bases) == 1 else "as its base"
        return "%s (via `%s`)" % (word, site.inherits)
    return "patched" if site.fix is not None else "fixed upstream"


def _release_key(text):
    return tuple(int(part) if part.isdigit() else 0 for part in (text or "0").split("."))


def _bases_of(site):
    """The rows of the method ``site`` inherits (same package) whose releases start inside the site's range."""
    from tpu_closure_fix.sites import CALL_SITES

    lower, upper = _bounds(site.releases)
    low, high = _release_key(lower), _release_key(upper) if upper else None
    return [base for base in CALL_SITES if base.package == site.package and base.qualname == site.inherits
            and not base.inherits and low <= _release_key(_bounds(base.releases)[0])
            and (high is None or _release_key(_bounds(base.releases)[0]) < high)]


def strategy_of(site):
    if site.inherits:
        if {verdict_of(base) for base in _bases_of(site)} == {"fixed upstream"}:
            return "none: the base method's upstream fix, verified, never touched"
        return "covered by the patch of the base method"
    if site.fix is None:
        return "none: code shape verified, never touched"
    return site.fix.describe()


def scenarios_for(site, target, hook="matrix_scenarios"):
    """Scenarios of ``target`` that ran through ``site``: asked of the site's integration
    (``integrations/<name>/verify.py``: ``matrix_scenarios`` where the target installs the site's
    package, ``double_scenarios`` where a test double stands in for it); none without the function."""
    import importlib

    try:
        verify = importlib.import_module("tpu_closure_fix.integrations.%s.verify" % site.integration)
    except ImportError:
        return []
    choose = getattr(verify, hook, None)
    return choose(site, target) if choose is not None else []


def evidence(site, name, target):
    """One target's verification of ``site``: text, or None if the target does not carry the row."""
    hits = [r for r in target.get("status") or [] if r.get("variant") == site.variant]
    scenarios = scenarios_for(site, target) if hits else scenarios_for(site, target, "double_scenarios")
    if not hits and not scenarios:
        return None
    release = hits[0].get("release") if hits else None
    details = target.get("scenarios") or {}
    label = "`%s`" % name
    if target.get("wrapt") and "+wrapt" in name:
        label += " (wrapt %s)" % target["wrapt"]
    if not hits:
        label += " (%s: the test double)" % site.package
    if release and release not in name:
        label += " (%s)" % release
    if target.get("verdict") != "pass":
        return "%s: **FAIL**" % label
    if not scenarios:
        return "%s: status `%s`" % (label, hits[0].get("verdict"))
    apis = {s.split("-", 1)[0] for s in scenarios}
    short = ", ".join(s if len(apis) > 1 else s.split("-", 1)[1] for s in scenarios)
    affected = [s for s in scenarios if (details.get(s) or {}).get("bug_can_occur")]
    text = "%s: %s" % (label, short)
    if affected:
        worst = max((details[s].get("divergence_without_shim") or 0.0) for s in affected)
        text += " = reference bitwise; without shim diverge (max %.2g)" % worst
    else:
        text += " = reference bitwise, identical without shim"
        if site.fix is None and not site.inherits:
            text += ", not wrapped"
    return text


def unlisted(targets):
    """Affected code no row patches, asked of each integration (``verify.py``: ``unlisted_rows``): a release
    line the torch_xla guard protects, or code that cannot be verified here. Dicts with the table's cells."""
    import importlib

    from tpu_closure_fix import integrations

    out = []
    for name in integrations.NAMES:
        try:
            verify = importlib.import_module("tpu_closure_fix.integrations.%s.verify" % name)
        except ImportError:
            continue
        rows = getattr(verify, "unlisted_rows", None)
        out.extend(rows(targets) if rows is not None else [])
    return out


#: The widest line of the generated list (docs/support.md): long cells wrap onto indented lines.
WIDTH = 120


def _item(prefix, text, indent):
    """``text`` as a list item starting with ``prefix``, wrapped at :data:`WIDTH`, continued at ``indent``."""
    import textwrap

    return textwrap.wrap(text, WIDTH, initial_indent=prefix, subsequent_indent=" " * indent,
                         break_long_words=False, break_on_hyphens=False) or [prefix.rstrip()]


def _row_block(integration, releases, call_site, verdict, fix, checks):
    """One row of the table as a nested list: what and where, then its verdict, fix and matrix evidence."""
    lines = _item("- ", "**%s** · %s · %s" % (integration, releases, call_site), 2)
    lines += _item("  - ", "verdict: %s" % verdict, 4)
    lines += _item("  - ", "fix: %s" % fix, 4)
    if not checks:
        return lines + _item("  - ", "verified by the release matrix: not in the matrix", 4)
    lines += ["  - verified by the release matrix:"]
    for check in checks:
        lines += _item("    - ", check, 6)
    return lines


def build_table(results):
    """The full table as a list, one entry per call-site row (then the affected code no row patches), each
    line at most :data:`WIDTH` columns."""
    from tpu_closure_fix.sites import CALL_SITES

    targets = results.get("targets") or {}
    order = [n for n in (results.get("order") or sorted(targets)) if n in targets]
    lines = ["Each entry: integration · releases · call site; then its verdict, its fix and what the release "
             "matrix verified.", ""]
    for site in CALL_SITES:
        checks = [e for e in (evidence(site, name, targets[name]) for name in order) if e]
        lines += _row_block(site.integration, "%s `%s`" % (site.package, site.releases),
                            "`%s:%s`" % (site.module, site.qualname), verdict_of(site), strategy_of(site), checks)
    for row in unlisted(targets):
        lines += _row_block(row["integration"], "%s `%s`" % (row["package"], row["releases"]),
                            "`%s`" % row["call_site"], row["verdict"], row["fix"], row["evidence"])
    if targets:
        passed = sum(1 for t in targets.values() if t.get("verdict") == "pass")
        lines.append("")
        lines += _item("", "Release matrix: %d/%d targets pass (torch %s, Python %s, %s). Scenarios: 2 gloo replicas, "
                       "the frameworks' real loops, only torch_xla (and the Neuron SDK) replaced; see "
                       "tests/target/test_replicas.py (Lightning), tests/target/test_accelerate.py (accelerate) and "
                       "tests/target/test_optimum_neuron.py (optimum-neuron)."
                       % (passed, len(targets), results.get("torch"), results.get("python"),
                          (results.get("generated") or "")[:10]), 0)
    else:
        lines.append("")
        lines.append("No matrix results yet: run `python scripts/matrix.py` then "
                     "`python scripts/support_table.py --update-results`.")
    return "\n".join(lines)


def _bounds(specifier):
    """(lower, upper) of a ``>=a,<b`` / ``>=a`` specifier (None where open)."""
    lower = upper = None
    for part in specifier.split(","):
        part = part.strip()
        if part.startswith(">="):
            lower = part[2:]
        elif part.startswith("<"):
            upper = part[1:]
    return lower, upper


def _summary_verdict(site):
    if site.fix is None:
        return "fixed upstream (verified, untouched)"
    if site.integration == "torch_xla":
        return "**affected: patched** (the guard)"
    return "**affected: patched**"


def build_summary(results):
    """README's compact table: one line per package and verdict range."""
    from tpu_closure_fix.sites import CALL_SITES

    targets = results.get("targets") or {}
    by_package = {}  # package -> [[integration, package, lower, upper, verdict, variants]], in table order
    for site in CALL_SITES:
        if site.inherits:
            continue
        lower, upper = _bounds(site.releases)
        verdict = _summary_verdict(site)
        ranges = by_package.setdefault(site.package, [])
        last = ranges[-1] if ranges else None
        if last and last[4] == verdict and last[3] == lower:
            last[3] = upper
            last[5].append(site.variant)
        else:
            ranges.append([site.integration, site.package, lower, upper, verdict, [site.variant]])
    groups = [group for ranges in by_package.values() for group in ranges]
    lines = ["| framework | package | releases | verdict | matrix targets passing |", "|---|---|---|---|---|"]
    for integration, package, lower, upper, verdict, variants in groups:
        names = sorted(name for name, target in targets.items()
                       if any(r.get("variant") in variants for r in target.get("status") or []))
        passed = sum(1 for name in names if targets[name].get("verdict") == "pass")
        releases = ">= %s" % lower + (", < %s" % upper if upper else "")
        lines.append("| %s | `%s` | %s | %s | %s |" % (integration, package, releases, verdict,
                                                      "%d/%d" % (passed, len(names)) if names else "-"))
    for row in unlisted(targets):
        names = row["targets"]
        passed = sum(1 for name in names if targets[name].get("verdict") == "pass")
        lines.append("| %s | `%s` | %s | %s | %s |" % (row["integration"], row["package"], row["summary_releases"],
                                                      row["summary_verdict"],
                                                      "%d/%d" % (passed, len(names)) if names else "-"))
    return "\n".join(lines)


# --------------------------------------------------------------------------- README
def splice(readme_text, table, start=START, end=END):
    block = "%s\n%s\n%s" % (start, table, end)
    if start in readme_text and end in readme_text:
        head = readme_text[:readme_text.index(start)]
        tail = readme_text[readme_text.index(end) + len(end):]
        return head + block + tail
    sep = "" if readme_text.endswith("\n\n") or not readme_text else ("\n" if readme_text.endswith("\n") else "\n\n")
    return readme_text + sep + block + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a generated table is out of date")
    parser.add_argument("--update-results", action="store_true",
                        help="copy %s to %s (trimmed) first" % (os.path.relpath(RUN_RESULTS, REPO),
                                                                os.path.relpath(DOCS_RESULTS, REPO)))
    parser.add_argument("--merge-results", metavar="MATRIX_JSON",
                        help="put the targets of a partial matrix run (scripts/matrix.py --targets ... --results DIR:"
                             " DIR/matrix.json) into %s, keeping the others" % os.path.relpath(DOCS_RESULTS, REPO))
    parser.add_argument("--results", default=DOCS_RESULTS, help="matrix results to read (default docs/matrix-results.json)")
    parser.add_argument("--readme", default=README)
    parser.add_argument("--support", default=SUPPORT)
    parser.add_argument("--print", action="store_true", help="print the table, touch nothing")
    args = parser.parse_args(argv)

    if args.update_results:
        with open(RUN_RESULTS) as handle:
            trimmed = trim(json.load(handle))
        os.makedirs(os.path.dirname(DOCS_RESULTS), exist_ok=True)
        with open(DOCS_RESULTS, "w") as handle:
            json.dump(trimmed, handle, indent=1, sort_keys=True)
            handle.write("\n")
        print("wrote %s" % os.path.relpath(DOCS_RESULTS, REPO))

    if args.merge_results:
        with open(args.merge_results) as handle:
            run = trim(json.load(handle))
        merged = merge(load_results(DOCS_RESULTS), run, list(_matrix_targets()))
        with open(DOCS_RESULTS, "w") as handle:
            json.dump(merged, handle, indent=1, sort_keys=True)
            handle.write("\n")
        print("merged %d target(s) into %s" % (len(run["targets"]), os.path.relpath(DOCS_RESULTS, REPO)))

    results = load_results(args.results)
    table = build_table(results)
    if args.print:
        print(table)
        return 0
    outdated = []
    for path, block, start, end in ((args.support, table, START, END),
                                    (args.readme, build_summary(results), SUMMARY_START, SUMMARY_END)):
        current = open(path).read() if os.path.exists(path) else ""
        updated = splice(current, block, start, end)
        if updated == current:
            continue
        outdated.append(os.path.relpath(path, REPO))
        if not args.check:
            with open(path, "w") as handle:
                handle.write(updated)
    if args.check:
        if outdated:
            print("out of date: %s: run python scripts/support_table.py" % ", ".join(outdated), file=sys.stderr)
            return 1
        print("support tables are up to date")
        return 0
    print("updated %s" % (", ".join(outdated) or "nothing (already up to date)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

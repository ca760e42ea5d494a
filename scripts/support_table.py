#!/usr/bin/env python
"""Generate README.md's support table from the call-site table and the matrix results.

Usage::

    python scripts/support_table.py                  # rewrite the table in README.md
    python scripts/support_table.py --check          # exit 1 if README's table is out of date
    python scripts/support_table.py --update-results # copy results/matrix.json -> docs/matrix-results.json, then rewrite
    python scripts/support_table.py --print          # print the table only

One row per entry of ``tpu_closure_fix.sites.CALL_SITES``: release range,
call site (module:Class.method), verdict (patched / fixed upstream / inherits),
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
DOCS_RESULTS = os.path.join(REPO, "docs", "matrix-results.json")
RUN_RESULTS = os.path.join(REPO, "results", "matrix.json")
START = "<!-- support-table:start -->"
END = "<!-- support-table:end -->"

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


def load_results(path):
    if not os.path.exists(path):
        return {"targets": {}, "order": []}
    with open(path) as handle:
        return json.load(handle)


# --------------------------------------------------------------------------- table
def verdict_of(site):
    if site.inherits:
        return "inherits `%s`" % site.inherits
    return "patched" if site.fix is not None else "fixed upstream"


def strategy_of(site):
    if site.inherits:
        return "covered by the patch of the base method"
    if site.fix is None:
        return "none: code shape verified, never touched"
    return site.fix.describe()


def _is_trainer_row(site):
    return site.package in ("pytorch_lightning", "lightning.pytorch")


def scenarios_for(site, target):
    """Scenarios of ``target`` that ran through ``site``."""
    run = target.get("scenarios_run") or []
    lite_kind = ((target.get("lightning") or {}).get("lite") or "")
    if _is_trainer_row(site):
        names = [n for n in run if n.startswith("trainer-")]
        if lite_kind.endswith("(pl-lite)"):  # PL 1.5-1.7 LightningLite goes through the Trainer plugin
            names += [n for n in run if n.startswith("lite-")]
    else:
        names = [n for n in run if n.startswith("lite-")]
    if site.inherits:
        names = [n for n in names if n.endswith("-bf16")]
    return names


def evidence(site, name, target):
    """One target's verification of ``site``: text, or None if the target does not carry the row."""
    hits = [r for r in target.get("status") or [] if r.get("variant") == site.variant]
    if not hits:
        return None
    release = hits[0].get("release")
    scenarios = scenarios_for(site, target)
    details = target.get("scenarios") or {}
    label = "`%s`" % name
    if target.get("wrapt") and "+wrapt" in name:
        label += " (wrapt %s)" % target["wrapt"]
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


def build_table(results):
    from tpu_closure_fix.sites import CALL_SITES

    targets = results.get("targets") or {}
    order = [n for n in (results.get("order") or sorted(targets)) if n in targets]
    lines = [
        "| integration | releases | call site | verdict | fix | verified by the release matrix |",
        "|---|---|---|---|---|---|",
    ]
    for site in CALL_SITES:
        checks = [e for e in (evidence(site, name, targets[name]) for name in order) if e]
        lines.append("| %s | %s `%s` | `%s:%s` | %s | %s | %s |" % (
            site.integration,
            site.package,
            site.releases,
            site.module,
            site.qualname,
            verdict_of(site),
            strategy_of(site),
            "<br>".join(checks) if checks else "not in the matrix",
        ))
    if targets:
        passed = sum(1 for t in targets.values() if t.get("verdict") == "pass")
        lines.append("")
        lines.append("Release matrix: %d/%d targets pass (torch %s, Python %s, %s). Scenarios: 2 gloo replicas, "
                     "real Lightning loops, only torch_xla replaced; see tests/target/test_replicas.py."
                     % (passed, len(targets), results.get("torch"), results.get("python"),
                        (results.get("generated") or "")[:10]))
    else:
        lines.append("")
        lines.append("No matrix results yet: run `python scripts/matrix.py` then "
                     "`python scripts/support_table.py --update-results`.")
    return "\n".join(lines)


# --------------------------------------------------------------------------- README
def splice(readme_text, table):
    block = "%s\n%s\n%s" % (START, table, END)
    if START in readme_text and END in readme_text:
        head = readme_text[:readme_text.index(START)]
        tail = readme_text[readme_text.index(END) + len(END):]
        return head + block + tail
    sep = "" if readme_text.endswith("\n\n") or not readme_text else ("\n" if readme_text.endswith("\n") else "\n\n")
    return readme_text + sep + block + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md's table is out of date")
    parser.add_argument("--update-results", action="store_true",
                        help="copy %s to %s (trimmed) first" % (os.path.relpath(RUN_RESULTS, REPO),
                                                                os.path.relpath(DOCS_RESULTS, REPO)))
    parser.add_argument("--results", default=DOCS_RESULTS, help="matrix results to read (default docs/matrix-results.json)")
    parser.add_argument("--readme", default=README)
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

    table = build_table(load_results(args.results))
    if args.print:
        print(table)
        return 0
    current = open(args.readme).read() if os.path.exists(args.readme) else ""
    updated = splice(current, table)
    if args.check:
        if updated != current:
            print("README.md support table is out of date: run python scripts/support_table.py", file=sys.stderr)
            return 1
        print("README.md support table is up to date")
        return 0
    if updated != current:
        with open(args.readme, "w") as handle:
            handle.write(updated)
        print("updated %s" % os.path.relpath(args.readme, REPO))
    else:
        print("README.md support table already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())

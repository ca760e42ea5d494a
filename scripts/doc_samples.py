#!/usr/bin/env python
"""Regenerate the sample outputs shown in docs/ from the code that prints them.

Usage::

    python scripts/doc_samples.py            # rewrite every sample between its markers
    python scripts/doc_samples.py --check    # exit 1 naming each sample that is out of date

Each sample sits between ``<!-- sample:NAME:start -->`` and ``<!-- sample:NAME:end -->`` in its document, as a
fenced ``text`` block (or as Markdown: :data:`MARKDOWN`), and is rendered by the function that prints it:

* ``demo`` (docs/demo.md): what ``tpu-closure-fix demo`` prints of its two runs (``demo._report``), from the
  results of the run that made docs/demo.png, kept in docs/demo-results.json (``results.json`` of
  ``bash scripts/demo.sh --out DIR --png docs/demo.png``, copied there: ``--demo-results DIR/results.json``).
* ``compiled-only`` (docs/support.md): the two lines ``status`` prints for an installed compiled-only
  distribution, the torch_xla guard in place and not (``report.render_compiled_only``, wrapped as ``status``
  wraps: ``textfit.fit``), for the items ``tests/unit/test_fresh_status.py`` gets from its stand-in.

* ``matrix`` (docs/proof.md): the release matrix's closing table (``scripts/matrix.py``'s ``render``), from the
  results kept in docs/matrix-results.json (``scripts/support_table.py --update-results`` / ``--merge-results``).
* ``settings`` (docs/settings.md): every ``TPU_CLOSURE_FIX*`` variable, from the table the package reads them by
  (``tpu_closure_fix.settings.TABLE``); Markdown (a list), not a fenced block.

tests/unit/test_doc_samples.py runs ``--check``. Python 3.8+, standard library and this repository's package.
"""
import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
DEMO_RESULTS = os.path.join(REPO, "docs", "demo-results.json")
#: What docs/demo-results.json keeps of a run's summary: what the demo prints of it.
DEMO_KEYS = ("steps", "shim", "lightning", "max_divergence", "final_divergence", "replicas", "synccheck")
#: The compiled-only items of tests/unit/test_fresh_status.py's stand-in: the guard patched, and switched off.
ENTERPRISE = {"distribution": "pytorch-lightning-enterprise", "release": "2.6.0", "integration": "torch_xla",
              "call": "XLAPrecision.optimizer_step passes the closure to xm.optimizer_step"}
COMPILED_ONLY = [
    dict(ENTERPRISE, covered_by="torch_xla", guard="torch_xla.core.xla_model:optimizer_step patched"),
    dict(ENTERPRISE, covered_by=None, guard="torch_xla.core.xla_model:optimizer_step disabled "
                                            "(TPU_CLOSURE_FIX_DISABLE names torch_xla)"),
]


def demo_sample():
    from tpu_closure_fix.integrations.lightning import demo

    with open(DEMO_RESULTS) as handle:
        runs = list(json.load(handle).items())  # shim off, then on: the order the demo ran them
    return demo._report(runs, len(runs[0][1]["replicas"]))


def compiled_only_sample():
    from tpu_closure_fix import textfit
    from tpu_closure_fix.outcome import render

    return textfit.fit("\n".join(render.compiled_only_lines(COMPILED_ONLY)))


def matrix_sample():
    """scripts/matrix.py's table of the targets in docs/matrix-results.json, in the matrix's order; the rows hold
    what the matrix's own rows hold (the status records are the sites present: patched, fixed upstream or
    guarded)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tpu_closure_fix_matrix", os.path.join(REPO, "scripts",
                                                                                         "matrix.py"))
    matrix = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(matrix)
    with open(os.path.join(REPO, "docs", "matrix-results.json")) as handle:
        results = json.load(handle)
    rows = {}
    for name, target in results["targets"].items():
        status = target.get("status") or []
        rows[name] = {"status": status, "verdict": target["verdict"],
                      "sites_patched": sum(1 for r in status if r["verdict"] == "patched"),
                      "sites_fixed_upstream": sum(1 for r in status if r["verdict"] == "fixed upstream"),
                      "summary": {key: target.get(key) for key in ("steps_compared", "max_divergence_with_shim",
                                                                    "max_divergence_without_shim")}}
    names = [name for name in results["order"] if name in rows]
    return matrix.render(names, rows)


def settings_sample():
    """The list of every ``TPU_CLOSURE_FIX*`` setting, one item per row of ``tpu_closure_fix.settings.TABLE``:
    the accepted values, what unset means, what a bad value does and how it is said."""
    from tpu_closure_fix import settings, textfit

    lines = []
    for row in settings.TABLE:
        said = ("a `TPUClosureFixWarning` at the importing line" if row.said == settings.WARNING else
                "a report on the `tpu_closure_fix.synccheck` logger (no warnings filter mutes it)")
        lines.extend(textfit.wrap("* `%s`: %s. Unset or empty: %s. A bad value: %s, said once as %s." % (
            row.name, row.accepted, row.unset, row.on_bad, said)))
    return "\n".join(lines)


SAMPLES = {"demo": (os.path.join("docs", "demo.md"), demo_sample),
           "compiled-only": (os.path.join("docs", "support.md"), compiled_only_sample),
           "matrix": (os.path.join("docs", "proof.md"), matrix_sample),
           "settings": (os.path.join("docs", "settings.md"), settings_sample)}
#: Samples that are Markdown themselves (a list), spliced as they are rather than as a fenced text block.
MARKDOWN = ("settings",)


def splice(text, name, sample, fenced=True):
    """``text`` with the block between sample ``name``'s markers replaced by ``sample``: a fenced text block, or
    (``fenced`` false) the Markdown itself."""
    start, end = "<!-- sample:%s:start -->" % name, "<!-- sample:%s:end -->" % name
    if start not in text or end not in text:
        raise SystemExit("doc_samples.py: the markers %s ... %s are missing" % (start, end))
    head, rest = text.split(start, 1)
    tail = rest.split(end, 1)[1]
    block = "```text\n%s\n```" % sample if fenced else sample
    return "%s%s\n%s\n%s%s" % (head, start, block, end, tail)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a sample is out of date")
    parser.add_argument("--demo-results", metavar="RESULTS_JSON",
                        help="keep this demo run's results.json as docs/demo-results.json first")
    args = parser.parse_args(argv)
    if args.demo_results:
        with open(args.demo_results) as handle:
            runs = json.load(handle)
        with open(DEMO_RESULTS, "w") as handle:
            json.dump({label: {key: summary[key] for key in DEMO_KEYS} for label, summary in runs.items()}, handle,
                      indent=1)
            handle.write("\n")
    outdated = []
    for name, (document, render) in sorted(SAMPLES.items()):
        path = os.path.join(REPO, document)
        with open(path) as handle:
            current = handle.read()
        updated = splice(current, name, render(), fenced=name not in MARKDOWN)
        if updated != current:
            outdated.append("%s (%s)" % (name, document))
            if not args.check:
                with open(path, "w") as handle:
                    handle.write(updated)
    if args.check:
        if outdated:
            print("out of date: %s: run python scripts/doc_samples.py" % ", ".join(outdated), file=sys.stderr)
            return 1
        print("doc samples are up to date")
        return 0
    print("updated %s" % (", ".join(outdated) or "nothing (already up to date)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

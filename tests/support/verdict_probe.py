"""What status claims, and what a call actually does, for every installed site, in one process.

Run as ``python -m support.verdict_probe [--late]`` with the framework (or a constructed copy of a
release) on the path. The package's recording CPU simulation of torch_xla
(:mod:`tpu_closure_fix._simulated_xla`, the ``check`` self-test's stand-in) takes torch_xla's place
*before* the framework is imported, so a module that binds ``from torch_xla.core.xla_model import
optimizer_step`` at import time binds the stand-in's function, exactly as with real torch_xla.

* default: ``import tpu_closure_fix`` first (TPU_CLOSURE_FIX=1): the guard is patched before the
  framework binds anything;
* ``--late``: started with TPU_CLOSURE_FIX=0, the framework imported, then ``tpu_closure_fix.enable()``
  (the "enabled late" order: explicit import after the framework, ``python -S``, enable() after
  TPU_CLOSURE_FIX=0).

Then ``status()`` is read and one optimizer step is run through every site that has code of its own
(inheriting rows are their base's code) with the integration's verification driver, recording the
events. Prints ``PROBE {"sites": [...]}``: each ``{"site", "verdict", "reason", "events", "order_ok",
"error", "decorated"}`` (``decorated``: calls recorded by a constructed release's decorator, or None).
"""
import argparse
import json
import sys
import warnings


def _driver_row(record):
    from tpu_closure_fix import sites
    from tpu_closure_fix.verify import table

    if record["variant"]:
        return table.row_by_variant(record["variant"])
    # A release no row names: drive the code the way the site's newest row would be driven.
    rows = [row for row in sites.rows_for(record["module"], record["method"]) if not row.inherits]
    return rows[-1] if rows else None


def _drive(record, xm, torch):
    """One step through the record's site by the ``check`` self-test's own driver; None for a site with
    no code of its own."""
    from tpu_closure_fix.verify import events as recorder

    row = _driver_row(record)
    if row is None or row.inherits:
        return None
    events, error = recorder.run_event_step(row, torch, xm)
    module = sys.modules.get(record["module"])
    decorated = getattr(module, "DECORATED_CALLS", None)
    return {"site": "%s:%s" % (record["module"], record["method"]), "verdict": record["verdict"],
            "reason": record["reason"], "release": record["release"], "events": events,
            "order_ok": error is None and recorder.verdict(events), "error": error,
            "decorated": len(decorated) if decorated is not None else None}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--late", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    if not args.late:
        import tpu_closure_fix  # noqa: F401 - enables the shim (unless TPU_CLOSURE_FIX=0) before anything is bound
    import torch

    from tpu_closure_fix.outcome import records as report
    from tpu_closure_fix.verify import events as recorder

    xm = recorder.install_recording_xla_model()
    errors = report.import_installed_sites()
    if args.late:
        import tpu_closure_fix

        assert not tpu_closure_fix.is_enabled()
        tpu_closure_fix.enable()
    records = report.status(import_errors=errors)
    sites = [found for found in (_drive(record, xm, torch) for record in records
                                 if record["verdict"] not in ("not installed", "not imported yet",
                                                              "not in this release")) if found]
    print("PROBE " + json.dumps({"sites": sites, "status": records}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

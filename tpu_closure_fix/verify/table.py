"""Which code the verification drives: the rows of the call-site table that are in place here.

The self-test and the graph check never look for a framework class by name.  They ask the engine
(through ``status()``) which row of :data:`tpu_closure_fix.sites.CALL_SITES` matched the loaded
release of each installed call site, and drive exactly that row's ``module`` + ``qualname``:
the class (or function) the table patched, or verified as fixed upstream.  Each row belongs to
an integration; its driver, ``tpu_closure_fix.integrations.<integration>.verify``, knows how to
run one optimizer step through that integration's code (see :mod:`tpu_closure_fix.verify`).
"""
import importlib
import importlib.util
from collections import namedtuple

from .. import sites as _sites

__all__ = ["VERIFIED_VERDICTS", "Target", "site_id", "sites_to_verify", "row_by_variant", "resolve", "driver_for",
           "missing_driver", "untested"]

#: Status verdicts whose code a self-test runs: the shim's wrapper, the upstream fix, a site whose
#: buggy call goes through the patched guard, or (shim switched off) the original buggy code, which
#: the self-test must show as buggy.  Sites that are skipped or failed are reported unprotected by
#: the status alone.
VERIFIED_VERDICTS = ("patched", "fixed upstream", "guarded", "disabled")

#: ``owner``: the class named by the qualname (None for a module-level function);
#: ``attribute``: the method or function name; ``function``: what is there now (maybe our wrapper).
Target = namedtuple("Target", "row module owner attribute function")


def site_id(row):
    """``module:qualname``, the name reports use for a site."""
    return "%s:%s" % (row.module, row.qualname)


def row_by_variant(variant):
    for row in _sites.CALL_SITES:
        if row.variant == variant:
            return row
    raise KeyError("no row %r in the call-site table" % (variant,))


def sites_to_verify(records=None):
    """``[(status record, row)]`` for every installed site that a self-test should drive.

    Imports the installed call-site modules first (as ``check`` does).  Rows that only inherit
    the method (``inherits``) are covered by their base row and left out; so are guarded records the
    engine matched to no row (the guard's own row is verified).  A site of a release no row names
    (skipped, "not verified") is driven with its method's newest row: its call decides.
    """
    if records is None:
        from ..outcome import records as _records

        records = _records.status(import_errors=_records.import_installed_sites())
    chosen = []
    for record in records:
        if record["verdict"] in VERIFIED_VERDICTS and record.get("variant"):
            row = row_by_variant(record["variant"])
        else:
            row = _not_verified_row(record)
        if row is None or row.inherits:
            continue
        chosen.append((record, row))
    return chosen


def _not_verified_row(record):
    """For a site of a release no row names (status: skipped, "not verified"), the row whose driver can
    still run its code: the newest row of the same method that has code of its own. The event test then
    judges that site by what its call does. None for every other record."""
    if record["verdict"] != "skipped" or record.get("variant") or "not verified" not in (record.get("reason") or ""):
        return None
    rows = [row for row in _sites.rows_for(record["module"], record["method"]) if not row.inherits]
    return rows[-1] if rows else None


def resolve(row):
    """The live objects a row names (the module is imported if needed)."""
    module = importlib.import_module(row.module)
    if "." in row.qualname:
        owner_name, attribute = row.qualname.rsplit(".", 1)
        owner = getattr(module, owner_name)
        function = vars(owner).get(attribute, getattr(owner, attribute, None))
    else:
        owner, attribute = None, row.qualname
        function = getattr(module, attribute)
    return Target(row, module, owner, attribute, function)


def _driver_name(row):
    return "tpu_closure_fix.integrations.%s.verify" % row.integration


def missing_driver(row):
    """None when the row's integration has a verification driver, else why not (one line)."""
    try:
        found = importlib.util.find_spec(_driver_name(row)) is not None
    except ImportError:
        found = False
    if found:
        return None
    return "the %s integration has no verification driver (tpu_closure_fix/integrations/%s/verify.py)" \
        % (row.integration, row.integration)


def untested(chosen):
    """The chosen ``(record, row)`` pairs no driver can drive, as report entries."""
    return [{"site": site_id(row), "variant": row.variant, "verdict": record["verdict"], "reason": why}
            for record, row in chosen for why in [missing_driver(row)] if why]


def driver_for(row):
    """The integration's verification driver module (``integrations/<name>/verify.py``)."""
    return importlib.import_module(_driver_name(row))

"""The payload: what the interpreter that trains tells the process that asked, across the process boundary.

In the fresh interpreter (:mod:`tpu_closure_fix.verify.fresh`), :func:`child_main` inspects the start-up hook
once, activates the shim only where that hook would, lists every site (:mod:`.records`) and prints
:func:`build`'s dict as one JSON line. In the process that asked, :func:`receive` turns that dict (or the error
of a child that gave none) into :class:`Evidence`, which :mod:`.decide` and :mod:`.render` read: nothing is
imported or inspected again there.
"""
import importlib.util
import os
import sys
from collections import namedtuple

#: Why a site the shim would patch runs its original code in an interpreter whose start-up hook does not run.
HOOK_INACTIVE = "start-up hook inactive"


def child_main(facts):
    """In the fresh interpreter, after the facts and the held-back import of the shim: activate it as that
    interpreter's start-up hook would (or not), list every site, print the payload."""
    from ..verify import child, fresh

    hook = fresh.startup_hook(facts)
    if not leaves_shim_off(facts, hook):
        from .. import activation, settings

        settings.reload()  # the held-back import read the switches held back; the environment is restored now
        activation.activate()  # what the start-up module's import of tpu_closure_fix does at a watched import
    child.emit(build(facts, hook))


def leaves_shim_off(facts, hook):
    """True when a script started in the interpreter of ``facts`` never gets the shim although it is not switched
    off (``hook``: :func:`.verify.fresh.startup_hook`'s answer, inactive): no site is patched there. Switched off,
    the sites say ``disabled`` with the switch's value, as everywhere."""
    from ..settings import parse_switch

    return hook[0] is False and parse_switch(facts.get("switch"))[0]


def build(facts, hook=None):
    """The payload: the facts, the start-up hook's answer (``hook``; inspected here when None) and every site's
    record, as this process (importing every installed site module) sees it."""
    import tpu_closure_fix

    from ..__about__ import __version__
    from ..verify import fresh, scan
    from . import records as _records

    hook = fresh.startup_hook(facts) if hook is None else hook
    off = leaves_shim_off(facts, hook)
    failures = _records.import_installed_sites()
    listed = _records.status(import_errors=failures, unpatched_reason=HOOK_INACTIVE if off else None)
    try:
        uncovered, scan_error = scan.uncovered_steps(), None
    except Exception as exc:  # the search itself failed: then nothing says the release is covered
        uncovered, scan_error = [], "%s: %s" % (type(exc).__name__, exc)
    from .. import sites as _sites

    return {"facts": facts, "startup_hook": {"active": hook[0], "reason": hook[1]}, "records": listed,
            "shim_version": __version__, "shim_path": os.path.dirname(os.path.abspath(tpu_closure_fix.__file__)),
            "uncovered": uncovered, "scan_error": scan_error, "compiled_only": _records.compiled_only(listed),
            "origins": _origins(_sites.top_level_packages())}


def _origins(packages):
    """{package: the folders (a package) or the file (a module) this process imported it from, or would}."""
    found = {}
    for package in packages:
        module = sys.modules.get(package)
        if module is not None:
            locations = list(getattr(module, "__path__", None) or []) or [getattr(module, "__file__", None)]
        else:
            try:
                spec = importlib.util.find_spec(package)
            except (ImportError, ValueError):
                spec = None
            locations = (list(spec.submodule_search_locations or []) or [spec.origin]) if spec is not None else []
        locations = [location for location in locations if isinstance(location, str)]
        if locations:
            found[package] = locations
    return found


# --------------------------------------------------------------------------- in the process that asked
class Evidence(namedtuple("Evidence", "payload error facts records hook asked sync")):
    """What the process that asked knows of the interpreter that trains.

    ``payload``: the dict the child printed (with ``beside_script``), or None; ``error``: why there is none or
    why its records do not count, or None; ``facts``: its facts (``{}`` without a report); ``records``: its site
    records, or None when it listed none; ``hook``: ``(active, reason)`` of its start-up hook; ``asked``: the
    interpreter asked about; ``sync``: the zero-code sync check's line (:mod:`.sync_line`)."""

    __slots__ = ()

    @property
    def python(self):
        """The interpreter asked about, as it named itself (or as it was given, when it did not report)."""
        return self.facts.get("executable") or self.asked


def receive(payload, error=None, asked=None, environ=None):
    """:class:`Evidence` of the child's ``payload`` (or None) and ``error``; ``asked``: the interpreter asked
    about (default: this one); ``environ``: the environment the training starts with (default ``os.environ``).
    The start-up hook's answer is the one the child gave; only a payload without one (another release of the
    shim, ``status --here`` test doubles) has it inspected here, once."""
    from . import sync_line

    payload = payload if isinstance(payload, dict) else None
    facts = (payload or {}).get("facts") or {}
    records = payload.get("records") if payload is not None and "records" in payload else None
    asked = asked or sys.executable
    hook = _hook_of(payload, facts, asked)
    environ = os.environ if environ is None else environ
    return Evidence(payload, error, facts, records, hook, asked, sync_line.line(facts, hook, environ))


def _hook_of(payload, facts, asked):
    """``(active, reason)`` of the start-up hook: the child's answer, else inspected from its facts, else
    unknown with the reason in words."""
    given = (payload or {}).get("startup_hook")
    if isinstance(given, dict) and "active" in given:
        return given["active"], given.get("reason")
    if facts.get("executable") or facts.get("here"):
        from ..verify import fresh

        return fresh.startup_hook(facts)
    return None, "not known: no report from %s: the outcome below says why" % asked

"""The live records: one dict per known call site, computed from the live objects of the interpreter that trains.

Runs in that interpreter (the fresh child of :mod:`tpu_closure_fix.verify.fresh`, or this process for
``status --here`` and :func:`tpu_closure_fix.status`): every installed call-site module is imported, every site
examined by the engine. What the records say is read again, without importing anything, by
:mod:`.decide` and :mod:`.render` in the process that asked.
"""
import importlib.util
import os
import sys

from .. import engine
from .. import sites as _sites
from ..releases import loaded_release, owning_distributions

FIELDS = ("distribution", "release", "module", "method", "verdict", "reason", "variant", "integration")
FIELDS = ("distribution", "release", "module", "method", "verdict", "reason", "variant", "integration")

#: How the reason of a ``failed`` site whose module could not be imported starts: its code cannot run at
#: all, so it runs no order, buggy or fixed (``check`` answers "could not verify" for it).
IMPORT_FAILED = "import failed: "
#: What precedes the fix of an import failure whose cause is known (:func:`known_fix`) in a site's reason.
KNOWN_FIX = "; fix: "


def _installed(package):
    top = package.split(".")[0]
    if top in sys.modules:
        return True
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def _distribution(site_rows, package):
    top = package.split(".")[0]
    owners = owning_distributions(top) if top in sys.modules else []
    if owners:
        names = [owner.split(" ")[0] for owner in owners]
        text = " | ".join(names)
        if top != "lightning" and all(name.lower().replace("-", "_") != top for name in names):
            text += " (vendored %s)" % top
        return text
    return site_rows[0].distribution


def status(import_errors=None, unpatched_reason=None):
    """List of dicts, one per (module, class.method) of the table.

    Keys: distribution, release, module, method, verdict, reason, variant, integration.
    ``verdict`` is one of: patched, fixed upstream, guarded, not installed,
    not imported yet, not in this release, disabled, skipped, failed, unpatched.
    ``unpatched_reason``: given when the shim was left off because the interpreter asked about would never
    activate it (its start-up hook does not run): a site the shim would patch is then ``unpatched`` with that
    reason, which is what a script started there runs, rather than ``disabled``.
    ``integration`` is the name of the integration owning the site (``integrations.NAMES``: what
    ``TPU_CLOSURE_FIX_DISABLE`` names; its sites are then ``disabled``).
    Watched modules imported without the import hook firing are patched first
    (:func:`tpu_closure_fix.engine.reconcile`, which warns when it does).
    """
    engine.reconcile()
    records = []
    import_errors = import_errors or {}
    for key in _sites.site_keys():
        module_name, qualname = key
        rows = _sites.rows_for(module_name, qualname)
        package = rows[0].package
        if not _installed(package):
            finding = engine.Finding(engine.NOT_INSTALLED, "", None, None, None)
        elif module_name in import_errors:
            finding = import_errors[module_name]
        else:
            finding = engine.examine(key)
        verdict = finding.verdict
        reason = finding.reason
        if verdict == engine.PATCHABLE:  # guards passed but the hook has not run (e.g. module reloaded)
            verdict, reason = engine.SKIPPED, "not patched yet (module re-imported after enable?)"
        if verdict == engine.DISABLED and unpatched_reason:  # left off on purpose: the shim never runs there
            verdict, reason = engine.UNPATCHED, unpatched_reason
        release = finding.release or (loaded_release(package) if verdict not in (engine.NOT_INSTALLED,) else None)
        records.append({
            "distribution": _distribution(rows, package) if verdict != engine.NOT_INSTALLED else rows[0].distribution,
            "release": release,
            "module": module_name,
            "method": qualname,
            "verdict": verdict,
            "reason": reason,
            "variant": finding.site.variant if finding.site else None,
            "integration": rows[0].integration,
        })
    return records


def import_installed_sites():
    """Import every call-site module whose package is installed; return {module: Finding} for failures.

    Each site's package is imported first: when it cannot be imported, every site of it is FAILED with that
    error (and the fix, where the cause is known: :func:`known_fix`), whatever submodules its failed import
    left behind (they would read as a release without ``__version__``). A module missing from the installed
    release is ABSENT; any other import error of a module is FAILED with the error text.
    """
    failures, broken = {}, {}
    for module_name in _sites.module_names():
        package = _sites.rows_for(module_name)[0].package
        if not _installed(package):
            continue
        if package not in broken:
            broken[package] = _package_import_error(package)
        if broken[package] is not None:
            failures[module_name] = engine.Finding(engine.FAILED, broken[package], None, None, None) \
                if _may_hold(package, module_name) else engine.Finding(engine.ABSENT, "module not in this release",
                                                                       None, None, None)
            continue
        if module_name in sys.modules:
            continue
        try:
            importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if _names_module_of(exc, module_name):
                failures[module_name] = engine.Finding(engine.ABSENT, "module not in this release", None,
                                                       loaded_release(package), None)
            else:
                failures[module_name] = engine.Finding(engine.FAILED, _import_failed(exc), None, None, None)
        except Exception as exc:
            failures[module_name] = engine.Finding(engine.FAILED, _import_failed(exc), None, None, None)
    return failures


def _names_module_of(exc, module_name):
    """True when the ModuleNotFoundError ``exc`` is about ``module_name`` itself or a package holding it (the
    module is not in this release), not about something it imports."""
    return bool(exc.name) and (module_name == exc.name or module_name.startswith(exc.name + "."))


def _may_hold(package, module_name):
    """Whether the installed ``package``, which cannot be imported, may hold the site module ``module_name``: its
    file is there, or no site module of the package has a file there (then nothing tells which are in it)."""
    modules = [name for name in _sites.module_names() if _sites.rows_for(name)[0].package == package]
    return _source_exists(module_name) or not any(_source_exists(name) for name in modules)


def _source_exists(module_name):
    """True unless the installed top-level package of ``module_name`` (located by ``find_spec``, which runs
    nothing of a top-level package) is a folder without that module's file or package: whether a site module is
    in the release, told without importing a package that fails to import."""
    parts = module_name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return True
    locations = list(getattr(spec, "submodule_search_locations", None) or [])
    if not locations:
        return True  # not a folder on disk (a zip, a frozen package): cannot tell, so it may be there
    for location in locations:
        path = os.path.join(location, *parts[1:])
        if os.path.isfile(path + ".py") or os.path.isdir(path):
            return True
    return False


def _package_import_error(package):
    """The reason of a ``failed`` site when ``package`` (a site's package, ``optimum.neuron``) cannot be imported,
    else None (a package of a namespace that is not there: its sites' modules say "not in this release")."""
    if package in sys.modules:
        return None
    try:
        importlib.import_module(package)
    except ModuleNotFoundError as exc:
        return None if _names_module_of(exc, package) else _import_failed(exc)
    except Exception as exc:
        return _import_failed(exc)
    return None


def _import_failed(exc):
    """A failed site's reason: :data:`IMPORT_FAILED`, the exception line and, where the cause is known, its fix."""
    fix = known_fix(exc)
    return IMPORT_FAILED + _exception_line(exc) + (KNOWN_FIX + fix if fix else "")


def known_fix(exc, numpy_release=None):
    """The install line that fixes an import failure whose cause is known, else None.

    * No module named ``pkg_resources``: setuptools 81 dropped it, and Lightning before 2.0 (pytorch-lightning,
      lightning, the lightning_lite it ships) imports it at start.
    * numpy 2 installed and the error names numpy (pytorch-lightning 1.0.x uses names numpy 2 removed).
    ``numpy_release``: the installed numpy's version (default: read from its metadata, never imported).
    """
    if isinstance(exc, ModuleNotFoundError) and exc.name == "pkg_resources":
        return "pip install 'setuptools<81'"
    if "numpy" in str(exc).lower():
        release = numpy_release if numpy_release is not None else _metadata_release("numpy")
        if release and release.split(".")[0].isdigit() and int(release.split(".")[0]) >= 2:
            return "pip install 'numpy<2'"
    return None


def import_error(record):
    """A failed site's reason without the fix of a known cause (:func:`.decide.import_fix` names it, for the
    interpreter)."""
    return (record.get("reason") or "").split(KNOWN_FIX, 1)[0]


def _exception_line(exc):
    """``Name: message`` on one line, the message quoted short when it holds a line break or non-ASCII text."""
    from ..config import QUOTE_LIMIT, quote_value

    text = str(exc)
    if "\n" in text or "\r" in text or not text.isascii():
        text = quote_value(text, limit=4 * QUOTE_LIMIT)
    return "%s: %s" % (type(exc).__name__, text)


def import_failed(record):
    """True when ``record`` is a site whose module failed to import (see :data:`IMPORT_FAILED`)."""
    return record["verdict"] == engine.FAILED and (record.get("reason") or "").startswith(IMPORT_FAILED)


def unprotected(records):
    """Records where an installed, affected site runs the buggy code."""
    return [r for r in records if r["verdict"] in engine.UNPROTECTED]


def installed(records):
    """Records of sites installed in the release at hand."""
    return [r for r in records if r["verdict"] not in (engine.NOT_INSTALLED, engine.ABSENT)]


def site_name(record):
    """``module:Class.method`` of a record."""
    return "%s:%s" % (record["module"], record["method"])


# --------------------------------------------------------------------------- compiled-only distributions
def compiled_only(records):
    """One dict per installed distribution that an integration lists in ``COMPILED_ONLY`` (code no row can
    cover: the integration's guard is its only net): ``distribution``, ``release``, ``call``, ``integration``
    (whose guard it is), ``covered_by`` (that name when its guard covers the call now, else None) and
    ``guard`` (its sites' verdicts, as ``records`` report them). Found by metadata alone: such a
    distribution is never imported."""
    from .. import integrations as _integrations

    found = []
    for integration in _integrations.load():
        for name, call in sorted(getattr(integration, "COMPILED_ONLY", {}).items()):
            release = _metadata_release(name)
            if release is None:
                continue
            guard = [r for r in records if r.get("integration") == integration.NAME]
            # the engine's rule for "guarded" (every site of the guard patched); the call itself cannot be read
            # (compiled only), so its published call through the module attribute is taken as given
            covered = bool(guard) and all(r["verdict"] == engine.PATCHED for r in guard)
            found.append({"distribution": name, "release": release, "call": call, "integration": integration.NAME,
                          "covered_by": integration.NAME if covered else None,
                          "guard": "; ".join(_verdict_text(r) for r in guard) or "no site"})
    return found


def _metadata_release(name):
    """The version of the installed distribution ``name`` (read from its metadata, never imported), or None."""
    try:
        from importlib import metadata

        return metadata.distribution(name).version or "?"
    except Exception:  # not installed, or metadata that cannot be read: nothing to name
        return None


def _verdict_text(record):
    return "%s %s%s" % (site_name(record), record["verdict"], " (%s)" % record["reason"] if record["reason"] else "")


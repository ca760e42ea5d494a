"""status(): one record per known call site, computed from live objects; the status outcome."""
import importlib.util
import json
import os
import sys

from . import engine, install
from . import sites as _sites
from .releases import loaded_release, owning_distributions
from .verify import child, fresh, script_dir

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
    """A failed site's reason without the fix of a known cause (:func:`import_fix` names it, for the interpreter)."""
    return (record.get("reason") or "").split(KNOWN_FIX, 1)[0]


def import_fix(record, python):
    """`` Fix: ...``, the one step after a site's import failure: the install of a known cause's fix into
    ``python`` (the interpreter asked about; a bare ``pip`` may be another environment's), else the import to make
    succeed, which shows the whole error (the reason holds its last line only)."""
    import shlex

    known = (record.get("reason") or "").partition(KNOWN_FIX)[2]
    if known:
        return " Fix: `%s`." % ("%s -m %s" % (shlex.quote(python), known) if python else known)
    return " Fix: make `%s -c %s` succeed (it shows the whole error)." % (
        shlex.quote(python or "python"), shlex.quote("import %s" % record["module"]))


def _exception_line(exc):
    """``Name: message`` on one line, the message quoted short when it holds a line break or non-ASCII text."""
    from .config import QUOTE_LIMIT, quote_value

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


def _cell(value):
    """A table cell as printable ASCII on one line: a value read from the environment (a release string, an
    exception message, a path) may hold a line break or a character an ASCII stdout cannot encode."""
    text = str(value)
    if text.isascii() and text.isprintable():
        return text
    return ascii(text)[1:-1]


#: The widest a table's distribution and release cells are shown (``--json`` holds them complete).
DISTRIBUTION_CELL, RELEASE_CELL = 24, 16
#: The most room site names give up for verdicts with their reasons on the row (longer: the reasons wrap).
VERDICT_ROOM = 36


def render_table(records, show_all=False):
    """The site table, every line at most :data:`textfit.WIDTH` columns: a long distribution cell is cut at its
    end, long release and site cells in the middle; a verdict's reason stays on its row when every one fits
    :data:`VERDICT_ROOM`, else wraps below it (``--json`` holds every value complete)."""
    from .textfit import WIDTH, elide, hanging

    rows = [r for r in records if show_all or r["verdict"] not in (engine.NOT_INSTALLED, engine.ABSENT)]
    if not rows:
        return "No known call site is installed in this environment (use --all to list every known site)."
    header = ("distribution", "release", "site", "verdict")
    cells = [(_cell(r["distribution"] or "-"), _cell(r["release"] or "-"), _cell("%s:%s" % (r["module"], r["method"])),
              _cell(r["verdict"]), _cell(r["reason"]) if r["reason"] else "") for r in rows]
    caps = [DISTRIBUTION_CELL, RELEASE_CELL]
    widths = [max([len(header[i])] + [min(len(c[i]), caps[i]) for c in cells]) for i in range(2)]
    # room for every verdict with its reason when they all fit VERDICT_ROOM; else for the verdict words only
    # (the reasons wrap below them), so that site names keep what room there is
    full = max(len(c[3]) + (len(c[4]) + 3 if c[4] else 0) for c in cells)
    verdict_room = full if full <= VERDICT_ROOM else max(len(c[3]) for c in cells)
    verdict_room = max(verdict_room, len(header[3]))  # the heading's own word: a verdict shorter than it ("failed")
    site_cap = max(len(header[2]), WIDTH - verdict_room - sum(widths) - 6)
    widths.append(max([len(header[2])] + [min(len(c[2]), site_cap) for c in cells]))

    def columns(row):
        # the distribution cell keeps its start (the first owner named), the others both ends
        return "  ".join(elide(cell, widths[j], keep_end=j > 0).ljust(widths[j]) for j, cell in enumerate(row[:3])) \
            + "  "

    lines = [columns(header) + header[3], columns(tuple("-" * w for w in widths)) + "-" * 7]
    for row in cells:
        lines.extend(line.rstrip() for line in hanging(columns(row), row[3] + (" (%s)" % row[4] if row[4] else ""),
                                                        WIDTH))
    return "\n".join(lines)


def render_json(records):
    return json.dumps(records, indent=2, sort_keys=True)


# --------------------------------------------------------------------------- the outcome of `status`
PROTECTED, NOTHING_TO_PROTECT, UNPROTECTED, NOT_VERIFIED = ("protected", "nothing to protect", "unprotected",
                                                            "could not verify")
#: Every outcome of ``status`` and ``check`` with its exit code.
EXIT_CODES = {PROTECTED: 0, NOTHING_TO_PROTECT: 0, UNPROTECTED: 1, NOT_VERIFIED: 3}
#: The version of the JSON object ``status --json`` and ``check --json`` print (docs/cli.md).
JSON_SCHEMA = 1


def installed(records):
    """Records of sites installed in the release at hand."""
    return [r for r in records if r["verdict"] not in (engine.NOT_INSTALLED, engine.ABSENT)]


def _site(record):
    return "%s:%s" % (record["module"], record["method"])


def startup_gap(payload):
    """Why a training script started in the fresh interpreter runs installed sites unpatched although the
    shim would patch them once imported (its start-up hook does not run there), or None."""
    active, why = fresh.startup_hook(payload["facts"])
    if active is None:  # not asked
        return None
    # switched off, the sites' own records say so ("disabled"): that is the reason to give; a site whose module
    # cannot be imported runs nothing at all (status_outcome's rule 6 names it)
    needing = [r for r in installed(payload["records"])
               if r["verdict"] not in (engine.FIXED_UPSTREAM, engine.DISABLED) and not import_failed(r)]
    if active or not needing:
        return None
    return ("the start-up hook does not run in %s (%s): a training script that does not import tpu_closure_fix "
            "runs %d affected site(s) unpatched (%s). Fix: %s." % (payload["facts"].get("executable"), why,
                                                                   len(needing), _some(_site(r) for r in needing),
                                                                   install.startup_fix(payload["facts"])))


def unlisted_fix(facts):
    """The step after an interpreter that started but whose copy of the shim failed to list the sites: its own
    copy (another release) or the one lent to it. Installing this release there gives it one that lists them."""
    command = install.install_command(facts.get("executable"))
    if facts.get("shim_origin"):  # its own copy, installed: replaced, files and all
        command = command.replace(" -m pip install ", " -m pip install --force-reinstall ", 1)
    return "install this release of tpu-closure-fix into it: `%s`" % command


def _some(names, shown=3):
    names = list(names)
    return ", ".join(names[:shown]) + (" and %d more" % (len(names) - shown) if len(names) > shown else "")


def site_fix(record):
    """The one step that puts the fix of an unprotected site in place (:func:`tpu_closure_fix.install.site_fix`,
    a pin naming the newest row of the site's table)."""
    rows = _sites.rows_for(record["module"], record["method"]) if (record["module"], record["method"]) in \
        set(_sites.site_keys()) else []
    return install.site_fix(record, rows[-1] if rows else None)


def uncovered_reason(payload):
    """Why no verdict can be given for an installed framework (:mod:`.verify.scan`): an XLA optimizer step
    that no row covers, named by file and line, or the search failing; None when neither."""
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
                              " (and %d more)" % (len(found) - 1) if len(found) > 1 else "", pin))


def status_outcome(payload, error=None):
    """``(outcome, exit code, reason)`` of ``status`` from the fresh interpreter's payload
    (:func:`tpu_closure_fix.verify.fresh.run_status`). The first rule that applies decides."""
    def outcome(name, reason):
        return name, EXIT_CODES[name], reason

    # 1. The fresh interpreter gave no records: nothing is known about it.
    if payload is None or "records" not in payload:
        facts = (payload or {}).get("facts") or {}
        if error or not facts.get("error"):  # the error names its fix (verify.fresh.run_status)
            return outcome(NOT_VERIFIED, "COULD NOT VERIFY: %s." % (error or "no report"))
        return outcome(NOT_VERIFIED, "COULD NOT VERIFY: %s could not list its sites (%s). Fix: %s." % (
            facts.get("executable"), facts["error"], unlisted_fix(facts)))
    python = payload["facts"].get("executable")
    # 2. A framework in the training script's directory is what a script run from there imports: the child never
    #    searched that directory, so no verdict is about it.
    beside = payload.get("beside_script") or {}
    if beside.get("error"):  # the scan of that directory failed: what a script run from there imports is unknown
        return outcome(NOT_VERIFIED, "COULD NOT VERIFY: %s." % beside["error"])
    if beside.get("found"):
        return outcome(NOT_VERIFIED, "COULD NOT VERIFY: %s." % script_dir.reason(beside["found"],
                                                                                beside["directory"], python))
    sites = installed(payload["records"])
    # 3. No site the shim covers is installed and no uncovered XLA step found: said as such, never "protected".
    if not sites and not uncovered_reason(payload):
        return outcome(NOTHING_TO_PROTECT, "NOTHING TO PROTECT: no framework or torch_xla release the shim covers "
                                           "is installed for %s." % python)
    # 4. The start-up hook does not run there: a script that does not import the shim runs the sites
    #    that need it unpatched, whatever the shim would do once imported.
    gap = startup_gap(payload)
    if gap:
        return outcome(UNPROTECTED, "UNPROTECTED: " + gap)
    # 5. An installed site runs the buggy code (a module that cannot be imported runs no code at all: rule 6).
    bad = [r for r in unprotected(sites) if not import_failed(r)]
    if bad:
        return outcome(UNPROTECTED, "UNPROTECTED: %d installed affected site(s) run the buggy code: %s. Fix: %s." % (
            len(bad), "; ".join("%s (%s%s)" % (_site(r), r["verdict"], ": " + r["reason"] if r["reason"] else "")
                                for r in bad), site_fix(bad[0])))
    # 6. An installed framework holds an XLA optimizer step no row covers (or the search failed), or a site's
    #    module cannot be imported: no verdict.
    unknown = uncovered_reason(payload)
    if unknown:
        return outcome(NOT_VERIFIED, "COULD NOT VERIFY: " + unknown)
    broken = [r for r in sites if import_failed(r)]
    if broken:
        return outcome(NOT_VERIFIED, "COULD NOT VERIFY: %s cannot be imported (%s)%s.%s" % (
            _site(broken[0]), import_error(broken[0]), " (and %d more)" % (len(broken) - 1) if len(broken) > 1 else "",
            import_fix(broken[0], python)))
    # 7. Every installed site is patched, guarded or fixed upstream.
    active, _ = fresh.startup_hook(payload["facts"])
    hook = {True: "start-up hook active", False: "start-up hook inactive, no site needs it",
            None: "start-up hook not asked"}[active]
    return outcome(PROTECTED, "PROTECTED: every installed affected site is patched, guarded or fixed upstream "
                              "(%d site(s)); %s." % (len(sites), hook))


def status_json(payload, error=None):
    """The one object ``status --json`` prints (schema :data:`JSON_SCHEMA`, see docs/cli.md)."""
    name, code, reason = status_outcome(payload, error)
    facts = (payload or {}).get("facts") or {}
    active, why = fresh.startup_hook(facts) if facts else (None, "no report from the interpreter, see below")
    return {"schema": JSON_SCHEMA, "command": "status", "outcome": name, "exit_code": code, "reason": reason,
            "python": {"executable": facts.get("executable"), "version": facts.get("version"),
                       "flags": facts.get("flags")},
            "startup_hook": {"active": active, "reason": why},
            "shim_version": (payload or {}).get("shim_version"), "shim_path": (payload or {}).get("shim_path"),
            "sync_check": (payload or {}).get("sync_check"), "sites": (payload or {}).get("records") or [],
            "uncovered": (payload or {}).get("uncovered") or [],
            "beside_script": ((payload or {}).get("beside_script") or {}).get("found") or [],
            "compiled_only": (payload or {}).get("compiled_only") or []}


def render_status(result, records=None, show_all=False):
    """The text ``status`` prints for ``result`` (:func:`status_json`): the header, the site table when the
    interpreter gave ``records``, the uncovered steps and compiled-only distributions, the outcome, the
    zero-code check line; every line at most :data:`textfit.WIDTH` columns."""
    from .textfit import fit

    lines = [render_header(result)]
    if records is not None:
        lines.append(render_table(records, show_all=show_all))
        lines.extend(render_uncovered(result["uncovered"]) + render_compiled_only(result["compiled_only"]))
    lines.extend(["", _cell(result["reason"])])
    if result["sync_check"]:
        lines.append(_cell(result["sync_check"]))
    return fit("\n".join(lines))


def render_header(result):
    """The first two lines of ``status`` and ``check``: which interpreter was asked, and its start-up hook (a
    line each, so that a long interpreter path and a long reason each keep their own line)."""
    python, hook = result["python"], result["startup_hook"]
    state = "unknown" if hook["active"] is None else "active" if hook["active"] else "INACTIVE"
    return "%s\n%s" % (_cell("python: %s (%s)" % (python["executable"] or "?", python["version"] or "?")),
                       _cell("start-up hook: %s%s" % (state, " (%s)" % hook["reason"] if hook["reason"] else "")))


# --------------------------------------------------------------------------- in the fresh interpreter
#: Why a site the shim would patch runs its original code in an interpreter whose start-up hook does not run.
HOOK_INACTIVE = "start-up hook inactive"


def child_main(facts):
    """In the fresh interpreter (:mod:`.verify.fresh`), after the facts and the held-back import of the shim:
    activate it as that interpreter's start-up hook would (or not), list every site, print the payload."""
    if not hook_leaves_shim_off(facts):
        from . import activation

        activation.activate()  # what the start-up module's import of tpu_closure_fix does at a watched import
    child.emit(payload(facts))


def hook_leaves_shim_off(facts):
    """True when a script started in the interpreter of ``facts`` never gets the shim although it is not switched
    off (:func:`.verify.fresh.startup_hook` says inactive): no site is patched there. Switched off, the sites
    say ``disabled`` with the switch's value, as everywhere."""
    from .config import parse_switch

    active, _ = fresh.startup_hook(facts)
    return active is False and parse_switch(facts.get("switch"))[0]


def payload(facts):
    """The facts with every site's record, as this process (importing every installed site module) sees it."""
    import tpu_closure_fix
    from .__about__ import __version__
    from .verify import scan

    failures = import_installed_sites()
    off = hook_leaves_shim_off(facts)
    records = status(import_errors=failures, unpatched_reason=HOOK_INACTIVE if off else None)
    try:
        uncovered, scan_error = scan.uncovered_steps(), None
    except Exception as exc:  # the search itself failed: then nothing says the release is covered
        uncovered, scan_error = [], "%s: %s" % (type(exc).__name__, exc)
    return {"facts": facts, "records": records, "shim_version": __version__,
            "shim_path": os.path.dirname(os.path.abspath(tpu_closure_fix.__file__)), "sync_check": _sync_check_line(off),
            "uncovered": uncovered, "scan_error": scan_error, "compiled_only": compiled_only(records),
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


def _sync_check_line(hook_inactive=False):
    """Whether the zero-code SyncCheck is armed; its module is only imported when its variable is set.
    ``hook_inactive``: the interpreter asked about never activates the shim (:func:`hook_leaves_shim_off`), and
    only an activation arms the check."""
    from .config import SYNC_CHECK_VAR

    if not os.environ.get(SYNC_CHECK_VAR):
        return "zero-code sync check: off (%s unset)" % SYNC_CHECK_VAR
    if hook_inactive:
        return "zero-code sync check: not armed (start-up hook inactive: %s is read as the shim activates)" \
            % SYNC_CHECK_VAR
    from .synccheck import hook

    return _one_line(hook.status_line())


def _one_line(text):
    """``text`` on one line: a line break and the indentation after it read as one space, as none after an
    opening parenthesis (a bad value's warning, which the sync check line quotes, starts on its second line)."""
    pieces = text.split("\n")
    out = pieces[0]
    for piece in pieces[1:]:
        out += piece.strip() if out.endswith("(") else " " + piece.strip()
    return out


# --------------------------------------------------------------------------- compiled-only distributions
def compiled_only(records):
    """One dict per installed distribution that an integration lists in ``COMPILED_ONLY`` (code no row can
    cover: the integration's guard is its only net): ``distribution``, ``release``, ``call``, ``integration``
    (whose guard it is), ``covered_by`` (that name when its guard covers the call now, else None) and
    ``guard`` (its sites' verdicts, as ``records`` report them). Found by metadata alone: such a
    distribution is never imported."""
    from . import integrations as _integrations

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
    return "%s %s%s" % (_site(record), record["verdict"], " (%s)" % record["reason"] if record["reason"] else "")


def render_compiled_only(found):
    """One line per installed compiled-only distribution: the guard covers its call, or nothing does."""
    lines = []
    for item in found or []:
        head = "%s %s (compiled only, never patched or read; %s)" % (item["distribution"], item["release"],
                                                                     item["call"])
        if item["covered_by"]:
            tail = "covered by the %s guard (%s)" % (item["covered_by"], item["guard"])
        else:
            tail = "NOTHING covers it: the %s guard is not in place (%s)" % (item["integration"], item["guard"])
        lines.append(_cell("%s: %s." % (head, tail)))
    return lines


def render_uncovered(found):
    """Lines naming the XLA optimizer steps no row covers (nothing when there are none)."""
    return [_cell("XLA optimizer step no row covers: %s:%d (%s:%s)" % (u["file"], u["line"], u["module"],
                                                                      u["function"])) for u in found or []]

"""The patch engine: apply, report and remove the fixes of the call-site table.

It is framework-neutral: what it patches comes from :mod:`tpu_closure_fix.sites`
(every integration's rows); it names no framework.

Mechanism, in the style of ``wrapt.importer`` / ``wrapt.patches``:

* ``enable()`` registers a wrapt post-import hook for every module named in
  the table, so the order of imports never matters: a module imported later is
  patched the moment its body has run; one imported already is patched now.
* A site is patched only after both guards pass (:func:`examine`): the release
  of the loaded package is inside a row's range (or, for a release no row
  knows, the code is identical to a known release's: :mod:`tpu_closure_fix.identity`),
  and the code has the row's expected shape. Then the class attribute is replaced by a
  ``wrapt.FunctionWrapper`` around the original function (a module attribute by
  a plain function calling the same fix: :func:`wrappers.module_function_wrapper`), marked with
  :data:`MARKER` so a second ``enable()`` never stacks another layer.
* ``disable()`` puts the exact original function objects back. Wrappers that
  cannot be removed (someone wrapped on top of ours) become pass-throughs: every
  wrapper consults one shared switch.
* Nothing here may break the program: every hook and patch is guarded; a failure
  is logged, warned about once (:class:`TPUClosureFixWarning`) and leaves
  the original code in place.

:func:`examine` is also what ``status()`` reports, so the report is computed
from live objects -- the attribute the class actually resolves -- never from
what was intended or from a cache that could go stale. :func:`reconcile` catches
modules that were imported without the import hook firing (another import hook
ahead of wrapt's, a failed registration) and patches them late, with a warning.
"""
import inspect
import logging
import os
import sys
import threading
import types
import warnings
from collections import namedtuple

from . import integrations as _integrations
from . import settings
from . import sites as _sites
from .config import DISABLE_VAR, TPUClosureFixWarning
from .fixes import FixUnavailable
from .releases import in_range, loaded_release

log = logging.getLogger("tpu_closure_fix")
log.addHandler(logging.NullHandler())

#: Attribute set on every wrapper this package installs (wrapt keeps ``_self_*`` on the proxy).
MARKER = "_self_tpu_closure_fix_variant"

# Verdicts.
PATCHED = "patched"
FIXED_UPSTREAM = "fixed upstream"
NOT_INSTALLED = "not installed"
NOT_IMPORTED = "not imported yet"
ABSENT = "not in this release"
DISABLED = "disabled"
# the site's fix is not in place (skipped or failed), but its buggy call goes through a patched guard
GUARDED = "guarded"
SKIPPED = "skipped"
FAILED = "failed"
PATCHABLE = "patchable"  # internal: guards passed, not patched yet
#: Reports only (never :func:`examine`'s): a site the shim would patch, in an interpreter whose start-up hook
#: does not run, so that a script started there runs its original code (``tpu_closure_fix.report``).
UNPATCHED = "unpatched"

#: Verdicts meaning "the buggy code runs here".
UNPROTECTED = frozenset((DISABLED, SKIPPED, FAILED, PATCHABLE, UNPATCHED))

Finding = namedtuple("Finding", "verdict reason site release target")


class Switch(object):
    """Shared on/off flag read by every installed wrapper on every call."""

    __slots__ = ("on",)

    def __init__(self):
        self.on = False


class _State(object):
    def __init__(self):
        self.lock = threading.RLock()
        self.switch = Switch()
        self.enabled = False
        self.disabled_reason = "not enabled"
        self.switched_off = {}  # integration name -> why its sites are left alone (TPU_CLOSURE_FIX_DISABLE)
        self.pending = set()  # modules with a registered wrapt hook that has not fired
        self.patches = {}  # key -> (owner, attr, original, wrapper)
        self.notes = {}  # key -> why a release no row names was patched (code identity)
        self.failures = {}  # key -> reason
        self.processed = {}  # module name -> id() of the module object the engine last patched
        self.warned = set()


_state = _State()


def _fresh_in_child(lock):
    """``lock`` itself if this thread holds it (it will release it), else a new lock of the same kind.

    After ``fork()`` only the forking thread exists in the child: a lock another thread held at that
    moment (a thread inside ``enable()``) stays held forever, and the child's first ``status()``,
    ``enable()`` or patched import would wait for it.  ``_is_owned`` (RLock's own test, C and Python
    versions) tells whether the forking thread is the holder.
    """
    is_owned = getattr(lock, "_is_owned", None)
    if is_owned is not None and is_owned():
        return lock
    return threading.RLock()


def _after_fork_in_child():
    """Re-create, in a forked child, the locks this package takes: the engine's, and wrapt's post-import
    hook lock (the engine holds it while it registers or re-arms hooks).  Never raises."""
    try:
        _state.lock = _fresh_in_child(_state.lock)
        importer = sys.modules.get("wrapt.importer")
        held = getattr(importer, "_post_import_hooks_lock", None)
        if held is not None:
            importer._post_import_hooks_lock = _fresh_in_child(held)
    except Exception:  # pragma: no cover - defensive: a fork must never fail because of the shim
        pass


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def is_enabled():
    return _state.enabled


def is_ours(obj):
    try:
        return getattr(obj, MARKER, None) is not None
    except Exception:
        return False


def _warn_once(key, message):
    if key in _state.warned:
        return
    _state.warned.add(key)
    log.warning("%s", message)
    warnings.warn(message, TPUClosureFixWarning, stacklevel=2)


def _describe_ranges(package):
    return ", ".join(sorted({s.releases for s in _sites.CALL_SITES if s.package == package}))


def split_qualname(qualname):
    """("Class", "method") for a method, (None, "function") for a module-level function."""
    if "." in qualname:
        return tuple(qualname.rsplit(".", 1))
    return None, qualname


def _owner(module, qualname):
    """The object whose attribute the site is (class or module), or a reason string if missing."""
    class_name, _ = split_qualname(qualname)
    if class_name is None:
        return module
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        return "%s has no class %s" % (module.__name__, class_name)
    return cls


def _defined(owner, attr):
    """The attribute as the owner itself defines it (no descriptor protocol, no inheritance)."""
    try:
        return vars(owner).get(attr)
    except TypeError:
        return None


def examine(key, module=None):
    """Decide what a site is: a Finding(verdict, reason, site, release, target).

    ``target`` is (owner, attr, original_function) when the verdict is PATCHABLE.
    Every verdict is read from the live objects: PATCHED means the attribute the
    owner resolves is this package's wrapper. The rules are :func:`_decide`'s, in
    order, then the last one here.
    """
    finding = _decide(key, module)
    # Rule 14 (last). A site whose own (buggy) code runs -- skipped, its fix failed, or disabled (only its
    # integration can be: with the shim off no guard is patched) -- is GUARDED when its call of
    # xm.optimizer_step resolves, now, to the patched torch_xla guard.
    if finding.verdict in (SKIPPED, FAILED, DISABLED):
        guard = _covering_guard(key, module)
        if guard:
            reason = "its fix failed: %s" % finding.reason if finding.verdict == FAILED else finding.reason
            return finding._replace(verdict=GUARDED, reason="%s; its call goes through the patched %s guard"
                                    % (reason, guard))
    return finding


def _decide(key, module=None):
    """The site's own verdict: the first rule that applies, read top to bottom (docs/ARCHITECTURE.md
    lists the same rules). Rule 14, the guard, is :func:`examine`'s."""
    module_name, qualname = key
    rows = _sites.rows_for(module_name, qualname)
    # 1. No row names the site: nothing is known about its code.
    if not rows:
        return Finding(SKIPPED, "no row for %s:%s in the call-site table" % key, None, None, None)
    # 2. Its module is not imported: nothing runs yet.
    module = module if module is not None else sys.modules.get(module_name)
    if module is None:
        return Finding(NOT_IMPORTED, "", None, None, None)
    # 3. The loaded package's release cannot be read: never guessed.
    package = rows[0].package
    release = loaded_release(package)
    if release is None:
        return Finding(SKIPPED, "cannot read the release of %s (no __version__)" % package.split(".")[0],
                       None, None, None)
    owner, attr = _owner(module, qualname), split_qualname(qualname)[1]
    site, note = next((row for row in rows if in_range(release, row.releases)), None), ""
    if site is None and not _package_knows(package, release):
        # 4. A release no row of the package names, whose class inherits the method from a class that is a
        #    site of the table (a class kept for an old import path): judged as that site, by its own rules
        #    (patched, fixed upstream by code identity, or left untouched with its reason).
        base = _inherited_site(owner, attr)
        if base is not None:
            return _judged_as_base(rows[-1], release, owner, base, attr, note="%s not in the table" % release)
        # 5. A release no row names whose code is identical (identity.py: fingerprint and decorators) to
        #    a verified release of a row: that row applies, fix or upstream fix alike.
        if not isinstance(owner, str):
            site, note = _same_code_row(rows, owner, attr, release)
    # 6. Still no row: not in this release (no such class or method, a release the integration found not
    #    affected, or another site of the package knows the release and this code has no buggy call), else
    #    unknown release: not verified, left untouched.
    if site is None:
        return _unknown_release(rows, package, release, None if isinstance(owner, str) else owner, attr)
    # 7. The row's class is missing from the module.
    if isinstance(owner, str):
        return Finding(SKIPPED, owner, site, release, None)
    # 8. An inheriting row: judged by the method the class resolves, with its base row's rules.
    if site.inherits:
        return _examine_inherited(site, release, owner, attr)
    current = _defined(owner, attr)
    # 9. The class does not define the method itself.
    if current is None:
        return Finding(SKIPPED, "%s defines no %s" % (getattr(owner, "__name__", owner), attr), site, release, None)
    # 10. Our wrapper is the attribute: PATCHED, or DISABLED (a pass-through) when switched off.
    if is_ours(current):
        if not _state.switch.on:
            return _passing_through(site, release)
        return Finding(PATCHED, _with_caveat(site, _state.notes.get(key, note)), site, release, None)
    shape = site.shape.check(current, owner)
    # 11. A row of upstream-fixed code: FIXED UPSTREAM only when the code has the fix's shape (the helpers
    #     it reaches included: the closure runs before the reduction there).
    if site.fix is None:
        if shape.ok:
            return Finding(FIXED_UPSTREAM, note, site, release, None)
        return Finding(SKIPPED, "expected the upstream fix, but %s" % shape.reason, site, release, None)
    # 12. Code that is not the row's buggy shape is never patched.
    if not shape.ok:
        return Finding(SKIPPED, "unexpected code shape: %s; left untouched" % shape.reason, site, release, None)
    # 13. The fix could not be prepared (FAILED); the shim is off (TPU_CLOSURE_FIX=0, disable()) or its
    #     integration is (TPU_CLOSURE_FIX_DISABLE): DISABLED; else the site is PATCHABLE.
    if key in _state.failures:
        return Finding(FAILED, _state.failures[key], site, release, None)
    if not _state.enabled:
        return Finding(DISABLED, _state.disabled_reason, site, release, None)
    if site.integration in _state.switched_off:
        return Finding(DISABLED, _state.switched_off[site.integration], site, release, None)
    return Finding(PATCHABLE, note, site, release, (owner, attr, current))


def _with_caveat(site, reason):
    """A patched site's reason, with what its fix cannot cover where it says (``Fix.caveat``: a hook the user's
    subclass may override instead of calling)."""
    caveat = getattr(site.fix, "caveat", "")
    return "; ".join(text for text in (reason, caveat) if text)


def _passing_through(site, release):
    """A wrapper of ours that disable() could not remove (another wrapper on top of it, or a class
    object replaced by a reload): switched off, it passes every call to the original."""
    return Finding(DISABLED, "%s; a wrapper it could not remove passes calls through to the original"
                   % _state.disabled_reason, site, release, None)


def _package_knows(package, release):
    """True when some row of ``package`` names ``release``: then a site none of whose rows does is not in
    this release (or unknown for this site), never "the same code as" another release."""
    return any(in_range(release, row.releases) for row in _sites.CALL_SITES if row.package == package)


def _resolved(cls, attr):
    """(defining class, attribute) of what ``cls.attr`` resolves to through the MRO, or None."""
    owner = next((klass for klass in getattr(cls, "__mro__", ()) if attr in vars(klass)), None)
    return (owner, vars(owner)[attr]) if owner is not None else None


def _same_code_row(rows, owner, attr, release):
    """(row, note) for a release no row names whose code is identical to a row's verified release.

    Rows with recorded fingerprints take part: a fix's rows (the same buggy code, patched with
    that fix) and upstream-fixed rows (the same fixed code). Identical means an equal fingerprint
    and every decorator bound as in the known release (:func:`identity.decorators_known`).
    Returns (None, "") when nothing is identical, or when the code has no source to compare.
    """
    candidates = [row for row in rows if row.fingerprints and not row.inherits]
    current = _defined(owner, attr)
    if is_ours(current):  # judged by the code we wrapped: the object the class held before the patch
        current = getattr(current, "__wrapped__", None)
    if not candidates or current is None:
        return None, ""
    from . import identity

    fingerprint = identity.fingerprint(current)
    if fingerprint is None or not identity.decorators_known(current):
        return None, ""
    for row in reversed(candidates):
        for known_release, known in row.fingerprints:
            if known == fingerprint:
                return row, "%s not in the table; code identical to %s" % (release, known_release)
    return None, ""


def _unknown_release(rows, package, release, owner, attr):
    if not _exists(owner, attr):  # no such class or method here: nothing of this site can run
        return Finding(ABSENT, "", None, release, None)
    # Code of this site its integration read and found handing no closure to torch_xla in this release range
    # (before the bug, or after the step moved elsewhere), as long as it holds none of the buggy call's names.
    entry = _not_affected(rows[0], release, owner, attr)
    if entry is not None:
        return Finding(ABSENT, "%s %s: %s" % (package.split(".")[0], release, entry.why), None, release, None)
    if _package_knows(package, release):
        if not _has_buggy_shape(owner, attr, rows):
            return Finding(ABSENT, "", None, release, None)
        # Another site of this package knows the release, but this code still holds the buggy call:
        # never guessed at, and never hidden as "not in this release".
        return Finding(SKIPPED, "unknown release %s for this site (known: %s), whose code still has the "
                                "buggy call; left untouched"
                       % (release, ", ".join(row.releases for row in rows)), None, release, None)
    return Finding(SKIPPED, "unknown release %s of %s: not verified (known: %s; its code is not identical to "
                            "a verified release); left untouched"
                   % (release, package, _describe_ranges(package)), None, release, None)


def _not_affected(row, release, owner, attr):
    """The site's NOT_AFFECTED entry (sites.py) holding ``release``, whose forbidden names its code lacks, or None."""
    from .shape import code_names

    resolved = _resolved(owner, attr) if isinstance(owner, type) else None
    code = getattr(inspect.unwrap(resolved[1]), "__code__", None) if resolved else None
    if code is None:
        return None
    for entry in _sites.not_affected_for(row.module, row.qualname):
        if in_range(release, entry.releases) and not set(entry.forbids) & code_names(code):
            return entry
    return None


def _exists(owner, attr):
    """True when ``owner`` (a class, through its MRO, or a module) has ``attr``; False for no owner."""
    if owner is None:
        return False
    if isinstance(owner, type):
        return _resolved(owner, attr) is not None
    return _defined(owner, attr) is not None


def _has_buggy_shape(owner, attr, rows):
    function = _defined(owner, attr) if owner is not None else None
    if function is None or is_ours(function):
        return False
    return any(row.fix is not None and row.shape.check(function).ok for row in rows)


def _inherited_site(owner, attr):
    """The class ``owner`` inherits ``attr`` from, when that class's method is a site of the table; else None."""
    if not isinstance(owner, type):
        return None
    base = next((klass for klass in owner.__mro__ if attr in vars(klass)), None)
    if base is None or base is owner:
        return None
    return base if _sites.rows_for(base.__module__, "%s.%s" % (base.__name__, attr)) else None


def _judged_as_base(site, release, cls, base, attr, note):
    """Class ``cls``'s site judged as the method it inherits from ``base``, a site of the table (the helpers
    that method reaches read on ``cls``: a subclass may override them)."""
    base_key = (base.__module__, "%s.%s" % (base.__name__, attr))
    reason = "via %s.%s (%s)" % (base_key[0], base_key[1], note)
    function = vars(base)[attr]
    if is_ours(function):
        if not _state.switch.on:
            return _passing_through(site, release)
        return Finding(PATCHED, reason, site, release, None)
    judged = _decide(base_key)
    if judged.verdict == PATCHABLE:  # patched through either key: the same object
        return Finding(PATCHABLE, reason, judged.site, release, (base, attr, function))
    if judged.verdict == FIXED_UPSTREAM and judged.site is not None:
        shape = judged.site.shape.check(function, cls)
        if not shape.ok:
            return Finding(SKIPPED, "%s: expected the upstream fix, but %s" % (reason, shape.reason), site, release,
                           None)
    # the base's row: the code that runs is the base's (what a verification of this site must drive)
    return Finding(judged.verdict, reason + (": " + judged.reason if judged.reason else ""), judged.site or site,
                   release, None)


def _examine_inherited(site, release, cls, attr):
    """An inheriting subclass: judged by the method ``cls`` actually resolves.

    PATCHED when that is this package's wrapper. When it is the base's original
    code -- the base class not patched yet, or a class object from before an
    ``importlib.reload`` of the base module that the subclass still inherits
    from -- it is PATCHABLE with the base row's guards and fix, so the engine
    patches exactly the class the subclass resolves.
    """
    owner = next((klass for klass in cls.__mro__ if attr in vars(klass)), None)
    if owner is cls:
        return Finding(SKIPPED, "%s overrides %s (expected to inherit %s)" % (cls.__name__, attr, site.inherits),
                       site, release, None)
    if owner is None:
        return Finding(SKIPPED, "%s has no %s" % (cls.__name__, attr), site, release, None)
    base_qualname = "%s.%s" % (owner.__name__, attr)
    if base_qualname != site.inherits:
        return Finding(SKIPPED, "inherits %s, expected %s" % (base_qualname, site.inherits), site, release, None)
    reason = "via %s.%s" % (owner.__module__, base_qualname)
    function = vars(owner)[attr]
    if is_ours(function):
        if not _state.switch.on:
            return _passing_through(site, release)
        return Finding(PATCHED, reason, site, release, None)
    base = _decide((owner.__module__, base_qualname))
    if base.verdict in (PATCHABLE, PATCHED) and base.site is not None and base.site.shape.check(function).ok:
        return Finding(PATCHABLE, reason, base.site, release, (owner, attr, function))
    if base.verdict in (PATCHABLE, PATCHED):
        base = base._replace(verdict=SKIPPED, reason="the inherited code is not the base row's shape")
    if base.reason:
        reason += ": " + base.reason
    return Finding(base.verdict, reason, site, release, None)


def _covering_guard(key, module):
    """Name of an integration whose patched guard the site's buggy call reaches, or None.

    An integration with a ``covers(function, guards)`` predicate (the torch_xla guard) protects a
    skipped or failed site when every one of its own sites is PATCHED (read from the live objects)
    and the site's call resolves, now, to those patched objects (:mod:`tpu_closure_fix.calls`).
    """
    function = _site_function(key, module)
    if function is None or is_ours(function):
        return None
    for integration in _integrations.load():
        covers = getattr(integration, "covers", None)
        if covers is None or any(row.module == key[0] for row in integration.CALL_SITES):
            continue
        guards = _patched_guards(integration)
        if not guards:
            continue
        try:
            if covers(function, guards):
                return integration.NAME
        except Exception:
            continue
    return None


def _site_function(key, module):
    """The function a site's owner resolves now (its own or inherited), or None."""
    module_name, qualname = key
    module = module if module is not None else sys.modules.get(module_name)
    if module is None:
        return None
    owner = _owner(module, qualname)
    if isinstance(owner, str):
        return None
    class_name, attr = split_qualname(qualname)
    function = _defined(owner, attr)
    if function is None and class_name is not None:
        function = next((vars(k)[attr] for k in owner.__mro__ if attr in vars(k)), None)
    return function


def _patched_guards(integration):
    """{attribute name: the live patched object} of every site of ``integration``; {} unless all are PATCHED."""
    guards = {}
    for row in integration.CALL_SITES:
        key = _sites.site_key(row)
        if _decide(key).verdict != PATCHED:
            return {}
        module = sys.modules.get(key[0])
        owner = _owner(module, key[1]) if module is not None else None
        if owner is None or isinstance(owner, str):
            return {}
        attr = split_qualname(key[1])[1]
        guards[attr] = _defined(owner, attr)
    return guards


def _patch_site(key, module):
    finding = _decide(key, module)
    if finding.verdict == SKIPPED and finding.site is not None and finding.site.inherits \
            and not _base_patched(finding.site):
        # An inheriting subclass (bf16) of a base site that is itself skipped/failed/absent: the base's
        # own warning already names the cause; status() still lists this row (one warning per cause).
        return finding
    if finding.verdict == SKIPPED and finding.site is not None and finding.site.integration in _state.switched_off:
        log.debug("tpu-closure-fix: %s:%s not patched (%s): %s", key[0], key[1],
                  _state.switched_off[finding.site.integration], finding.reason)  # switched off: no warning
        return finding
    if finding.verdict == SKIPPED:
        _warn_once(key, "tpu-closure-fix: %s:%s not patched: %s" % (key[0], key[1], finding.reason))
        return finding
    if finding.verdict == DISABLED:
        log.debug("tpu-closure-fix: %s:%s left alone: %s", key[0], key[1], finding.reason)
    if finding.verdict != PATCHABLE:
        return finding
    from .wrappers import FunctionWrapper, module_function_wrapper

    owner, attr, original = finding.target
    site = finding.site
    try:
        wrapper_function = site.fix.prepare(site, original, _state.switch)
    except FixUnavailable as exc:
        _state.failures[key] = "fix unavailable: %s" % exc
        _warn_once(key, "tpu-closure-fix: %s:%s not patched: %s" % (key[0], key[1], exc))
        return _decide(key, module)
    if isinstance(owner, types.ModuleType):
        wrapper = module_function_wrapper(original, wrapper_function)  # never bound: a plain function is cheaper
    else:
        wrapper = FunctionWrapper(original, wrapper_function)  # wrapt's, pickling by reference like the original
    setattr(wrapper, MARKER, site.variant)
    setattr(owner, attr, wrapper)
    _state.patches[key] = (owner, attr, original, wrapper)
    log.info("tpu-closure-fix: patched %s.%s (%s %s, variant %s)", key[0], key[1], site.package,
             finding.release, site.variant)
    if finding.reason:
        _state.notes[key] = finding.reason
    return Finding(PATCHED, finding.reason, site, finding.release, None)


def _base_patched(site):
    return any((row.module, row.qualname) in _state.patches for row in _sites.base_rows(site))


def _patch_module(module, name=None):
    """Apply every row of ``module`` (imported as ``name``); returns the keys newly patched."""
    name = name or module.__name__
    _state.processed[name] = id(module)
    patched = []
    for key in _sites.site_keys():
        if key[0] != name:
            continue
        try:
            before = key in _state.patches
            finding = _patch_site(key, module)
            if finding.verdict == PATCHED and not before and key in _state.patches:
                patched.append(key)
        except Exception as exc:  # never break the user's program
            _state.failures[key] = "%s: %s" % (type(exc).__name__, exc)
            _warn_once(key, "tpu-closure-fix: %s:%s not patched, error in the shim: %s: %s; "
                            "the original code is in place" % (key[0], key[1], type(exc).__name__, exc))
    return patched


def _on_import(module):
    """wrapt post-import hook: must never raise (that would fail the user's import)."""
    try:
        with _state.lock:
            _state.pending.discard(getattr(module, "__name__", None))
            _arm_for_reload(getattr(module, "__name__", None))
            if _state.enabled:
                _patch_module(module, getattr(module, "__name__", None))
    except Exception as exc:  # pragma: no cover - defensive
        _warn_once(("hook", getattr(module, "__name__", "?")),
                   "tpu-closure-fix: import hook failed for %r: %s" % (module, exc))


def _arm_for_reload(name):
    """Make ``importlib.reload(module)`` fire :func:`_on_import` again.

    wrapt's post-import hooks fire once. A reload re-runs the module body (new class
    objects holding the original functions) and goes through ``sys.meta_path``
    again, where wrapt's ``ImportHookFinder`` chains the loader -- and so calls the hooks
    listed in ``wrapt.importer._post_import_hooks[name]`` after the body ran -- for every
    name that has an entry there. Putting our hook back in that list (it is emptied
    or popped once fired, in wrapt 1.14 and 2.x alike) re-patches the reloaded classes.
    A plain ``import`` of an already-loaded module never reaches the finder, so this
    costs nothing otherwise. Private wrapt API: best effort, never raises.
    """
    if not name:
        return
    try:
        import wrapt.importer as importer

        with importer._post_import_hooks_lock:
            if not importer._post_import_hooks_init:  # finder not installed yet (no hook ever registered)
                importer._post_import_hooks_init = True
                sys.meta_path.insert(0, importer.ImportHookFinder())
            hooks = importer._post_import_hooks.get(name)
            if hooks is None:
                importer._post_import_hooks[name] = [_on_import]
            elif _on_import not in hooks:
                hooks.append(_on_import)
    except Exception:  # pragma: no cover - unknown wrapt internals: reload is then reported by status()
        pass


def enable():
    """Patch every affected site now and as its module gets imported (idempotent)."""
    late = []
    with _state.lock:
        # Import wrapt *before* switching on: otherwise a failed import would leave
        # enabled=True with nothing patched.
        try:
            import wrapt
        except ImportError as exc:
            reason = "wrapt is not importable (%s); pip install 'wrapt>=1.14'" % (exc,)
            _state.disabled_reason = reason
            _warn_once("wrapt", "tpu-closure-fix is inactive: %s. Every call site runs unpatched." % reason)
            return False
        _state.switched_off = _integrations_switched_off()
        _state.enabled = True
        _state.switch.on = True
        log.debug("tpu-closure-fix: enabled; watching %d module(s); integrations switched off: %s",
                  len(_sites.module_names()), ", ".join(sorted(_state.switched_off)) or "none")

        for name in _sites.module_names():
            if name in _state.pending:
                continue
            module = sys.modules.get(name)
            if module is None:
                _state.pending.add(name)
                try:
                    wrapt.register_post_import_hook(_on_import, name)
                except Exception as exc:
                    _state.pending.discard(name)
                    _warn_once(("register", name), "tpu-closure-fix: cannot watch %s: %s" % (name, exc))
            else:
                _arm_for_reload(name)
                late.extend(_patch_module(module, name))
    if late:
        _warn_if_already_stepped()
    return True


def _integrations_switched_off():
    """{integration: reason} of the integrations TPU_CLOSURE_FIX_DISABLE names (the settings read once)."""
    return {name: "%s names %s" % (DISABLE_VAR, name) for name in settings.current().get(DISABLE_VAR)}


def reconcile():
    """Patch watched modules that were imported without the import hook firing; warn once for each.

    The hook does not fire when another ``sys.meta_path`` finder ahead of wrapt's
    returns the module's spec itself (runtime type-checker import hooks do), when
    registering the hook failed, or when a module is put into ``sys.modules`` by
    hand. Called by ``enable()``'s callers, ``status()`` and ``check``; returns
    the keys it patched.
    """
    patched = []
    with _state.lock:
        if not _state.enabled:
            return patched
        for name in _sites.module_names():
            module = sys.modules.get(name)
            if module is None or _state.processed.get(name) == id(module):
                continue
            _state.pending.discard(name)
            keys = _patch_module(module, name)
            patched.extend(keys)
            if keys:
                _warn_once(("unhooked", name), "tpu-closure-fix: %s was imported without its import hook running "
                                               "(another import hook ahead of wrapt's, or a failed hook "
                                               "registration); patched it late, at %s" % (name, ", ".join(
                                                   "%s:%s" % key for key in keys)))
    return patched


def disable(reason="tpu_closure_fix.disable() was called"):
    """Restore the exact original functions (idempotent); pending hooks become no-ops."""
    with _state.lock:
        _state.enabled = False
        _state.switch.on = False
        _state.disabled_reason = reason
        for key, (cls, attr, original, wrapper) in list(_state.patches.items()):
            try:
                if vars(cls).get(attr) is wrapper:
                    setattr(cls, attr, original)
            finally:
                del _state.patches[key]
    return True


def set_disabled_reason(reason):
    with _state.lock:
        if not _state.enabled:
            _state.disabled_reason = reason


def _warn_if_already_stepped():
    """Enabled after a framework was imported: ask each integration whether unfixed steps already ran."""
    for integration in _integrations.load():
        check = getattr(integration, "late_enable_warning", None)
        if check is None:
            continue
        try:
            message = check()
        except Exception:  # pragma: no cover - defensive
            continue
        if message:
            _warn_once("late", message)
            return

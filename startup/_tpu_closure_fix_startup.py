"""Auto-enable for tpu-closure-fix: the watcher armed at interpreter start.

Installed at the root of site-packages and imported by ``tpu_closure_fix.pth``
(every Python) and ``tpu_closure_fix.start`` (PEP 829, Python >= 3.15); also
used by ``sitecustomize_example/`` and ``tpu-closure-fix run``. Importing this
module arms the watcher (as importing ``tpu_closure_fix`` enables the shim);
``install()`` does the same and may be called any number of times.

It runs in *every* interpreter of the environment, most of which never touch a
training framework, so it does as little as it can:

* this module object is itself the ``sys.meta_path`` finder (a finder is any
  object with ``find_spec``): no class is created, no instance made;
* it imports nothing (``sys`` is loaded before any start-up file) and holds no
  other module among its globals: whatever a ``sys.meta_path`` entry refers to
  lives until the interpreter's last clean-up pass, which then clears each such
  module's globals one by one (a finder whose globals held ``os`` cost
  ``python -c pass`` 0.45 million instructions more at exit, callgrind, Python 3.11);
* it has only the functions start-up and firing need: each one is unmarshalled
  at every interpreter start.

Only when a watched top-level package (a framework, or torch_xla; torch too when
``TPU_CLOSURE_FIX_SYNC_CHECK`` is set) is about to be imported does ``find_spec`` take this module off ``sys.meta_path`` and import
``tpu_closure_fix``, which brings wrapt and the real post-import hooks. It always
answers ``None``: the normal finders load the module.

Kept free of any import from ``tpu_closure_fix``: importing that package *is*
enabling the shim.
"""
import sys

# The packages whose import activates the shim: the union of every integration's
# PACKAGES (top-level names; a distribution inside a namespace package by its
# dotted name, as ``find_spec`` is asked for every module, sub-packages included). Must equal tpu_closure_fix.sites.top_level_packages()
# (a test checks it); a literal copy, because importing the package here would
# enable the shim in every interpreter.
WATCHED_PACKAGES = frozenset(("pytorch_lightning", "lightning", "lightning_lite", "lightning_fabric", "accelerate",
                              "optimum.neuron", "torch_xla"))

# Values of TPU_CLOSURE_FIX that disable the shim. Must equal
# tpu_closure_fix.config.OFF_VALUES (a test checks it). Any other value is
# left to tpu_closure_fix.config, which warns about values it does not accept.
OFF_VALUES = frozenset(("0", "false", "off", "no"))

# Arms the zero-code sync check, also under TPU_CLOSURE_FIX=0. Must equal
# tpu_closure_fix.config.SYNC_CHECK_VAR (a test checks it).
SYNC_CHECK_VAR = "TPU_CLOSURE_FIX_SYNC_CHECK"


# What else activates, set by install(): torch when TPU_CLOSURE_FIX_SYNC_CHECK asks for the check, so that
# every process of a job arms it when it imports torch, whatever else it imports or probes.
_also_watched = frozenset()


def find_spec(fullname, path=None, target=None):
    """The finder protocol: on the first watched top-level package, disarm and activate. Finds nothing."""
    if fullname in WATCHED_PACKAGES or fullname in _also_watched:
        uninstall()
        _activate()
    return None


def install():
    """Arm the watcher: put this module first on ``sys.meta_path`` (idempotent).

    Does nothing under ``TPU_CLOSURE_FIX=0`` or when the shim is active already;
    activates at once when a watched package is already imported (a late call).
    A copy of this file executed outside the import system (not in
    ``sys.modules``) has no module object to arm and does nothing.
    """
    watcher = sys.modules.get(__name__)
    if watcher is None or "tpu_closure_fix" in sys.modules:
        return
    for finder in sys.meta_path:
        if finder is watcher:
            return
    if _disabled_by_environment():  # TPU_CLOSURE_FIX=0 without TPU_CLOSURE_FIX_SYNC_CHECK
        return
    global _also_watched
    _also_watched = frozenset(("torch",)) if _sync_check_asked() else frozenset()
    if any(name in sys.modules for name in WATCHED_PACKAGES | _also_watched):
        _activate()
    else:
        sys.meta_path.insert(0, watcher)


def uninstall():
    """Take the watcher off ``sys.meta_path`` (idempotent)."""
    watcher = sys.modules.get(__name__)
    sys.meta_path[:] = [finder for finder in sys.meta_path if finder is not watcher]


def on_watched_import(module):
    """Entry-point hook (group ``tpu_closure_fix``) for wrapt/autowrapt.

    Lives here, not in the package, because wrapt 2's ``discover_post_import_hooks``
    loads entry points at interpreter start: pointing it at this module keeps
    start-up free of the package until a watched package is actually imported.
    """
    if not _disabled_by_environment():
        _activate()


def _disabled_by_environment():
    # TPU_CLOSURE_FIX is off and the zero-code sync check is not asked for (armed with the fix off too).
    # A comment, not a docstring: a docstring is unmarshalled at every interpreter start.
    import os  # a local name, never a global: see the module docstring

    environ = os.environ
    # ASCII whitespace and ASCII case only, as tpu_closure_fix.config: the same value under every locale
    ascii_whitespace = " \t\n\r\x0b\x0c"
    switch = environ.get("TPU_CLOSURE_FIX", "").strip(ascii_whitespace)
    return (switch.isascii() and switch.lower() in OFF_VALUES
            and environ.get(SYNC_CHECK_VAR, "").strip(ascii_whitespace) in ("", "0"))


def _sync_check_asked():
    # TPU_CLOSURE_FIX_SYNC_CHECK set to anything but empty or 0 (a bad value is tpu_closure_fix's to warn about).
    import os  # a local name, never a global: see the module docstring

    return os.environ.get(SYNC_CHECK_VAR, "").strip(" \t\n\r\x0b\x0c") not in ("", "0")


def _activate():
    """Import tpu_closure_fix (importing it enables the shim); never raise."""
    try:
        import tpu_closure_fix  # noqa: F401
    except Exception as exc:  # never break the user's program
        try:
            import warnings

            warnings.warn("tpu-closure-fix could not activate (%s: %s); training runs unpatched."
                          % (type(exc).__name__, exc), RuntimeWarning, stacklevel=3)
        except Exception:
            pass


install()

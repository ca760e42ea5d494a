"""Auto-enable for tpu-closure-fix, run at interpreter start.

Installed at the root of site-packages and named by ``tpu_closure_fix.pth``
(every Python) and ``tpu_closure_fix.start`` (PEP 829, Python >= 3.15), and used
by ``sitecustomize_example/``.

Why it is this small: it runs in *every* interpreter of the environment, most of
which never touch a training framework. So it imports nothing beyond ``os`` and
``sys`` (already loaded at start-up), reads one environment variable, and puts
one tiny finder at the front of ``sys.meta_path``. Only when a watched top-level
package (a framework, or torch_xla) is about to be imported does the finder step aside and import
``tpu_closure_fix`` (which brings wrapt and registers the real post-import
hooks). The finder never loads anything itself: it always answers ``None``.

Kept deliberately free of any import from ``tpu_closure_fix``: importing that
package *is* enabling the shim.
"""
import os
import sys

# The top-level packages whose import activates the shim: the union of every
# integration's PACKAGES. Must equal tpu_closure_fix.sites.top_level_packages()
# (a test checks it); a literal copy, because importing the package here would
# enable the shim in every interpreter.
WATCHED_PACKAGES = frozenset(("pytorch_lightning", "lightning", "lightning_lite", "lightning_fabric", "accelerate",
                              "torch_xla"))

# Values of TPU_CLOSURE_FIX that disable the shim. Must equal
# tpu_closure_fix.config.OFF_VALUES (a test checks it). Any other value is
# left to tpu_closure_fix.config, which warns about values it does not accept.
OFF_VALUES = frozenset(("0", "false", "off", "no"))


# Class names of this finder, in this and earlier releases (a copy of the startup
# module from another install may have armed one).
_WATCHER_NAMES = ("ImportWatcher", "LightningImportWatcher")


def _activate(stacklevel=3):
    """Import tpu_closure_fix (importing it enables the shim); never raise."""
    try:
        import tpu_closure_fix  # noqa: F401
    except Exception as exc:  # never break the user's program
        try:
            import warnings

            warnings.warn(
                "tpu-closure-fix could not activate (%s: %s); training runs unpatched."
                % (type(exc).__name__, exc),
                RuntimeWarning,
                stacklevel=stacklevel,
            )
        except Exception:
            pass


class ImportWatcher(object):
    """Meta-path finder that activates tpu_closure_fix on the first import of a watched package.

    It finds nothing: ``find_spec`` returns ``None`` so the normal finders load
    the module. Before returning for a watched top-level package it removes
    itself and imports ``tpu_closure_fix``, whose wrapt post-import hooks then
    patch the call-site submodules as they are imported.
    """

    def find_spec(self, fullname, path=None, target=None):
        if fullname in WATCHED_PACKAGES:
            uninstall()
            _activate()
        return None


def on_watched_import(module):
    """Entry-point hook (group ``tpu_closure_fix``) for wrapt/autowrapt.

    Lives here, not in the package, because wrapt 2's
    ``discover_post_import_hooks`` loads entry points at interpreter start:
    pointing it at this module keeps start-up free of wrapt-hook work and of the
    package until a watched package is actually imported.
    """
    if not _disabled_by_environment():
        _activate()


def _disabled_by_environment():
    return os.environ.get("TPU_CLOSURE_FIX", "").strip().lower() in OFF_VALUES


def install():
    """Arm the watcher (idempotent). Entry point of the .pth and .start files."""
    if _disabled_by_environment():
        return
    if "tpu_closure_fix" in sys.modules:
        return
    for finder in sys.meta_path:
        if isinstance(finder, ImportWatcher) or type(finder).__name__ in _WATCHER_NAMES:
            return
    if any(name in sys.modules for name in WATCHED_PACKAGES):
        # A watched package is already imported (e.g. install() called late): activate now.
        _activate()
        return
    sys.meta_path.insert(0, ImportWatcher())


def uninstall():
    """Remove the watcher from sys.meta_path (idempotent)."""
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ not in _WATCHER_NAMES]

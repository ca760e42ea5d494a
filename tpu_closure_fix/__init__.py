"""tpu-closure-fix: reduce gradients *after* the closure on torch_xla's data-parallel path.

Importing this package enables the shim (unless ``TPU_CLOSURE_FIX=0``): every
affected call site in :data:`tpu_closure_fix.sites.CALL_SITES` (each
integration's rows, :mod:`tpu_closure_fix.integrations`) is patched now if
already imported, or the moment it is imported.

Public API: :func:`enable`, :func:`disable`, :func:`status`, :func:`is_enabled`,
:class:`TPUClosureFixWarning`; SyncCheck's :class:`SyncCheck`, :func:`check_sync` and
:func:`compare_replicas` (:mod:`tpu_closure_fix.synccheck`).
"""
from .__about__ import __version__
from .config import ENV_VAR, TPUClosureFixWarning
from .engine import disable, enable, is_enabled

__all__ = ["__version__", "ENV_VAR", "TPUClosureFixWarning", "enable", "disable", "is_enabled", "status",
           "SyncCheck", "check_sync", "compare_replicas"]

#: Public names loaded on first use (PEP 562): the auto-enable imports this package in
#: every process that imports Lightning, and these are not needed to patch (about 3.5 ms
#: of module import, benchmarks/bench_import.py).
_LAZY = {"status": "report", "SyncCheck": "synccheck", "check_sync": "synccheck", "compare_replicas": "synccheck"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module("." + _LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def __dir__():
    return sorted(set(globals()) | set(_LAZY))

from . import activation as _activation  # noqa: E402

try:
    _activation.activate()
except Exception as _exc:  # never break the importing program
    import warnings as _warnings

    _warnings.warn("tpu-closure-fix could not activate: %s" % (_exc,), TPUClosureFixWarning)

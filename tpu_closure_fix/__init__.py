"""tpu-closure-fix: reduce gradients *after* the closure on Lightning's TPU path.

Importing this package enables the shim (unless ``TPU_CLOSURE_FIX=0``): every
affected Lightning call site in :data:`tpu_closure_fix.sites.CALL_SITES` is
patched now if already imported, or the moment it is imported.

Public API: :func:`enable`, :func:`disable`, :func:`status`, :func:`is_enabled`,
:class:`TPUClosureFixWarning`.
"""
from .__about__ import __version__
from .config import ENV_VAR, TPUClosureFixWarning
from .engine import disable, enable, is_enabled
from .report import status
from .synccheck import SyncCheck, check_sync  # stdlib-only module: no torch/Lightning import

__all__ = ["__version__", "ENV_VAR", "TPUClosureFixWarning", "enable", "disable", "is_enabled", "status",
           "SyncCheck", "check_sync"]

from . import activation as _activation  # noqa: E402

try:
    _activation.activate()
except Exception as _exc:  # never break the importing program
    import warnings as _warnings

    _warnings.warn("tpu-closure-fix could not activate: %s" % (_exc,), TPUClosureFixWarning)

"""The one code path of every activation mode.

``import tpu_closure_fix``, the .pth/.start startup hook, sitecustomize,
PYTHONSTARTUP, the ``tpu_closure_fix`` entry-point group (wrapt's
``discover_post_import_hooks`` / autowrapt; its hook lives in the startup module) and ``tpu-closure-fix run`` all end
in :func:`activate`, which arms the zero-code SyncCheck when ``TPU_CLOSURE_FIX_SYNC_CHECK`` asks for it,
asks ``TPU_CLOSURE_FIX`` and enables the engine.
"""
import os
import warnings

from . import engine
from .config import ENV_VAR, SYNC_CHECK_VAR, TPUClosureFixWarning, enabled_from_environment, show_value


def activate():
    """Enable the shim unless TPU_CLOSURE_FIX says otherwise. Returns whether it is on."""
    arm_sync_check()
    if not enabled_from_environment():
        raw = os.environ.get(ENV_VAR, "")
        engine.set_disabled_reason("%s=%s" % (ENV_VAR, show_value(raw)))
        return False
    return engine.enable()


def arm_sync_check():
    """Arm the zero-code SyncCheck when its variable is set, whatever TPU_CLOSURE_FIX says (with the fix off,
    the check is exactly what shows the bug). Unset: nothing is imported. Never raises."""
    if not os.environ.get(SYNC_CHECK_VAR):
        return
    try:
        from .synccheck import hook

        hook.arm_from_environment()
    except Exception as exc:  # never break the importing program
        warnings.warn("tpu-closure-fix: the zero-code sync check could not be armed (%s: %s)"
                      % (type(exc).__name__, exc), TPUClosureFixWarning, stacklevel=2)

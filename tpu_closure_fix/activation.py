"""The one code path of every activation mode.

``import tpu_closure_fix``, the .pth/.start startup hook, sitecustomize,
PYTHONSTARTUP, the ``tpu_closure_fix`` entry-point group (wrapt's
``discover_post_import_hooks`` / autowrapt; its hook lives in the startup module) and ``tpu-closure-fix run`` all end
in :func:`activate`, which asks ``TPU_CLOSURE_FIX`` and enables the engine.
"""
import os

from . import engine
from .config import ENV_VAR, QUOTE_LIMIT, enabled_from_environment, quote_value


def activate():
    """Enable the shim unless TPU_CLOSURE_FIX says otherwise. Returns whether it is on."""
    if not enabled_from_environment():
        raw = os.environ.get(ENV_VAR, "")
        engine.set_disabled_reason("%s=%s" % (ENV_VAR, raw if len(raw) <= QUOTE_LIMIT else quote_value(raw)))
        return False
    return engine.enable()

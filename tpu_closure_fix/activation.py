"""The one code path of every activation mode.

``import tpu_closure_fix``, the .pth/.start startup hook, sitecustomize,
PYTHONSTARTUP, the ``tpu_closure_fix`` entry-point group (wrapt's
``discover_post_import_hooks`` / autowrapt; its hook lives in the startup module) and ``tpu-closure-fix run`` all end
in :func:`activate`, which sets the logger's level when ``TPU_CLOSURE_FIX_LOG`` asks for one, arms the
zero-code SyncCheck when ``TPU_CLOSURE_FIX_SYNC_CHECK`` asks for it, asks ``TPU_CLOSURE_FIX`` and enables
the engine.
"""
import logging
import sys
import warnings

from . import engine, settings
from .config import ENV_VAR, LOG_VAR, SYNC_CHECK_VAR, TPUClosureFixWarning, show_value

#: The name of the one stderr handler :func:`configure_logging` puts on the package's logger.
HANDLER_NAME = "tpu_closure_fix.stderr"


def activate():
    """Enable the shim unless TPU_CLOSURE_FIX says otherwise. Returns whether it is on."""
    configure_logging()
    arm_sync_check()
    switches = settings.current()
    if not switches.get(ENV_VAR):
        engine.set_disabled_reason("%s=%s" % (ENV_VAR, show_value(switches.raw[ENV_VAR] or "")))
        return False
    return engine.enable()


def arm_sync_check():
    """Arm the zero-code SyncCheck when its variable is set, whatever TPU_CLOSURE_FIX says (with the fix off,
    the check is exactly what shows the bug). Unset or 0: nothing of it is imported; a bad value is said, and
    nothing armed. Never raises."""
    try:
        if not settings.current().get(SYNC_CHECK_VAR):
            return
        from .synccheck import hook

        hook.arm_from_environment()
    except Exception as exc:  # never break the importing program
        warnings.warn("tpu-closure-fix: the zero-code sync check could not be armed (%s: %s)"
                      % (type(exc).__name__, exc), TPUClosureFixWarning, stacklevel=2)


class _StderrHandler(logging.StreamHandler):
    """A StreamHandler writing to ``sys.stderr`` as it is at each message (as ``logging.lastResort`` does):
    a program or test runner that replaces ``sys.stderr`` later still gets the messages. Where the program
    configured logging (the root logger has handlers, which the package's records reach), those handlers say
    the record and this one stays silent: a record is never shown twice."""

    def __init__(self):
        logging.Handler.__init__(self)

    @property
    def stream(self):
        return sys.stderr

    def emit(self, record):
        if _reaches_root_handlers(logging.getLogger(record.name)):
            return
        logging.StreamHandler.emit(self, record)


def _reaches_root_handlers(logger):
    """Whether records of ``logger`` propagate up to the root logger and the root has handlers."""
    while logger is not None and logger is not logging.root:
        if not logger.propagate:
            return False
        logger = logger.parent
    return bool(logging.root.handlers)


def configure_logging(environ=None, logger=None):
    """Apply ``TPU_CLOSURE_FIX_LOG`` to the package's logger (``tpu_closure_fix``, parent of its child loggers).

    Set to ``debug``/``info``/``warning``/``error``: that level, and one handler writing to stderr (never
    stdout), added once whatever the number of imports, reloads and calls. Unset, empty or a bad value (one
    warning): nothing changes. Returns the level applied, or None. Never raises.
    """
    try:
        level = settings.of(environ).get(LOG_VAR)
        if level is None:
            return None
        logger = logger if logger is not None else logging.getLogger("tpu_closure_fix")
        logger.setLevel(level)
        if not any(getattr(handler, "name", None) == HANDLER_NAME for handler in logger.handlers):
            handler = _StderrHandler()
            handler.set_name(HANDLER_NAME)
            handler.setFormatter(logging.Formatter(logging.BASIC_FORMAT))
            logger.addHandler(handler)
        return level
    except Warning:  # its bad-value warning made an error by -W error: as for TPU_CLOSURE_FIX
        raise
    except Exception as exc:  # never break the importing program
        warnings.warn("tpu-closure-fix: %s could not be applied (%s: %s)" % (LOG_VAR, type(exc).__name__, exc),
                      TPUClosureFixWarning, stacklevel=2)
        return None

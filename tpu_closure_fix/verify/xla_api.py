"""The few torch_xla calls the graph check needs, found by feature detection.

torch_xla moved these between releases (2.1 has ``xm.get_ordinal``/``xm.xla_device``/
``xm.mark_step``; 2.9 removed ``get_ordinal`` and deprecates the other two in favour of
``torch_xla.runtime``, ``torch_xla.device()`` and ``torch_xla.sync()``).  Each helper tries the
newer spelling first and falls back to the older one, judged by what the installed torch_xla
actually has, never by its release number.  When neither exists, :class:`MissingXlaAPI` names
both, so a "could not verify" report says exactly what the installed torch_xla lacks.

Imported only inside the graph check's child process (it imports torch_xla).
"""
import importlib

__all__ = ["MissingXlaAPI", "ordinal", "world_size", "device", "barrier", "barrier_functions"]


class MissingXlaAPI(AttributeError):
    """The installed torch_xla has none of the spellings of a call the graph check needs."""


def _xla():
    return importlib.import_module("torch_xla")


def _xm():
    return importlib.import_module("torch_xla.core.xla_model")


def _runtime():
    try:
        return importlib.import_module("torch_xla.runtime")
    except ImportError:
        return None


def _first(what, candidates):
    """Call the first candidate (owner, attribute name) whose attribute exists and is callable."""
    tried = []
    for owner, name in candidates:
        if owner is None:
            continue
        function = getattr(owner, name, None)
        tried.append("%s.%s" % (owner.__name__, name))
        if callable(function):
            return function()
    raise MissingXlaAPI("torch_xla %s has no %s (looked for %s)"
                        % (getattr(_xla(), "__version__", "?"), what, ", ".join(tried)))


def ordinal():
    """This replica's global ordinal."""
    return _first("replica ordinal", [(_runtime(), "global_ordinal"), (_xm(), "get_ordinal")])


def world_size():
    """The number of replicas."""
    return _first("world size", [(_runtime(), "world_size"), (_xm(), "xrt_world_size")])


def device():
    """This replica's XLA device."""
    return _first("XLA device", [(_xla(), "device"), (_xm(), "xla_device")])


def barrier():
    """Cut and execute the pending graph (``torch_xla.sync()`` or ``xm.mark_step()``)."""
    return _first("step barrier", [(_xla(), "sync"), (_xm(), "mark_step")])


def barrier_functions():
    """Every (owner module, attribute) through which code can cut the graph: both spellings, where
    present.  The graph check intercepts all of them, since the installed Lightning, the shim and
    torch_xla's own ``optimizer_step`` may each use a different one."""
    found = []
    for owner, name in ((_xla(), "sync"), (_xm(), "mark_step")):
        if callable(getattr(owner, name, None)):
            found.append((owner, name))
    if not found:
        raise MissingXlaAPI("torch_xla %s has neither torch_xla.sync nor xla_model.mark_step"
                            % getattr(_xla(), "__version__", "?"))
    return found

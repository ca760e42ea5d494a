"""The layout evidence, recorded when it is made: never found by scanning the live objects.

Which ranks hold a parameter equal (:mod:`.groups`) depends on the modules wrapping it: a
``DistributedDataParallel`` module compares its parameters over its process group, an FSDP1
``FlatParamHandle`` and its ``FullyShardedDataParallel`` module say how its shard is replicated. None of these
is reachable from the tensor, so each is recorded at construction: :func:`watch` wraps the ``__init__`` of
the three classes as soon as their modules are imported (now, when they already are), and each instance made
from then on is kept in a ``weakref.WeakSet`` once its constructor returned -- nothing is kept alive, and an
instance collected is gone from the set, so a recycled ``id`` is never mistaken for it. ``watch`` runs when
SyncCheck is first imported; an instance made before that is not known, unless it is the object given to an
explicit check (:func:`note`).

Reports name a parameter by its module path (``encoder.layers.3.weight``): :func:`holders` reads it from the
modules in reach of the optimizer's step -- the local variables of the frames on the stepping thread's stack
(the loop's ``model``, a method's ``self``, a closure's cells) and the attributes of those objects one level
down (``self.model``) -- and from the recorded DDP and FSDP modules. The work is bounded by the stack and the
model, whatever the number of live objects.

This module imports nothing of torch: the classes are taken from the modules already imported.
"""
import sys
import types
import warnings
import weakref

#: (kind, defining modules, class name): the classes whose instances are layout evidence. ``flat_param`` is
#: where torch < 2.1 defines ``FlatParamHandle``.
WATCHED = (("ddp", ("torch.nn.parallel.distributed",), "DistributedDataParallel"),
           ("fsdp", ("torch.distributed.fsdp.fully_sharded_data_parallel",), "FullyShardedDataParallel"),
           ("handle", ("torch.distributed.fsdp._flat_param", "torch.distributed.fsdp.flat_param"), "FlatParamHandle"))
#: The instances made since :func:`watch`, by kind (weak: recording keeps nothing alive).
_made = {kind: weakref.WeakSet() for kind, _, _ in WATCHED}
#: Classes whose ``__init__`` records (weak: a class gone is forgotten); whether :func:`watch` ran.
_wrapped = weakref.WeakSet()
_state = {"watching": False}
_warned = set()


def watch():
    """Record every DDP module, FSDP module and FlatParamHandle made from now on (idempotent, never raises): each
    class is wrapped when its module is imported, or now when it is."""
    if _state["watching"]:
        return
    _state["watching"] = True
    try:
        import wrapt  # a runtime dependency
    except Exception as exc:
        _warn_once("wrapt", "wrapt is not importable (%s)" % (exc,))
        return
    for kind, modules, name in WATCHED:
        for module in modules:
            try:
                # called at once when the module is already imported
                wrapt.register_post_import_hook(_wrapper_of(kind, name), module)
            except Exception as exc:
                _warn_once(module, "%s: %s" % (type(exc).__name__, exc))


def _wrapper_of(kind, name):
    """The post-import hook wrapping ``name`` of the imported module (a failure is warned, never raised: the
    hook runs inside the user's import)."""

    def hook(module):
        try:
            wrap(getattr(module, name, None), kind)
        except Exception as exc:
            _warn_once(name, "%s: %s" % (type(exc).__name__, exc))

    return hook


def wrap(cls, kind):
    """Make ``cls.__init__`` record each instance as ``kind`` once the original ``__init__`` returned (once per
    class; subclasses reach it through ``super().__init__``)."""
    if not isinstance(cls, type) or cls in _wrapped:
        return
    import wrapt

    def recorded(wrapped, instance, args, kwargs):
        result = wrapped(*args, **kwargs)
        record(kind, instance)
        return result

    cls.__init__ = wrapt.FunctionWrapper(cls.__dict__.get("__init__", cls.__init__), recorded)
    _wrapped.add(cls)


def record(kind, obj):
    """Keep ``obj`` (weakly) as evidence of ``kind``; an object that cannot be weakly referenced is left out."""
    try:
        _made[kind].add(obj)
    except TypeError:
        pass


def made(kind):
    """The live instances of ``kind`` recorded so far (a list: the set may lose members while it is read)."""
    return list(_made[kind])


def _class_of(kind):
    """The class of ``kind`` from the modules already imported, or None."""
    for watched, modules, name in WATCHED:
        if watched == kind:
            for module in modules:
                cls = getattr(sys.modules.get(module), name, None)
                if isinstance(cls, type):
                    return cls
    return None


def note(obj):
    """The object given to an explicit check is evidence too: a DDP module or an FSDP module (with the FSDP
    modules and handles inside it) made before :func:`watch` ran is recorded now."""
    ddp, fsdp = _class_of("ddp"), _class_of("fsdp")
    if ddp is not None and issubclass(type(obj), ddp):
        record("ddp", obj)
    if fsdp is None or not issubclass(type(obj), fsdp):
        return
    for module in obj.modules():
        if issubclass(type(module), fsdp):
            record("fsdp", module)
            handle = module.__dict__.get("_handle")
            if handle is not None:
                record("handle", handle)


# --------------------------------------------------------------------------- module paths
def holders(tensors, frame=None):
    """``{id(tensor): (module path, parameters of the naming module, its class name)}`` for those of
    ``tensors`` some module in reach holds: the module holding most parameters (the model itself) names each.
    ``frame``: where the stack is read from (default: the caller's)."""
    wanted = {id(t) for t in tensors}
    found = {}
    for module in candidates(sys._getframe(1) if frame is None else frame):
        try:
            named = list(module.named_parameters())
        except Exception:  # a module that cannot list its parameters names nothing
            continue
        for name, tensor in named:
            if id(tensor) in wanted and (id(tensor) not in found or len(named) > found[id(tensor)][1]):
                found[id(tensor)] = (name, len(named), type(module).__name__)
    return found


#: Values whose attributes are never read for modules: classes, imported modules, functions.
_NOT_HOLDERS = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


def candidates(frame):
    """The ``torch.nn.Module`` instances in reach of ``frame`` and its callers, innermost first, then the
    recorded DDP and FSDP modules (each once)."""
    module_class = getattr(sys.modules.get("torch.nn.modules.module"), "Module", None)
    if module_class is None:
        return []
    found, seen = [], set()

    def offer(value):
        # type(), not isinstance(): isinstance also reads value.__class__, which some objects answer with a
        # FutureWarning (torch.distributed.reduce_op)
        if issubclass(type(value), module_class) and id(value) not in seen:
            seen.add(id(value))
            found.append(value)
            return True
        return False

    while frame is not None:
        if not _ours(frame):
            for value in _locals(frame):
                if not offer(value) and not issubclass(type(value), _NOT_HOLDERS):
                    for attribute in _attributes(value):
                        offer(attribute)
        frame = frame.f_back
    for kind in ("ddp", "fsdp"):
        for module in made(kind):
            offer(module)
    return found


def _ours(frame):
    name = frame.f_globals.get("__name__") or ""
    return name == "tpu_closure_fix" or name.startswith("tpu_closure_fix.")


def _locals(frame):
    try:
        return list(frame.f_locals.values())
    except Exception:
        return []


def _attributes(value):
    """The values of ``value``'s instance dictionary (``object.__getattribute__``: never the object's own
    ``__getattr__``, which may compute, load or warn)."""
    try:
        state = object.__getattribute__(value, "__dict__")
    except Exception:
        return []
    return list(state.values()) if isinstance(state, dict) else []


def _warn_once(key, problem):
    """Say once that a class cannot be recorded: the check then knows less of the layout, and says so."""
    if key in _warned:
        return
    _warned.add(key)
    from ..config import TPUClosureFixWarning

    warnings.warn("tpu-closure-fix: SyncCheck cannot record the DDP / FSDP modules made from now on (%s): their "
                  "parameters are compared as if no DDP or FSDP module held them." % (problem,),
                  TPUClosureFixWarning, stacklevel=2)

"""A CPU simulation of torch_xla's ``xla_model`` (``torch_xla.core.xla_model``).

Used where there is no TPU: by ``tpu-closure-fix demo`` and, through
``tests/support/xla_standin.py``, as the test suite's one test double. The shim
itself never imports it: on a TPU it works with the real torch_xla. Each
replica is a process joined by ``torch.distributed`` (gloo); after Lightning
was imported, :func:`install` puts this module where ``import
torch_xla.core.xla_model`` finds it. It does what torch_xla's documented
``xla_model`` functions do for data parallelism (torch_xla 2.1.0):

* ``reduce_gradients(optimizer)``: mean all-reduce (sum, then scale by
  1/world size) of every existing ``.grad`` of the optimizer's parameters
  across replicas when the world size is > 1; nothing otherwise;
* ``optimizer_step(optimizer, barrier=False, optimizer_args={})``:
  ``reduce_gradients`` first, then ``optimizer.step(**optimizer_args)``, then
  ``mark_step()`` if ``barrier`` -- the order that makes Lightning's closure bug;
* ``all_reduce(reduce_type, inputs, scale=1.0)``, ``mark_step()`` (nothing to
  cut on CPU), ``xrt_world_size()`` / ``get_ordinal()`` / ``xla_device()`` (CPU);
* ``torch_xla.runtime`` (:data:`runtime`): ``world_size()``, ``global_ordinal()``,
  ``local_ordinal()``, ``process_index()``, ``process_count()``, ``device_type()``, ``local_device_count()``.
  Replicas are processes (one each, the default) or threads of one process
  (PJRT on CPU and TPU v2/v3): a thread that called :func:`enter_replica`
  answers its own ordinal, as torch_xla's per-thread default device does.

``recorder``, when set, is called as ``recorder(name, **info)`` for
``reduce_gradients`` (with how many gradients existed) and ``mark_step``: the
tests assert the order of events with it.
"""
import importlib.util
import sys
import threading
import types

REDUCE_SUM = "sum"
REDUCE_MUL = "mul"
REDUCE_AND = "and"
REDUCE_OR = "or"
REDUCE_MIN = "min"
REDUCE_MAX = "max"

_world = {"size": 1, "ordinal": 0, "processes": 1, "process": 0, "hosts": 1}
_replica = threading.local()  # the ordinal of a replica thread (replicas as threads of one process)
recorder = None


def _record(name, **info):
    if recorder is not None:
        recorder(name, **info)


def configure(world_size=1, ordinal=0, process_count=None, process_index=None, hosts=1):
    """Set the simulated world: its size and this replica's ordinal; by default one replica per process
    (``process_count`` = the world size, ``process_index`` = the ordinal), every process on one host
    (``hosts``: how many hosts share the replicas evenly)."""
    _world.update(size=world_size, ordinal=ordinal, processes=world_size if process_count is None else process_count,
                  process=ordinal if process_index is None else process_index, hosts=hosts)


def enter_replica(ordinal):
    """The calling thread is the replica ``ordinal`` (what ``xmp.spawn`` sets up in each replica thread)."""
    _replica.ordinal = ordinal


def xrt_world_size(defval=1):
    return _world["size"]


world_size = xrt_world_size


def get_ordinal(defval=0):
    return getattr(_replica, "ordinal", _world["ordinal"])


def get_local_ordinal(defval=0):
    return get_ordinal() - _world["process"] * (_world["size"] // max(_world["processes"], 1))


def is_master_ordinal(local=True):
    return (get_local_ordinal() if local else get_ordinal()) == 0


#: ``torch_xla.runtime`` of the simulation (torch_xla >= 2.1's documented functions).
runtime = types.ModuleType("torch_xla.runtime")
runtime.world_size = lambda: _world["size"]
runtime.global_ordinal = lambda: get_ordinal()
runtime.local_ordinal = lambda: get_local_ordinal()
runtime.process_index = lambda: _world["process"]
runtime.process_count = lambda: _world["processes"]
runtime.device_type = lambda: "CPU"
runtime.local_device_count = lambda: _world["size"] // max(_world["hosts"], 1)


def xla_device(n=None, devkind=None):
    import torch

    return torch.device("cpu")


def mark_step(wait=False):
    _record("mark_step")


def _gradients(optimizer):
    return [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def reduce_gradients(optimizer, groups=None, pin_layout=True):
    gradients = _gradients(optimizer)
    _record("reduce_gradients", grads=len(gradients),
            params=sum(len(group["params"]) for group in optimizer.param_groups))
    if xrt_world_size() <= 1 or not gradients:
        return
    import torch.distributed as dist

    for grad in gradients:
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        grad.mul_(1.0 / xrt_world_size())


def optimizer_step(optimizer, barrier=False, optimizer_args={}, groups=None, pin_layout=True):
    reduce_gradients(optimizer, groups=groups, pin_layout=pin_layout)
    loss = optimizer.step(**optimizer_args)
    if barrier:
        mark_step()
    return loss


def all_reduce(reduce_type, inputs, scale=1.0, groups=None, pin_layout=True):
    if xrt_world_size() <= 1:
        return inputs
    import torch.distributed as dist

    op = {REDUCE_SUM: dist.ReduceOp.SUM, REDUCE_MAX: dist.ReduceOp.MAX, REDUCE_MIN: dist.ReduceOp.MIN}[reduce_type]
    tensors = inputs if isinstance(inputs, list) else [inputs]
    for t in tensors:
        dist.all_reduce(t, op=op)
        if scale != 1.0:
            t.mul_(scale)
    return inputs


#: The torch_xla release whose documented ``xla_model`` behaviour this simulates
#: (its ``optimizer_step`` body is that release's), marked as a simulation.
SIMULATED_RELEASE = "2.1.0+simulated"


def _notify_import_hooks(module):
    """Run the post-import hooks registered for ``module.__name__`` (wrapt's documented call for modules
    that appear without going through the import system); nothing if wrapt is not loaded."""
    wrapt = sys.modules.get("wrapt")
    notify = getattr(wrapt, "notify_module_loaded", None)
    if notify is not None:
        notify(module)


class _StandInPackage(types.ModuleType):
    """An empty package module that ``importlib.util.find_spec`` takes for a package that is not installed.

    Frameworks ask ``find_spec("torch_xla")`` at import time (Lightning's and torchmetrics' availability
    checks). For a module already in ``sys.modules`` it reads ``__spec__``: None makes it raise ValueError,
    which some releases do not catch (torchmetrics 0.11: ``import pytorch_lightning`` 1.9 fails), and a real
    spec makes them take the stand-in for torch_xla and import parts of it that it does not have (Lightning
    2.x). So ``find_spec`` alone is answered ModuleNotFoundError, which every such probe catches: torch_xla
    reads as absent, as it is on this machine. The import system, which reads ``__spec__`` too (Python
    3.13's ``import a.b.c``), gets None, as for any module made without a spec, and imports the stand-in
    by name. A spec set on it (a test double presenting itself as an installed torch_xla) is answered
    to both.
    """

    @property
    def __spec__(self):
        spec = self.__dict__.get("_installed_spec")
        if spec is None and sys._getframe(1).f_code is importlib.util.find_spec.__code__:
            raise ModuleNotFoundError("%s is the CPU simulation's stand-in, not an installed package"
                                      % self.__name__, name=self.__name__)
        return spec

    @__spec__.setter
    def __spec__(self, spec):
        self.__dict__["_installed_spec"] = spec


def install(world_size=None, ordinal=None):
    """Make ``import torch_xla.core.xla_model`` return this module in this process; returns it.

    The module takes the name it stands in for, its package carries
    :data:`SIMULATED_RELEASE` as ``__version__``, and post-import hooks
    registered for ``torch_xla.core.xla_model`` run, as for a real import.
    """
    if world_size is not None:
        configure(world_size, ordinal or 0)
    me = sys.modules[__name__]
    first = sys.modules.get("torch_xla.core.xla_model") is not me
    torch_xla = sys.modules.get("torch_xla") or _StandInPackage("torch_xla")
    core = sys.modules.get("torch_xla.core") or _StandInPackage("torch_xla.core")
    torch_xla.__path__ = []
    core.__path__ = []
    torch_xla.core = core
    torch_xla.runtime = runtime
    core.xla_model = me
    torch_xla.__simulated__ = "tpu_closure_fix._simulated_xla (CPU simulation of torch_xla)"
    if not getattr(torch_xla, "__version__", None):
        torch_xla.__version__ = SIMULATED_RELEASE
    sys.modules["torch_xla"] = torch_xla
    sys.modules["torch_xla.core"] = core
    sys.modules["torch_xla.core.xla_model"] = me
    sys.modules["torch_xla.runtime"] = runtime
    if first:
        me.__name__ = "torch_xla.core.xla_model"
        _notify_import_hooks(me)
    return me

"""The torch_xla API accelerate calls, on top of the one test double (support.xla_standin).

accelerate decides at import time whether torch_xla exists (``import
torch_xla.core.xla_model`` and, from 0.28, ``import torch_xla.runtime`` in
``accelerate.utils.imports``) and then runs its own XLA code paths: the
``AcceleratorState`` on ``DistributedType.TPU``/``XLA``, ``AcceleratedOptimizer``
and ``Accelerator.clip_grad_norm_``. :func:`install` therefore makes the
stand-in importable *before* accelerate is imported and adds what those paths
call, following torch_xla 2.1's documented behaviour on a CPU PJRT device:

* ``xla_model``: ``_fetch_gradients`` (every existing ``.grad`` of the
  optimizer's parameters), ``send_cpu_data_to_device`` (CPU: the data
  itself), ``set_replication``, ``get_xla_supported_devices``, ``rendezvous``
  (a gloo barrier);
* ``torch_xla.runtime``: the simulation's own (``world_size``, ``global_ordinal``,
  ``local_ordinal``, ``process_index``, ``process_count``, and ``device_type`` --
  ``"CPU"``, what PJRT_DEVICE=CPU reports, so accelerate takes no TPU-only branch);
* ``torch_xla.distributed.xla_multiprocessing`` / ``parallel_loader`` /
  ``torch_xla.amp``: imported by accelerate at module level, never called by
  the scenarios (no launcher, no prepared DataLoader, no XLA-GPU scaler); any
  attribute use raises (``parallel_loader.MpDeviceLoader``, which accelerate
  subclasses at import time, is a class that raises when instantiated), so a
  scenario cannot silently depend on them.

``all_reduce`` is recorded in the stand-in's event log (``("all_reduce",
{"tensors": n})`` for a list of gradients, ``{"numel": n}`` for one tensor,
e.g. the lockstep loss), so tests can count the reductions that follow each
closure evaluation.
"""
import sys
import types

from support import xla_standin


class _ImportOnly(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError("%s.%s is not simulated (accelerate imports this module; the scenarios never use it)"
                           % (self.__name__, name))


def _unsimulated_class(qualified):
    """A base class accelerate subclasses at import time; instantiating it raises."""
    def __init__(self, *args, **kwargs):
        raise RuntimeError("%s is not simulated (the scenarios never use it)" % qualified)

    return type(qualified.rsplit(".", 1)[1], (object,), {"__init__": __init__})


def _fetch_gradients(optimizer):
    return [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def send_cpu_data_to_device(data, device, input_sharding=None):
    return data


def set_replication(device, devices):
    return None


def get_xla_supported_devices(devkind=None, max_devices=None):
    return ["xla:0"]


def rendezvous(tag, payload=b"", replicas=[]):
    if xla_standin.xrt_world_size() > 1:
        import torch.distributed as dist

        dist.barrier()
    return [payload] * xla_standin.xrt_world_size()


def _recording_all_reduce(simulated):
    def all_reduce(reduce_type, inputs, scale=1.0, groups=None, pin_layout=True):
        if isinstance(inputs, list):
            xla_standin.record("all_reduce", tensors=len(inputs))
        else:
            xla_standin.record("all_reduce", numel=inputs.numel())
        return simulated(reduce_type, inputs, scale=scale, groups=groups, pin_layout=pin_layout)

    all_reduce.__wrapped_simulation__ = simulated
    return all_reduce


def install(world_size, ordinal):
    """Configure the simulated world and make the stand-in importable as torch_xla (before accelerate)."""
    xla_standin.configure(world_size, ordinal)
    xm = xla_standin.install()
    for name, function in (("_fetch_gradients", _fetch_gradients), ("send_cpu_data_to_device", send_cpu_data_to_device),
                           ("set_replication", set_replication),
                           ("get_xla_supported_devices", get_xla_supported_devices), ("rendezvous", rendezvous)):
        if not hasattr(xm, name):
            setattr(xm, name, function)
    if not hasattr(xm.all_reduce, "__wrapped_simulation__"):
        xm.all_reduce = _recording_all_reduce(xm.all_reduce)
    torch_xla = sys.modules["torch_xla"]  # its ``runtime`` is the simulation's (installed with it)
    if "torch_xla.distributed" not in sys.modules:
        distributed = types.ModuleType("torch_xla.distributed")
        distributed.__path__ = []
        sys.modules["torch_xla.distributed"] = torch_xla.distributed = distributed
        for leaf in ("xla_multiprocessing", "parallel_loader", "xla_dist"):
            module = _ImportOnly("torch_xla.distributed." + leaf)
            sys.modules[module.__name__] = module
            setattr(distributed, leaf, module)
        # data_loader.py subclasses it at import time
        distributed.parallel_loader.__dict__["MpDeviceLoader"] = _unsimulated_class(
            "torch_xla.distributed.parallel_loader.MpDeviceLoader")
    if "torch_xla.amp" not in sys.modules:
        sys.modules["torch_xla.amp"] = torch_xla.amp = _ImportOnly("torch_xla.amp")
    return xm

"""Stand-in for torch_xla's ``xla_model`` (``torch_xla.core.xla_model``): the only test double.

There is no TPU here and real XLA collectives cannot execute on CPU, so tests
replace torch_xla -- and nothing else. The stand-in is the package's CPU
simulation, :mod:`tpu_closure_fix._simulated_xla` (also used by the demo),
which follows torch_xla's documented behaviour: ``reduce_gradients`` averages
every existing gradient across the replica processes (``torch.distributed``,
gloo) when the world size is > 1 and does nothing otherwise;
``optimizer_step`` reduces first, then steps, then ``mark_step`` if
``barrier``. This module adds the event log the tests assert on (what happened,
in order, and how many gradients existed when the reduction ran).
"""
import importlib.util
import os
import sys


def _load_simulation():
    """Load tpu_closure_fix/_simulated_xla.py by path: importing it through the package would run
    ``tpu_closure_fix/__init__`` and so activate the shim, which the tests must decide themselves."""
    name = "tpu_closure_fix_simulated_xla_standin"
    if name not in sys.modules:
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "tpu_closure_fix", "_simulated_xla.py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_sim = _load_simulation()
REDUCE_MAX, REDUCE_MIN, REDUCE_SUM = _sim.REDUCE_MAX, _sim.REDUCE_MIN, _sim.REDUCE_SUM
all_reduce, mark_step, optimizer_step, reduce_gradients = (_sim.all_reduce, _sim.mark_step, _sim.optimizer_step,
                                                           _sim.reduce_gradients)
get_local_ordinal, get_ordinal, is_master_ordinal = _sim.get_local_ordinal, _sim.get_ordinal, _sim.is_master_ordinal
world_size, xrt_world_size, xla_device = _sim.world_size, _sim.xrt_world_size, _sim.xla_device



def _all_gather(value, dim=0, groups=None, output=None, pin_layout=True):
    """``xm.all_gather``: every replica's ``value`` concatenated along ``dim`` (gloo), ``value`` itself on
    one replica. SyncCheck's XLA channel names the differing tensors with it."""
    if xrt_world_size() <= 1:
        return value
    import torch
    import torch.distributed as dist

    parts = [torch.empty_like(value) for _ in range(xrt_world_size())]
    dist.all_gather(parts, value.contiguous())
    return torch.cat(parts, dim=dim)


if not hasattr(_sim, "all_gather"):
    _sim.all_gather = _all_gather
all_gather = _sim.all_gather

events = []


def record(name, **info):
    events.append((name, info))


def clear():
    del events[:]


def names():
    return [name for name, _ in events]


def configure(world_size=1, ordinal=0, process_count=None, process_index=None, hosts=1):
    """Set the simulated world; events are recorded from now on."""
    _sim.configure(world_size, ordinal, process_count, process_index, hosts)
    _sim.recorder = record


enter_replica = _sim.enter_replica
runtime = _sim.runtime


def install():
    """Make ``import torch_xla.core.xla_model`` find the simulation (idempotent); events are recorded."""
    _sim.recorder = record
    return _sim.install()

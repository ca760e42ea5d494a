"""Stand-in for torch_xla's ``xla_model`` (``torch_xla.core.xla_model``): the only test double.

There is no TPU here and real XLA collectives cannot execute on CPU, so tests
replace torch_xla -- and nothing else -- by this module. It follows torch_xla's
documented behaviour (``torch_xla/core/xla_model.py``, 2.1.0):

* ``reduce_gradients(optimizer, groups=None, pin_layout=True)``: when the world
  size is > 1, all-reduce (mean) every existing ``.grad`` of the optimizer's
  parameters across replicas; nothing otherwise.
* ``optimizer_step(optimizer, barrier=False, optimizer_args={}, groups=None,
  pin_layout=True)``: ``reduce_gradients`` first, then
  ``optimizer.step(**optimizer_args)``, then ``mark_step()`` if ``barrier``;
  returns the step's result. (This order is the bug the shim fixes.)
* ``mark_step()``: cuts the lazy graph; here only recorded.

It also records an event log (what happened, in order, and whether gradients
existed when the reduction ran) so tests can assert the order.

The cross-replica mean is delegated to a pluggable ``collective`` (a function
``mean_(list_of_tensors)``): ``torch.distributed`` over gloo for process
replicas, or nothing at world size 1.
"""
import sys
import types

REDUCE_SUM = "sum"
REDUCE_MUL = "mul"
REDUCE_AND = "and"
REDUCE_OR = "or"
REDUCE_MIN = "min"
REDUCE_MAX = "max"

events = []
_world = {"size": 1, "ordinal": 0, "collective": None, "all_reduce": None}


def configure(world_size=1, ordinal=0, collective=None, all_reduce=None):
    """Set the simulated world. ``collective(tensors)`` averages in place across replicas."""
    _world.update(size=world_size, ordinal=ordinal, collective=collective, all_reduce=all_reduce)


def record(name, **info):
    events.append((name, info))


def clear():
    del events[:]


def names():
    return [name for name, _ in events]


def xrt_world_size(defval=1):
    return _world["size"]


world_size = xrt_world_size


def get_ordinal(defval=0):
    return _world["ordinal"]


def get_local_ordinal(defval=0):
    return _world["ordinal"]


def is_master_ordinal(local=True):
    return _world["ordinal"] == 0


def xla_device(n=None, devkind=None):
    import torch

    return torch.device("cpu")


def _fetch_gradients(optimizer):
    gradients = []
    for param_group in optimizer.__getstate__()["param_groups"]:
        for group, params in param_group.items():
            if group == "params":
                for p in params:
                    if isinstance(p, __import__("torch").Tensor) and p.grad is not None:
                        gradients.append(p.grad.data)
    return gradients


def reduce_gradients(optimizer, groups=None, pin_layout=True):
    gradients = _fetch_gradients(optimizer)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    record("reduce_gradients", grads=len(gradients), params=len(params))
    count = xrt_world_size()
    if count > 1 and gradients:
        _world["collective"](gradients)


def optimizer_step(optimizer, barrier=False, optimizer_args={}, groups=None, pin_layout=True):
    reduce_gradients(optimizer, groups=groups, pin_layout=pin_layout)
    loss = optimizer.step(**optimizer_args)
    if barrier:
        mark_step()
    return loss


def mark_step(wait=False):
    record("mark_step")


def all_reduce(reduce_type, inputs, scale=1.0, groups=None, pin_layout=True):
    """Only what SyncCheck needs: delegated to the configured all_reduce (or identity at world size 1)."""
    fn = _world["all_reduce"]
    if xrt_world_size() > 1 and fn is not None:
        return fn(reduce_type, inputs, scale)
    return inputs


def install():
    """Make ``import torch_xla.core.xla_model`` return this module (idempotent)."""
    me = sys.modules[__name__]
    torch_xla = sys.modules.get("torch_xla") or types.ModuleType("torch_xla")
    core = sys.modules.get("torch_xla.core") or types.ModuleType("torch_xla.core")
    torch_xla.__path__ = []
    core.__path__ = []
    torch_xla.core = core
    core.xla_model = me
    torch_xla.__stand_in__ = True
    sys.modules["torch_xla"] = torch_xla
    sys.modules["torch_xla.core"] = core
    sys.modules["torch_xla.core.xla_model"] = me
    return me

"""The lockstep rule: every replica's optimizer sees the same closure loss.

Once the closure's gradients are reduced after each evaluation, every replica
holds the same gradients, but each still returns its *local* loss from the
closure. An optimizer that branches on that value -- ``torch.optim.LBFGS``
stops when ``abs(loss - prev_loss) < tolerance_change`` and counts function
evaluations against ``max_eval`` -- can then take a different branch on each
replica. One replica stops while another evaluates the closure again, and that
evaluation's all-reduce has no partner: on a TPU, the replicas wait forever.

:func:`lockstep_loss` makes the loss such an optimizer sees the mean over the
replicas: one extra all-reduce of one scalar per evaluation. Since the
parameters, the gradients and now the loss are identical everywhere, every
replica takes the same branches, evaluates the closure the same number of
times and ends with bitwise identical parameters.

The rule (:func:`reads_loss`): the optimizer, after unwrapping framework
wrappers (``.optimizer`` / ``._optimizer``), is an instance of
``torch.optim.LBFGS`` (subclasses included) -- the one optimizer of
``torch.optim`` whose ``step`` branches on the closure's return value. Every
other optimizer (SGD, Adam, ... with a closure) gets the closure's own result,
untouched, and no extra collective. An optimizer outside ``torch.optim`` that
reads the loss is not recognised: that is a stated limit.
"""
import sys
from functools import partial

#: How deep framework optimizer wrappers are unwrapped (accelerate's AcceleratedOptimizer,
#: Lightning's LightningOptimizer / _FabricOptimizer each add one level).
_MAX_WRAPPERS = 4


def lockstep_loss(xm, optimizer, loss, mean=None):
    """The loss ``optimizer`` should see: the replica mean when it reads the loss, else ``loss``.

    ``xm`` is the torch_xla ``xla_model`` module the caller reduced gradients
    with. The mean is computed the way torch_xla reduces gradients (sum, then
    scale by 1/world size), on a detached copy: the optimizer only reads the
    value, and the user's loss tensor is left as it was. A closure result that
    is not a tensor or a number (None, a dict ...) is returned unchanged.

    ``mean(tensor)``, when given, replaces that all-replica mean: a fix whose
    framework reduces gradients over a group of its own (a data-parallel group
    next to tensor parallelism) averages the loss over the same group, the same
    way; it returns the averaged tensor.
    """
    if not reads_loss(optimizer):
        return loss
    if mean is None:
        world = world_size(xm)
        if world <= 1:
            return loss
        mean = partial(_replica_mean, xm, world)
    value = _as_tensor(loss, optimizer)
    if value is None:
        return loss
    return mean(value)


def _replica_mean(xm, world, value):
    return xm.all_reduce(xm.REDUCE_SUM, value, scale=1.0 / world)


def reads_loss(optimizer):
    """True when the optimizer's ``step`` branches on the closure's loss (torch.optim.LBFGS)."""
    torch = sys.modules.get("torch")
    lbfgs = getattr(getattr(torch, "optim", None), "LBFGS", None)
    if lbfgs is None:
        return False
    for _ in range(_MAX_WRAPPERS + 1):
        if isinstance(optimizer, lbfgs):
            return True
        inner = getattr(optimizer, "optimizer", None)
        if inner is None:
            inner = getattr(optimizer, "_optimizer", None)
        if inner is None or inner is optimizer:
            return False
        optimizer = inner
    return False


def world_size(xm):
    """Number of replicas, by feature detection.

    ``torch_xla.runtime.world_size()`` where that module is loaded (torch_xla
    2.1+; the only spelling in 2.9), else ``xm.xrt_world_size()`` (torch_xla
    before 2.9), else ``torch_xla.runtime`` imported now.
    """
    runtime = sys.modules.get("torch_xla.runtime")
    if runtime is not None and hasattr(runtime, "world_size"):
        return int(runtime.world_size())
    legacy = getattr(xm, "xrt_world_size", None)
    if legacy is not None:
        return int(legacy())
    import torch_xla.runtime as runtime

    return int(runtime.world_size())


def _as_tensor(loss, optimizer):
    """A fresh tensor holding the loss value (on the loss's device, or the parameters'), or None."""
    import torch

    if isinstance(loss, torch.Tensor):
        return loss.detach().clone()
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        device = next((p.device for group in optimizer.param_groups for p in group["params"]), None)
        return torch.tensor(float(loss), device=device)
    return None

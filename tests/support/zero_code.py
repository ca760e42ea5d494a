"""One replica of a training script that never mentions SyncCheck: what the zero-code check sees.

Run as a process (``python -m support.zero_code --scenarios JSON ...``, ``tests`` on sys.path), one per
replica, joined by ``torch.distributed`` over gloo. The training itself is the harness's: the
Lightning Trainer and Lite/Fabric loops of :mod:`support.lightning_api`, accelerate's loop of
:mod:`support.accelerate_replica`, or a plain loop calling ``xm.optimizer_step`` (torch_xla
stand-in) with or without a closure, or on real torch_xla (``xla-real``); ``torch``: a plain
torch.distributed loop without torch_xla, whose gradients are all-reduced (``reduce``) or not. Nothing in it arms or calls SyncCheck: the
environment (``TPU_CLOSURE_FIX_SYNC_CHECK``) decides, through ``import tpu_closure_fix`` as in the
harness (the start-up watcher does the same for a user).

Writes (JSON) every tpu-closure-fix warning issued (message, category, file name, line), the
optimizer steps taken, and what the zero-code check did: whether its module was loaded, whether
torch's registry holds its hook, how many checks ran and the last report.
"""
import sys
import warnings

import torch

from support import ranks  # noqa: E402
from support import replica as harness  # noqa: E402  (data shards, model, optimizers; sets warnings to "ignore")

#: Warnings of this package, as the user would see them; everything else stays ignored (the harness's filter).
OURS = r"(SyncCheck|tpu-closure-fix)"


def record_warnings():
    seen = []
    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        seen.append({"message": str(message), "category": category.__name__, "filename": filename,
                     "lineno": lineno})
        original(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    from support.said import record_into

    return record_into(seen)  # SyncCheck's reports go out on its logger


def show_ours():
    """Show this package's warnings: called once the run's imports are done (support modules set "ignore")."""
    warnings.filterwarnings("always", message=OURS)


def run_torch(args, steps):
    """A plain loop, no framework, no torch_xla: gradients all-reduced (mean) only with ``reduce``."""
    import torch.distributed as dist

    import tpu_closure_fix  # noqa: F401  (the activation path, as the harness's other loops)

    show_ours()

    layers = harness.make_layers({})
    params = [p for layer in layers for p in layer.parameters()]
    optimizer = harness.make_optimizer("sgd", params)
    for x, y in harness.batches(args.rank, steps, 1):
        optimizer.zero_grad()
        harness.loss_fn(layers, x, y).backward()
        if args.reduce and args.world > 1:
            for p in params:
                dist.all_reduce(p.grad)
                p.grad /= args.world
        optimizer.step()


def run_xla(args, steps):
    """A plain loop on the torch_xla stand-in: ``xm.optimizer_step`` with a closure, or after the backward."""
    from support import xla_standin as xm

    xm.configure(args.world, args.rank)
    xm.install()
    import tpu_closure_fix  # noqa: F401
    import torch_xla.core.xla_model as installed

    show_ours()

    layers = harness.make_layers({})
    params = [p for layer in layers for p in layer.parameters()]
    optimizer = harness.make_optimizer("sgd", params)
    for x, y in harness.batches(args.rank, steps, 1):
        def closure(x=x, y=y):
            optimizer.zero_grad()
            loss = harness.loss_fn(layers, x, y)
            loss.backward()
            return loss

        if args.closure:
            installed.optimizer_step(optimizer, optimizer_args={"closure": closure})
        else:
            closure()
            installed.optimizer_step(optimizer)


def run_real_xla(args, steps):
    """A plain loop on real torch_xla, one XLA device per process: ``xm.optimizer_step`` with a closure.

    The processes are joined by gloo only: xm's reduction sees a world of 1 and reduces nothing, so
    replicas with different data diverge (``same_data``: every replica trains on rank 0's data)."""
    import torch_xla.core.xla_model as xm

    import tpu_closure_fix  # noqa: F401

    show_ours()
    device = xm.xla_device()
    layers = [layer.to(device) for layer in harness.make_layers({})]
    params = [p for layer in layers for p in layer.parameters()]
    optimizer = harness.make_optimizer("sgd", params)
    for x, y in harness.batches(0 if args.same_data else args.rank, steps, 1):
        x, y = x.to(device), y.to(device)

        def closure(x=x, y=y):
            optimizer.zero_grad()
            loss = harness.loss_fn(layers, x, y)
            loss.backward()
            return loss

        xm.optimizer_step(optimizer, optimizer_args={"closure": closure})
        xm.mark_step()


def run_lightning(args, steps):
    from support import lightning_api as api

    harness.LightningReplica(args).setup()
    show_ours()

    scenario = {"name": "zero-code", "api": args.api, "optimizer": "sgd", "steps": steps}
    if args.api == "trainer":
        api.run_trainer(scenario, args.rank, args.world, harness)
    else:
        api.run_lite(scenario, args.rank, args.world, harness)


def run_accelerate(args, steps):
    from support import accelerate_replica, accelerate_xla

    accelerate_xla.install(args.world, args.rank)
    import tpu_closure_fix  # noqa: F401

    show_ours()

    accelerate_replica.run_scenario({"name": "zero-code", "optimizer": "sgd", "steps": steps}, args.rank)


RUNNERS = {"torch": run_torch, "xla": run_xla, "xla-real": run_real_xla, "trainer": run_lightning,
           "lite": run_lightning, "accelerate": run_accelerate}


def zero_code_state():
    synchook = sys.modules.get("tpu_closure_fix.synccheck.hook")
    if synchook is None:
        return {"loaded": False, "armed_every": 0, "checks": 0, "last_report": None}
    report = synchook.seen["last_report"]
    return {"loaded": True, "armed_every": synchook.armed_every(), "checks": synchook.seen["checks"],
            "last_report": None if report is None else report.as_dict()}


def drain_checks(seconds=60):
    """Wait (bounded) until the zero-code check's worker answered every check handed to it, so what this
    replica reports about the checks is final (a check is exchanged off the training thread)."""
    worker = sys.modules.get("tpu_closure_fix.synccheck.worker")
    return True if worker is None else worker.drain(seconds)


def run_scenario(args, scenario, seen):
    """Train one scenario; what happened: our warnings issued meanwhile, optimizer steps, the check's state."""
    args.api, args.closure, args.reduce = scenario["api"], scenario.get("closure", True), scenario.get("reduce", False)
    args.same_data = scenario.get("same_data", False)
    first_warning, steps = len(seen), []
    from torch.optim.optimizer import register_optimizer_step_post_hook

    counter = register_optimizer_step_post_hook(lambda *a: steps.append(1))
    error = None
    try:
        RUNNERS[args.api](args, scenario.get("steps", 12))
    except Exception as exc:  # reported, e.g. ReplicaDivergenceError under on-divergence=raise
        error = "%s: %s" % (type(exc).__name__, exc)
    counter.remove()
    drain_checks()
    return {"warnings": seen[first_warning:], "steps": len(steps), "error": error, "zero_code": zero_code_state(),
            "shim": sys.modules["tpu_closure_fix"].is_enabled()}


class ZeroCodeReplica(ranks.Replica):
    """One replica of a script that never mentions SyncCheck. ``--scenarios``: one JSON dict ``{"api": trainer
    | lite | accelerate | torch | xla | xla-real, "steps": 12, "closure": true (xla), "reduce": false (torch),
    "same_data": false (xla-real)}``, or a list of them run one after the other (result: ``{"runs": [...]}``)."""

    def __init__(self, args):
        super(ZeroCodeReplica, self).__init__(args)
        self.args = args
        self.seen = record_warnings()  # before the group is joined: every warning of the run is recorded

    def run(self, scenarios):
        torch.set_num_threads(1)
        if isinstance(scenarios, dict):
            return run_scenario(self.args, scenarios, self.seen)
        return {"runs": [run_scenario(self.args, scenario, self.seen) for scenario in scenarios]}


if __name__ == "__main__":
    ZeroCodeReplica.main()

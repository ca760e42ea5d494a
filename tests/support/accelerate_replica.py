"""One simulated TPU replica training through the installed, released accelerate.

Run as a process (``python -m support.accelerate_replica ...``, ``tests`` on
sys.path), one per replica, joined by ``torch.distributed`` over gloo.

accelerate is put on its XLA code path the way it decides that itself: the
torch_xla stand-in (:mod:`support.accelerate_xla`) is importable before
accelerate is imported, so ``accelerate.utils.imports`` finds torch_xla,
``AcceleratorState`` picks ``DistributedType.TPU`` (<= 0.27) / ``XLA`` (>= 0.28)
and ``AcceleratedOptimizer``, ``Accelerator.backward``, ``accumulate`` and
``clip_grad_norm_`` run their released XLA code. Nothing of accelerate is
replaced or configured by hand. Whether the shim is active follows
``TPU_CLOSURE_FIX``, as for a user (the start-up hook arms it on ``import
accelerate``; ``import tpu_closure_fix`` below is the explicit form).

Scenarios (JSON dicts): ``optimizer`` (sgd/adam/lbfgs), ``steps``, and
``closure`` (default true: ``optimizer.step(closure)``; false: backward, then
``step()``), ``clip`` (``accelerator.clip_grad_norm_`` inside the closure),
``accumulate`` (``Accelerator(gradient_accumulation_steps=N)`` and
``accelerator.accumulate``: the first N-1 micro-batches backward and
``step()`` -- a micro-step, no optimizer step -- the last one steps with a
closure), ``synccheck`` (N: ``tpu_closure_fix.check_sync(model, step, every=N)``
after each step). For each it writes the stand-in's event log, the flattened
parameters after every step, the SyncCheck reports and (rank 0) the
plain-PyTorch reference.
"""
import warnings

warnings.simplefilter("ignore")

import torch  # noqa: E402

from support import ranks, xla_standin  # noqa: E402
from support import replica as harness  # noqa: E402  (data shards, model, optimizers, flatten)

KEY = ("accelerate.optimizer", "AcceleratedOptimizer.step")


# --------------------------------------------------------------------------- reference
def reference(scenario, world, family):
    """Plain PyTorch: each replica's gradients, mean all-reduced where the fixed accelerate reduces them.

    ``family``: ``"optimizer_step"`` (<= 0.27: one reduction after the closure, so a clip inside the
    closure clips local gradients) or ``"xla"`` (>= 0.28: accumulation micro-steps are reduced at
    their ``step()``; clip_grad_norm_ reduces, then clips). The LBFGS closure returns the replica-mean
    loss (the lockstep rule).
    """
    steps, acc = scenario["steps"], scenario.get("accumulate", 1)
    data = [harness.batches(r, steps, acc) for r in range(world)]
    layers = harness.make_layers(scenario)
    params = [p for layer in layers for p in layer.parameters()]
    opt = harness.make_optimizer(scenario["optimizer"], params)
    trajectory = []

    def local(x, y):
        loss = harness.loss_fn(layers, x, y) / acc
        return list(torch.autograd.grad(loss, params)), loss.detach()

    for step in range(steps):
        chunks = [data[r][step * acc:(step + 1) * acc] for r in range(world)]
        # micro-steps: local gradients, reduced at their step() from 0.28 on
        carried = [None] * world
        for micro in range(acc - 1):
            grads = [local(*chunks[r][micro])[0] for r in range(world)]
            carried = [harness.mean_of_replicas(grads, world)] * world if family == "xla" else grads

        def closure():
            per_replica, losses = [], []
            for r in range(world):
                grads, loss = local(*chunks[r][-1])
                if carried[r] is not None:
                    grads = [c + g for c, g in zip(carried[r], grads)]
                if scenario.get("clip") and family == "optimizer_step":
                    grads = harness.clipped_locally(params, grads, scenario["clip"])
                per_replica.append(grads)
                losses.append(loss)
            for p, g in zip(params, harness.mean_of_replicas(per_replica, world)):
                p.grad = g
            if scenario.get("clip") and family == "xla":
                torch.nn.utils.clip_grad_norm_(params, scenario["clip"])
            if isinstance(opt, torch.optim.LBFGS):
                return harness.mean_of_replicas([[loss] for loss in losses], world)[0]
            return losses[0]

        opt.step(closure)
        trajectory.append(harness.flat(params))
    return trajectory


# --------------------------------------------------------------------------- accelerate
def family():
    """The code shape of the installed AcceleratedOptimizer.step (see the module docstring of the integration)."""
    import accelerate.optimizer

    names = accelerate.optimizer.AcceleratedOptimizer.step.__code__.co_names
    return "xla" if "_fetch_gradients" in names else "optimizer_step"


def run_scenario(scenario, rank):
    from accelerate import Accelerator

    acc = scenario.get("accumulate", 1)
    accelerator = Accelerator(gradient_accumulation_steps=acc) if acc > 1 else Accelerator()
    model = harness.sequential(scenario)
    optimizer = harness.make_optimizer(scenario["optimizer"], model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    data = harness.batches(rank, scenario["steps"], acc)
    trajectory, checks = [], []

    def loss_of(x, y):
        return torch.nn.functional.mse_loss(model(x), y)

    for step in range(scenario["steps"]):
        chunk = data[step * acc:(step + 1) * acc]
        for x, y in chunk[:-1]:  # accumulation micro-steps
            with accelerator.accumulate(model):
                accelerator.backward(loss_of(x, y))
                xla_standin.record("micro_step")
                optimizer.step()
                optimizer.zero_grad()
        x, y = chunk[-1]

        def closure(x=x, y=y):
            xla_standin.record("closure")
            if acc == 1:
                optimizer.zero_grad()
            loss = loss_of(x, y)
            accelerator.backward(loss)
            if scenario.get("clip"):
                accelerator.clip_grad_norm_(model.parameters(), scenario["clip"])
            return loss

        with accelerator.accumulate(model):
            harness.step(optimizer, closure, scenario, xla_standin.record)
            optimizer.zero_grad()
        trajectory.append(harness.flat(list(model.parameters())))
        if scenario.get("synccheck"):
            _check_sync(model, step + 1, scenario["synccheck"], checks)
    return {"params": trajectory, "distributed_type": str(accelerator.distributed_type), "synccheck": checks}


def _check_sync(model, step, every, checks):
    """tpu_closure_fix.check_sync after an optimizer step, as a user's accelerate loop would call it."""
    from tpu_closure_fix import check_sync

    xla_standin.record("synccheck")
    warnings_seen = []
    report = check_sync(model, step, every=every, on_divergence=lambda r: warnings_seen.append(r.message()))
    if report is not None:
        checks.append({"report": report.as_dict(), "warnings": warnings_seen})


class AccelerateReplica(ranks.Replica):
    """An accelerate replica: the torch_xla stand-in exists before accelerate looks for it."""

    def setup(self):
        from support import accelerate_xla

        accelerate_xla.install(self.world, self.rank)
        import tpu_closure_fix  # noqa: F401  (TPU_CLOSURE_FIX decides, as for a user)
        import accelerate

        self.family = family()
        return {"shim": tpu_closure_fix.is_enabled(), "accelerate": accelerate.__version__, "family": self.family}

    def train(self, scenario):
        return run_scenario(scenario, self.rank)

    def reference(self, scenario):
        return reference(scenario, self.world, self.family)

    def sites(self):
        return {"site": ranks.call_site(KEY, "verdict")}


if __name__ == "__main__":
    AccelerateReplica.main()

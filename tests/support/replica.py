"""One simulated TPU replica: runs training scenarios through the installed Lightning (or a plain loop).

Run as a process (``python -m support.replica ...`` with ``tests`` on sys.path),
one per replica, joined by ``torch.distributed`` over gloo (the process side is
:class:`support.ranks.Replica`; :class:`LightningReplica` adds Lightning's
imports and training calls). Only torch_xla is
replaced, by :mod:`support.xla_standin`, whose ``reduce_gradients`` averages
gradients across the replica processes exactly as torch_xla does when the world
size is > 1. Everything else -- the Trainer, its loops and closures, the TPU
precision plugin, Lite/Fabric and their optimizer wrappers -- is the installed,
released Lightning code. The ``xla`` scenarios are a plain PyTorch loop that
calls ``xm.optimizer_step`` with a closure itself (:func:`run_xla_loop`).

Whether the shim is active follows the environment, as for a user:
the process imports ``tpu_closure_fix`` and ``TPU_CLOSURE_FIX`` decides.

For each scenario it writes (JSON): the stand-in's event log, the flattened
parameters after every optimizer step, and (rank 0) the plain-PyTorch
reference trajectory computed from all replicas' data shards.

The data shards, the model, the optimizers and the step and reduction helpers
here serve every integration's replica module (accelerate, optimum-neuron,
the zero-code check), so all of them train the same model on the same data.
"""
import sys
import warnings

warnings.simplefilter("ignore")

import torch  # noqa: E402

from support import lightning_api as api  # noqa: E402
from support import ranks  # noqa: E402
from support import xla_standin as xm  # noqa: E402
from support.step_hook import after_each_step  # noqa: E402

IN_FEATURES = 4
OUT_FEATURES = 2
BATCH = 4


# --------------------------------------------------------------------------- data
def shard(rank, steps, accumulate, bf16=False):
    """Replica ``rank``'s batches: different data on every replica.

    ``bf16``: inputs rounded to bfloat16-representable values, so a bf16
    precision plugin's input conversion (Lite/Fabric ``convert_input``) is exact.
    """
    gen = torch.Generator().manual_seed(1000 + rank)
    count = steps * accumulate
    x = torch.randn(count * BATCH, IN_FEATURES, generator=gen)
    y = torch.randn(count * BATCH, OUT_FEATURES, generator=gen)
    if bf16:
        x = x.to(torch.bfloat16).to(torch.float32)
    return x, y


def batches(rank, steps, accumulate, bf16=False):
    x, y = shard(rank, steps, accumulate, bf16)
    return [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, len(x), BATCH)]


def make_layers(scenario):
    torch.manual_seed(7)
    layers = [torch.nn.Linear(IN_FEATURES, 8), torch.nn.Linear(8, OUT_FEATURES)]
    return layers


def loss_fn(layers, x, y):
    return torch.nn.functional.mse_loss(layers[1](torch.tanh(layers[0](x))), y)


def make_optimizer(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=0.01)
    if name == "lbfgs":
        return torch.optim.LBFGS(params, lr=0.1, max_iter=3, history_size=4)
    raise ValueError("optimizer must be one of sgd, adam, lbfgs; got %r" % (name,))


def flat(params):
    return torch.cat([p.detach().reshape(-1) for p in params]).tolist()


def sequential(scenario):
    """The replica model as one module (what accelerate's and optimum-neuron's ``prepare`` wrap): the same
    layers, initialised as ``make_layers`` does."""
    layers = make_layers(scenario)
    return torch.nn.Sequential(layers[0], torch.nn.Tanh(), layers[1])


def mean_of_replicas(per_replica, world):
    """What the stand-in's all_reduce("sum", ..., scale=1/world) and reduce_gradients compute: the replicas'
    values summed in rank order, then scaled."""
    total = per_replica[0]
    for other in per_replica[1:]:
        total = [a + b for a, b in zip(total, other)]
    return [t * (1.0 / world) for t in total]


def clipped_locally(params, grads, max_norm):
    """``grads`` of ``params`` clipped by their own norm: what a replica that clips before any reduction
    steps with."""
    for p, g in zip(params, grads):
        p.grad = g
    torch.nn.utils.clip_grad_norm_(params, max_norm)
    return [p.grad for p in params]


def step(optimizer, closure, scenario, record):
    """One optimizer step as a user's loop takes it: ``optimizer.step(closure)``, or (scenario ``closure``
    false) the closure's backward first and then ``step()``; ``record("step")`` marks the call."""
    if scenario.get("closure", True):
        record("step")
        optimizer.step(closure)
    else:
        closure()
        record("step")
        optimizer.step()


# --------------------------------------------------------------------------- reference
def reference(scenario, world):
    """Plain PyTorch: forward, zero_grad, backward per replica; mean all-reduce; clip; step."""
    steps, acc = scenario["steps"], scenario.get("accumulate", 1)
    data = [batches(r, steps, acc, scenario.get("bf16", False)) for r in range(world)]
    layers = make_layers(scenario)
    params = [p for layer in layers for p in layer.parameters()]
    groups = [params] if not scenario.get("two_optimizers") else [list(layers[0].parameters()),
                                                                  list(layers[1].parameters())]
    opts = [make_optimizer(scenario["optimizer"], g) for g in groups]
    trajectory = []

    def replica_grads(opt_params, batch_list, scale):
        """Gradients of ``opt_params`` summed over the micro-batches (others frozen, like Lightning's
        optimizer toggle), and the last micro-batch's loss."""
        summed, loss = None, None
        frozen = [p for p in params if all(p is not q for q in opt_params)]
        for x, y in batch_list:
            for p in frozen:
                p.requires_grad_(False)
            loss = loss_fn(layers, x, y) * scale
            grads = torch.autograd.grad(loss, opt_params)
            for p in frozen:
                p.requires_grad_(True)
            summed = list(grads) if summed is None else [a + b for a, b in zip(summed, grads)]
        return summed, loss.detach()

    for step in range(steps):
        for opt, opt_params in zip(opts, groups):
            def closure(opt_params=opt_params):
                per_replica, losses = [], []
                for r in range(world):
                    chunk = data[r][step * acc:(step + 1) * acc]
                    grads, loss = replica_grads(opt_params, chunk, 1.0 / acc if acc > 1 else 1.0)
                    if scenario.get("clip_local"):
                        # PL 1.2-1.4 clip inside the closure: each replica clips its local gradients.
                        grads = clipped_locally(opt_params, grads, scenario["clip"])
                    per_replica.append(grads)
                    losses.append(loss)
                for p, g in zip(opt_params, mean_of_replicas(per_replica, world)):
                    p.grad = g
                if scenario.get("clip") and not scenario.get("clip_local"):
                    torch.nn.utils.clip_grad_norm_(opt_params, scenario["clip"])
                return losses[0]

            opt.step(closure)
        trajectory.append(flat(params))
    return trajectory


# --------------------------------------------------------------------------- run
def site_state():
    """For every call-site key whose module is loaded: is the class attribute our wrapper, its verdict and why."""
    from tpu_closure_fix import sites

    states = {"%s:%s" % key: ranks.call_site(key, "verdict", "reason") for key in sites.site_keys()}
    return {key: state for key, state in states.items() if state is not None}


def run_xla_loop(scenario, rank, world):
    """A plain PyTorch loop on torch_xla: ``xm.optimizer_step(opt, optimizer_args={"closure": closure})``.

    ``xm`` is what ``import torch_xla.core.xla_model`` gives a user's script (the
    stand-in, whose ``optimizer_step`` attribute is the guard when the shim is
    on); no framework is involved. Returns the parameters after every step.
    """
    import torch_xla.core.xla_model as installed

    layers = make_layers(scenario)
    params = [p for layer in layers for p in layer.parameters()]
    optimizer = make_optimizer(scenario["optimizer"], params)
    after_each_step(optimizer, lambda: xm.record("step"))
    trajectory = []
    for x, y in batches(rank, scenario["steps"], 1):
        def closure(x=x, y=y):
            xm.record("zero_grad")
            optimizer.zero_grad()
            xm.record("forward")
            loss = loss_fn(layers, x, y)
            loss.backward()
            xm.record("backward")
            return loss

        installed.optimizer_step(optimizer, optimizer_args={"closure": closure})
        trajectory.append(flat(params))
    return trajectory


class LightningReplica(ranks.Replica):
    """A Lightning replica: Lightning is imported first, as a user's script would, then the stand-in takes
    torch_xla's place; each scenario goes through the Trainer, Lite/Fabric or a plain ``xm`` loop."""

    def setup(self):
        xm.configure(self.world, self.rank)
        api.import_lightning()
        xm.install()
        api.bind_standin(xm)
        import tpu_closure_fix  # noqa: F401  (TPU_CLOSURE_FIX decides, as for a user)

        return {"shim": tpu_closure_fix.is_enabled(), "lightning": api.describe()}

    def train(self, scenario):
        entry = {"params": self._trajectory(scenario)}
        if scenario.get("synccheck"):
            entry["synccheck"] = api.synccheck_results()
        return entry

    def _trajectory(self, scenario):
        if scenario["api"] == "trainer":
            return api.run_trainer(scenario, self.rank, self.world, sys.modules[__name__])
        if scenario["api"] == "xla":
            return run_xla_loop(scenario, self.rank, self.world)
        return api.run_lite(scenario, self.rank, self.world, sys.modules[__name__])

    def reference(self, scenario):
        return reference(scenario, self.world)

    def sites(self):
        return {"sites": site_state()}


if __name__ == "__main__":
    LightningReplica.main()

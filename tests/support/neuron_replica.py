"""One simulated Trainium replica training through the installed, released optimum-neuron optimizer.

Run as a process (``python -m support.neuron_replica ...``, ``tests`` on
sys.path), one per replica, joined by ``torch.distributed`` over gloo.

Only torch_xla and the Neuron SDK are stood in (:mod:`support.neuron_sdk`):
accelerate (the release the optimum-neuron wheel requires) builds its
``AcceleratorState`` on ``DistributedType.XLA`` from the torch_xla stand-in,
and ``NeuronAcceleratedOptimizer`` -- the released ``optimum/neuron/accelerate/optimizer.py``
-- wraps a torch optimizer as ``NeuronAccelerator.prepare_optimizer`` does.
From 0.4.0 its ``step`` reads ``accelerator_state.trn_config`` (optimum-neuron's
``NeuronAcceleratorState`` holds its ``TrainingNeuronConfig`` there, whose
``sequence_parallel_enabled`` is False at tensor-parallel size 1); that one
attribute is set on accelerate's state, as that class would have it.

Scenarios (JSON dicts): ``optimizer`` (sgd/adam/lbfgs), ``steps``, ``closure``
(default true: ``optimizer.step(closure)``; false: backward, then ``step()``),
``clip`` (``prepare_clip_grad_norm(parameters, max_norm)`` before each step, as
``NeuronAccelerator.clip_grad_norm_(..., postpone_clipping_to_optimizer_step=True)``
does; 0.0.x's XLA branch never clips: its ``prepare_clip_grad_norm`` keeps only
the model-parallel parameters), ``sequence_parallel`` (0.4 on: ``trn_config.sequence_parallel_enabled``
and the first layer's parameters marked ``sequence_parallel_enabled``; at tensor-parallel size 1 the
pass is the identity, recorded). For each it writes the stand-ins' event log, the flattened parameters
after every step and (rank 0) the plain-PyTorch reference.
"""
import types
import warnings

warnings.simplefilter("ignore")

import torch  # noqa: E402

from support import neuron_sdk, ranks, xla_standin  # noqa: E402
from support import replica as harness  # noqa: E402  (data shards, model, optimizers, flatten)

MODULE = "optimum.neuron.accelerate.optimizer"
KEY = (MODULE, "NeuronAcceleratedOptimizer.step")


# --------------------------------------------------------------------------- reference
def _bucket_mean(per_replica, world):
    """What bucket_allreduce_gradients computes over the data-parallel group: each replica's value
    divided by the data-parallel size, then summed in rank order."""
    total = [t / world for t in per_replica[0]]
    for other in per_replica[1:]:
        total = [a + b / world for a, b in zip(total, other)]
    return total


def reference(scenario, world, family):
    """Plain PyTorch: each replica's gradients averaged after each closure evaluation, the way the fixed
    release averages them (``family``: ``"bucket"``, neuronx-distributed's bucket_allreduce_gradients,
    0.1.0 on; ``"xla"``, torch_xla's reduce_gradients through the guarded ``xm.optimizer_step``, 0.0.x),
    then clipped by neuronx-distributed's clip_grad_norm if asked; LBFGS sees the mean loss."""
    mean = _bucket_mean if family == "bucket" else harness.mean_of_replicas
    steps = scenario["steps"]
    data = [harness.batches(r, steps, 1) for r in range(world)]
    layers = harness.make_layers(scenario)
    params = [p for layer in layers for p in layer.parameters()]
    opt = harness.make_optimizer(scenario["optimizer"], params)
    trajectory = []
    for step in range(steps):
        def closure():
            per_replica, losses = [], []
            for r in range(world):
                loss = harness.loss_fn(layers, *data[r][step])
                per_replica.append(list(torch.autograd.grad(loss, params)))
                losses.append(loss.detach())
            for p, g in zip(params, mean(per_replica, world)):
                p.grad = g
            if scenario.get("clip"):
                _clip(params, scenario["clip"])
            if isinstance(opt, torch.optim.LBFGS):
                return mean([[loss] for loss in losses], world)[0]
            return losses[0]

        opt.step(closure)
        trajectory.append(harness.flat(params))
    return trajectory


def _clip(params, max_norm):
    """neuronx-distributed's clip_grad_norm (the stand-in's code, without its event)."""
    grads = [p.grad.detach() for p in params if p.grad is not None]
    total = torch.zeros([], dtype=torch.float32)
    for grad in grads:
        total += torch.norm(grad, 2) ** 2
    total = torch.pow(total, 0.5)
    coeff = max_norm / (total + 1.0e-6)
    for grad in grads:
        grad.data.mul_(torch.where(coeff < 1, coeff, torch.tensor(1.0)))


# --------------------------------------------------------------------------- optimum-neuron
def family(module):
    """How the installed release reduces: ``"xla"`` (0.0.x: ``xm.optimizer_step`` on XLA) or ``"bucket"``."""
    import inspect

    step = inspect.unwrap(vars(module.NeuronAcceleratedOptimizer)["step"])
    return "xla" if "optimizer_step" in step.__code__.co_names else "bucket"


def neuron_optimizer(module, inner, sequence_parallel=False):
    """A NeuronAcceleratedOptimizer around ``inner``, as NeuronAccelerator.prepare_optimizer builds it."""
    optimizer = module.NeuronAcceleratedOptimizer(inner)
    state = optimizer.accelerator_state
    if _reads_trn_config(module):
        state.trn_config = types.SimpleNamespace(sequence_parallel_enabled=sequence_parallel)
    return optimizer


def _reads_trn_config(module):
    """0.4.0 on: ``step`` reads ``self.accelerator_state.trn_config``."""
    import inspect

    step = inspect.unwrap(vars(module.NeuronAcceleratedOptimizer)["step"])
    return "trn_config" in step.__code__.co_names


def run_scenario(module, scenario, rank):
    from accelerate import Accelerator

    accelerator = Accelerator()
    model = harness.sequential(scenario)
    if scenario.get("sequence_parallel"):  # what neuronx-distributed marks on sequence-parallel LayerNorms
        for p in model[0].parameters():
            p.sequence_parallel_enabled = True
    inner = harness.make_optimizer(scenario["optimizer"], model.parameters())
    inner.register_step_post_hook(lambda *args: xla_standin.record("optimizer_step"))
    optimizer = neuron_optimizer(module, inner, scenario.get("sequence_parallel", False))
    trajectory = []
    for x, y in harness.batches(rank, scenario["steps"], 1):
        def closure(x=x, y=y):
            xla_standin.record("closure")
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss

        if scenario.get("clip"):
            optimizer.prepare_clip_grad_norm(list(model.parameters()), scenario["clip"])
        harness.step(optimizer, closure, scenario, xla_standin.record)
        trajectory.append(harness.flat(list(model.parameters())))
    return {"params": trajectory, "distributed_type": str(accelerator.distributed_type)}


class NeuronReplica(ranks.Replica):
    """An optimum-neuron replica: torch_xla and the Neuron SDK stand-ins exist before optimum-neuron looks."""

    def setup(self):
        neuron_sdk.install(self.world, self.rank)
        import tpu_closure_fix  # noqa: F401  (TPU_CLOSURE_FIX decides, as for a user)

        self.module = neuron_sdk.load_optimizer_module()
        import optimum.neuron.version

        return {"shim": tpu_closure_fix.is_enabled(), "optimum_neuron": optimum.neuron.version.__version__}

    def train(self, scenario):
        return run_scenario(self.module, scenario, self.rank)

    def reference(self, scenario):
        return reference(scenario, self.world, family(self.module))

    def sites(self):
        return {"site": ranks.call_site(KEY, "verdict", "variant", "release")}


if __name__ == "__main__":
    NeuronReplica.main()

"""One replica of the LBFGS lockstep problem, through Fabric or accelerate (whichever the target has).

The problem (2 replicas, gloo): ``w`` in R^2 starts at 0; replica 0's loss is
``((w - [1, -2])**2).sum()``, replica 1's ``10 * ((w - [5, 3])**2).sum()``;
``torch.optim.LBFGS(lr=0.3, max_iter=50, tolerance_change=0.1)`` takes one
step with a closure. With each evaluation's gradients mean-reduced (the shim)
but each replica's local loss handed to LBFGS, the replicas' stopping tests
disagree: one stops while the other evaluates again, and that evaluation's
all-reduce has no partner (on a TPU: a hang). The lockstep rule
(:mod:`tpu_closure_fix.lockstep`) hands LBFGS the replica-mean loss instead.

Scenario keys: ``lockstep`` (default true; false replaces
``tpu_closure_fix.lockstep.reads_loss`` by ``lambda optimizer: False`` in this
process, i.e. the rule switched off). The replica writes its number of closure
evaluations, its final ``w``, and the error its step raised (the partnerless
all-reduce fails once the other replica has exited); it exits right after,
with no further collective, so a replica that stopped early never pairs with
the other's extra all-reduce. Rank 0 also writes the plain-PyTorch reference:
one LBFGS whose closure computes both replicas' losses and gradients and
returns their means.
"""
import warnings

warnings.simplefilter("ignore")

import torch  # noqa: E402

from support import ranks, xla_standin  # noqa: E402

TARGETS = ([1.0, -2.0], [5.0, 3.0])
SCALES = (1.0, 10.0)


def make_optimizer(params):
    return torch.optim.LBFGS(params, lr=0.3, max_iter=50, tolerance_change=0.1)


def local_loss(w, rank):
    return SCALES[rank] * ((w - torch.tensor(TARGETS[rank])) ** 2).sum()


class Point(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(2))


def reference(world):
    w = torch.nn.Parameter(torch.zeros(2))
    opt = make_optimizer([w])
    count = [0]

    def closure():
        count[0] += 1
        grads, losses = [], []
        for rank in range(world):
            loss = local_loss(w, rank)
            grads.append(torch.autograd.grad(loss, [w])[0])
            losses.append(loss.detach())
        w.grad = (grads[0] + grads[1]) * (1.0 / world)
        return (losses[0] + losses[1]) * (1.0 / world)

    opt.step(closure)
    return {"evaluations": count[0], "w": w.detach().tolist()}


# --------------------------------------------------------------------------- frameworks
def setup_fabric(rank, world):
    from support import lightning_api as api

    api.import_lightning()
    xla_standin.install()
    api.bind_standin(xla_standin)
    import tpu_closure_fix  # noqa: F401

    fabric = api.lite[1].Fabric(accelerator="cpu", devices=1, plugins=[api.make_precision("lite")])
    model, optimizer = fabric.setup(*_model_and_optimizer())
    return "fabric", model, optimizer, fabric.backward


def setup_accelerate(rank, world):
    from support import accelerate_xla

    accelerate_xla.install(world, rank)
    import tpu_closure_fix  # noqa: F401
    from accelerate import Accelerator

    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(*_model_and_optimizer())
    return "accelerate", model, optimizer, accelerator.backward


def _model_and_optimizer():
    model = Point()
    return model, make_optimizer(model.parameters())


def _has(name):
    import importlib.util

    return importlib.util.find_spec(name) is not None


def step_once(optimizer, model, backward, rank):
    """One LBFGS step on replica ``rank``'s loss: (closure evaluations, the error the step raised or None)."""
    evaluations = [0]

    def closure():
        evaluations[0] += 1
        optimizer.zero_grad()
        loss = local_loss(model.w, rank)
        backward(loss)
        return loss

    error = None
    try:
        optimizer.step(closure)
    except Exception as exc:  # the partnerless all-reduce of the replica that went on
        error = "%s: %s" % (type(exc).__name__, str(exc)[:300])
    return evaluations[0], error


class LockstepReplica(ranks.Replica):
    """One replica of the lockstep problem; its result is one dict (see the module docstring)."""

    default_world = 2
    #: A bounded wait: a partnerless all-reduce whose peer is still alive fails after this instead of hanging.
    join_timeout = 120
    #: A replica that stopped early must never pair with the other's extra all-reduce: no final collective.
    final_barrier = False

    def run(self, scenarios):
        (scenario,) = scenarios
        xla_standin.configure(self.world, self.rank)
        setup = setup_accelerate if _has("accelerate") else setup_fabric
        framework, model, optimizer, backward = setup(self.rank, self.world)
        from tpu_closure_fix import lockstep

        if not scenario.get("lockstep", True):
            lockstep.reads_loss = lambda optimizer: False  # the rule switched off, in this process only
        evaluations, error = step_once(optimizer, model, backward, self.rank)
        import tpu_closure_fix

        result = {"framework": framework, "shim": tpu_closure_fix.is_enabled(), "evaluations": evaluations,
                  "w": model.w.detach().tolist(), "error": error}
        if self.rank == 0:
            result["reference"] = reference(self.world)
        return result


if __name__ == "__main__":
    LockstepReplica.main()

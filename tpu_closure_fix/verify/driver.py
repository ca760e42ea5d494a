"""The verification driver every integration shares: one tiny training step, recorded.

An integration's ``verify.py`` says only where its step enters the framework (which class and
method, called how) and how the framework's own objects are built around the optimizer.  The model,
the data, the optimizer, the closure and what they record come from here, so that the event orders
and traced graphs of two sites differ only by the code under test.

Event-order self-test (:mod:`.events`: the recording stand-in for torch_xla records
``reduce_gradients`` and ``mark_step``):

* :func:`recording_step`: a seeded ``Linear(3, 1)``, one batch, an SGD whose steps are recorded
  (:func:`record_each_step`) and a closure that records ``forward`` and ``backward``
  (:func:`recording_closure`);
* :class:`FetchingXlaModel`: the stand-in with torch_xla's ``_fetch_gradients``, for releases that
  fetch the gradients to reduce themselves.

Graph check (:mod:`.graph`: real torch_xla, every graph cut intercepted):

* :func:`graph_training`: a ``Linear(4, 2)`` on the harness's device, its SGD and two batches (warm-up,
  traced step);
* :func:`traced_closure`: a plain loop's closure recording ``training_step``, ``zero_grad`` and
  ``backward`` in the harness;
* :func:`traced_step`: the :class:`TracedStep` the harness warms up, traces and analyses.

Reference fixes (the graph check's harness self-test): :func:`reduce_after`, the closure and then the
gradient reduction, the order of the upstream fix; :func:`xla_reduced_closure`, the same with torch_xla's
``reduce_gradients`` looked up at call time (:func:`xla_reduce_gradients`).

Only the standard library is imported at module level: torch and torch_xla are passed in or imported by
the functions that run them, so importing the driver costs nothing where no check runs.
"""
from collections import namedtuple
from functools import partial

__all__ = ["TracedStep", "EventStep", "GraphTraining", "FetchingXlaModel", "record_each_step", "tiny_problem",
           "recording_sgd", "recording_closure", "recording_step", "graph_training",
           "traced_closure", "traced_step", "reduce_after", "xla_reduce_gradients", "xla_reduced_closure"]

#: What a driver's ``graph_step`` returns.  ``params``: the parameters whose pending graph is
#: analysed; ``optimizer``: the torch optimizer the step updates them with (its ``step`` calls are
#: recorded); ``warmup_loss()``: a loss of the same model with no collective in it; ``run()``:
#: performs the traced step (it sets ``harness.loss``); ``route``: how the step reaches the method;
#: ``keep``: objects that must stay alive until the step has run, because the framework holds only
#: weak references to them (pytorch-lightning 1.8's ``LightningModule.trainer`` is a weak proxy).
TracedStep = namedtuple("TracedStep", "params optimizer warmup_loss run route keep")
TracedStep.__new__.__defaults__ = ((),)

#: The parts of one recorded step for the event-order self-test (see :func:`recording_step`).
EventStep = namedtuple("EventStep", "model optimizer closure")

#: A plain model's training on the graph harness's device: ``net``, its ``optimizer`` and two
#: ``(x, y)`` batches, ``warmup_batch`` (the warm-up, executed) and ``step_batch`` (the traced step).
GraphTraining = namedtuple("GraphTraining", "net optimizer warmup_batch step_batch")


# ----------------------------------------------------------------------------------------------
# event-order self-test (recording stand-in for torch_xla)
# ----------------------------------------------------------------------------------------------

def record_each_step(optimizer, events):
    """Append ``"step"`` to ``events`` after every ``optimizer.step(...)``.

    torch >= 2.0: a step post-hook. torch 1.x (the torch of the affected Lightning releases) has no
    ``register_step_post_hook``: the instance's ``step`` is wrapped instead, called the same way."""
    register = getattr(optimizer, "register_step_post_hook", None)
    if register is not None:
        register(lambda *args: events.append("step"))
        return
    step = optimizer.step

    def step_then_record(*args, **kwargs):
        result = step(*args, **kwargs)
        events.append("step")
        return result

    optimizer.step = step_then_record


class FetchingXlaModel(object):
    """The recording stand-in ``xm`` for torch_xla, plus ``_fetch_gradients``: releases that reduce with
    ``xm.all_reduce(..., xm._fetch_gradients(optimizer))`` read it, and the stand-in does not provide
    this private helper.  Everything else is the stand-in's own."""

    def __init__(self, xm):
        self._xm = xm

    def __getattr__(self, name):
        return getattr(self._xm, name)

    @staticmethod
    def _fetch_gradients(optimizer):
        """torch_xla's: the gradients that exist, in parameter order."""
        return [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def tiny_problem(torch):
    """A ``Linear(3, 1)`` model and one batch of 4 samples, seeded: the same numbers for every site."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x, y = torch.randn(4, 3), torch.randn(4, 1)
    return model, x, y


def recording_sgd(torch, params, events):
    """SGD over ``params`` whose every step appends ``"step"`` to ``events``."""
    optimizer = torch.optim.SGD(params, lr=0.1)
    record_each_step(optimizer, events)
    return optimizer


def recording_closure(torch, model, optimizer, x, y, events, zero_grad_after_forward=False):
    """A closure computing the MSE loss of ``model`` on ``(x, y)`` and its backward, appending ``forward``
    and ``backward`` to ``events``.

    The default order is a plain loop's: zero_grad, forward, backward; the loss is returned.
    ``zero_grad_after_forward``: the order of pytorch-lightning 1.0-1.4's
    ``train_step_and_backward_closure`` instead (forward, zero_grad, backward; the loss detached)."""
    def closure():
        if not zero_grad_after_forward:
            optimizer.zero_grad()
        events.append("forward")
        loss = torch.nn.functional.mse_loss(model(x), y)
        if zero_grad_after_forward:
            optimizer.zero_grad()
        loss.backward()
        events.append("backward")
        return loss.detach() if zero_grad_after_forward else loss

    return closure


def recording_step(torch, events, zero_grad_after_forward=False):
    """The tiny problem, its recording SGD and its recording closure, as an :data:`EventStep`: what a
    driver hands to the code under test for one ``step(closure)``."""
    model, x, y = tiny_problem(torch)
    optimizer = recording_sgd(torch, model.parameters(), events)
    closure = recording_closure(torch, model, optimizer, x, y, events, zero_grad_after_forward)
    return EventStep(model, optimizer, closure)


# ----------------------------------------------------------------------------------------------
# graph check (real torch_xla; the harness intercepts every graph cut and all-reduce call)
# ----------------------------------------------------------------------------------------------

def graph_training(harness, net=None):
    """A :data:`GraphTraining` on ``harness.device``: ``net`` (default a ``Linear(4, 2)`` made by
    ``harness.make_net``), an SGD over its parameters and this replica's batches 0 and 1."""
    torch = harness.torch
    net = net if net is not None else harness.make_net(lambda: torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(list(net.parameters()), lr=0.1)
    return GraphTraining(net, optimizer, harness.batch(0), harness.batch(1))


def traced_closure(harness, training, backward=None):
    """A plain loop's closure over ``training.step_batch``: it records ``training_step``, ``zero_grad``
    and ``backward`` in the harness and sets ``harness.loss``.  ``backward(loss)`` backpropagates
    (default ``loss.backward()``; a framework's strategy where the step must go through it)."""
    mse_loss = harness.torch.nn.functional.mse_loss
    x, y = training.step_batch

    def closure():
        harness.record("training_step")
        loss = mse_loss(training.net(x), y)
        harness.loss = loss
        harness.record("zero_grad")
        training.optimizer.zero_grad()
        harness.record("backward")
        if backward is None:
            loss.backward()
        else:
            backward(loss)
        return loss

    return closure


def traced_step(harness, training, run, route, keep=()):
    """The :data:`TracedStep` of ``training``: its parameters and optimizer, the warm-up loss on
    ``training.warmup_batch``, ``run()`` performing the step, ``route`` (lines), ``keep``."""
    mse_loss = harness.torch.nn.functional.mse_loss
    x0, y0 = training.warmup_batch
    return TracedStep(params=list(training.net.parameters()), optimizer=training.optimizer,
                      warmup_loss=lambda: mse_loss(training.net(x0), y0), run=run, route=route, keep=keep)


# ----------------------------------------------------------------------------------------------
# the upstream order, by hand (the graph check's harness self-test)
# ----------------------------------------------------------------------------------------------

def xla_reduce_gradients(optimizer, **options):
    """torch_xla's ``xm.reduce_gradients`` as the module holds it at call time: the graph harness
    replaces it by its recording interceptor, before or after a reference fix is put in place."""
    import torch_xla.core.xla_model as xm

    return xm.reduce_gradients(optimizer, **options)


def reduce_after(reduce_gradients, optimizer, closure, **options):
    """Run ``closure``, then ``reduce_gradients(optimizer, **options)``; return the closure's result.
    Handed to ``optimizer.step(closure=partial(reduce_after, ...))``: the upstream fix's order."""
    result = closure()
    reduce_gradients(optimizer, **options)
    return result


def xla_reduced_closure(optimizer, closure):
    """``closure`` followed by torch_xla's ``reduce_gradients(optimizer)``, as one closure to hand to
    ``optimizer.step``."""
    return partial(reduce_after, xla_reduce_gradients, optimizer, closure)

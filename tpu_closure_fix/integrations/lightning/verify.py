"""Verification driver for the Lightning integration: one optimizer step through a table row.

Used by ``tpu-closure-fix check`` only (the patching code never imports it).  Both entry points
receive a :class:`tpu_closure_fix.verify.table.Target`: the row of the call-site table that
matched the loaded release, and the live class and method it names.  Nothing here finds a
Lightning class by name or by module path: the traced class is the row's, and every other
Lightning object is reached from the row's ``package`` (the Trainer or the Lite/Fabric package
that ships the method), through that package's public attributes (``LightningModule``,
``Trainer``, ``strategies.SingleDeviceStrategy``...), or by feature detection where releases
differ (constructor parameters, where ``Closure`` lives).

The row's code shape decides how a step reaches the method, as in Lightning itself:

* ``accelerator`` (parameters ``optimizer, optimizer_idx, lambda_closure``; pytorch-lightning
  1.2-1.4): ``TPUAccelerator.run_optimizer_step`` called with a closure;
* ``trainer`` (a ``model`` parameter): ``LightningModule.optimizer_step`` ->
  ``LightningOptimizer.step`` -> ``Strategy.optimizer_step`` -> the row's precision plugin, with
  Lightning's own ``Closure``; the event-order self-test runs a real one-step ``Trainer.fit``;
* ``fabric`` (only ``optimizer``; Lite and Fabric): the optimizer wrapper's ``step(closure)`` ->
  ``Strategy.optimizer_step`` -> the row's precision plugin;
* ``module-hook`` (the code holds ``optimizer_closure``; pytorch-lightning 1.0.4-1.0.8): the default
  ``LightningModule.optimizer_step`` hook called as those releases' TPU accelerator calls it (``on_tpu=True``);
* ``lightning-optimizer`` (the code holds ``profiler_name``; pytorch-lightning 1.1): the row's
  ``LightningOptimizer`` method with a closure, its Trainer a CPU one told it is on TPU.

The model, data, optimizer and closures are the shared driver's (:mod:`tpu_closure_fix.verify.driver`);
this module builds the Lightning objects around them.

Entry points (the interface every integration's ``verify.py`` provides):

* :func:`event_step` (event-order self-test, recording stand-in for torch_xla);
* :func:`graph_step` (graph check on real torch_xla): returns a
  :class:`tpu_closure_fix.verify.driver.TracedStep` that the generic harness warms up, traces and
  analyses;
* :func:`reference_fix` (graph check's harness self-test): puts the upstream fix order, written
  by hand, in place of the row's method;
* :func:`matrix_scenarios` (generated support table): which release-matrix scenarios of a target
  ran through a row.
"""
import importlib
import inspect
import sys
from functools import partial

from ...verify import driver
from .module import linear_lightning_module

ACCELERATOR, TRAINER, FABRIC = "accelerator", "trainer", "fabric"
MODULE_HOOK, LIGHTNING_OPTIMIZER = "module-hook", "lightning-optimizer"


def kind_of(row):
    """How a step reaches this row's method, judged by the names of its code shape (its parameters; for
    pytorch-lightning 1.0-1.1, whose methods take keyword-only arguments, the names the code must hold)."""
    params = row.shape.params if row.shape is not None else ()
    requires = row.shape.requires if row.shape is not None else frozenset()
    if "optimizer_closure" in requires:
        return MODULE_HOOK
    if "profiler_name" in requires:
        return LIGHTNING_OPTIMIZER
    if "lambda_closure" in params:
        return ACCELERATOR
    if "model" in params:
        return TRAINER
    return FABRIC


def _package(row):
    """The Lightning package the row belongs to (the row's ``package``: a top-level package, or a
    sub-package of the unified distribution)."""
    return importlib.import_module(row.package)


def _takes(callable_, name):
    try:
        return name in inspect.signature(callable_).parameters
    except (TypeError, ValueError):
        return False


def _make_precision(cls):
    """An instance of a precision plugin class: 2.x plugins take the precision, 1.x take nothing."""
    return cls("32-true") if _takes(cls.__init__, "precision") else cls()


def _single_device_strategy(pkg, device, precision):
    strategy_cls = pkg.strategies.SingleDeviceStrategy
    keyword = "precision_plugin" if _takes(strategy_cls.__init__, "precision_plugin") else "precision"
    return strategy_cls(device=device, **{keyword: precision})


# ----------------------------------------------------------------------------------------------
# event-order self-test (recording stand-in for torch_xla)
# ----------------------------------------------------------------------------------------------

def event_step(target, torch, xm, events):
    """Run one optimizer step through ``target`` with the recording stand-in ``xm`` in place of
    torch_xla; append ``forward``/``backward``/``step`` to ``events`` (the stand-in adds
    ``reduce_gradients``/``mark_step``)."""
    # pytorch-lightning 1.2-1.7 bind torch_xla at module level where it was importable
    target.module.xm = xm
    kind = kind_of(target.row)
    if kind == ACCELERATOR:
        return _accelerator_event_step(target, torch, events)
    if kind == TRAINER:
        return _trainer_event_step(target, torch, events)
    if kind == MODULE_HOOK:
        return _module_hook_event_step(target, torch, events)
    if kind == LIGHTNING_OPTIMIZER:
        return _lightning_optimizer_event_step(target, torch, events)
    return _fabric_event_step(target, torch, events)


def _loop_step(torch, events):
    """The shared recording step with the closure pytorch-lightning 1.0-1.4's loop builds
    (``train_step_and_backward_closure``: forward, zero_grad, backward)."""
    return driver.recording_step(torch, events, zero_grad_after_forward=True)


def _module_hook_event_step(target, torch, events):
    """pytorch-lightning 1.0.4-1.0.8: the TPU accelerator calls the module's ``optimizer_step`` hook with
    ``on_tpu=True`` and the loop's closure (by keyword from 1.0.5; every release accepts them so)."""
    step = _loop_step(torch, events)
    module = target.owner.__new__(target.owner)  # the TPU branch reads nothing of the module's state
    getattr(module, target.attribute)(epoch=0, batch_idx=0, optimizer=step.optimizer, optimizer_idx=0,
                                      optimizer_closure=step.closure, on_tpu=True, using_native_amp=False,
                                      using_lbfgs=False)


def _mse(torch, layer, batch):
    """The event-order steps' loss: MSE of ``layer`` on an ``(x, y)`` batch."""
    return torch.nn.functional.mse_loss(layer(batch[0]), batch[1])


def _lightning_optimizer_event_step(target, torch, events):
    """pytorch-lightning 1.1: ``LightningOptimizer.step(closure)`` reaches the row's method; a CPU Trainer
    (told it is on TPU: test-only, in the child) holds the module whose zero_grad hooks follow the step."""
    pl = _package(target.row)
    _, x, y = driver.tiny_problem(torch)
    model = linear_lightning_module(pl, torch, (3, 1), partial(_mse, torch))()
    opt = driver.recording_sgd(torch, model.parameters(), events)
    trainer = pl.Trainer(max_epochs=1, logger=False, checkpoint_callback=False)
    trainer.model, trainer.on_tpu = model, True
    model.trainer = trainer
    lightning_optimizer = target.owner(opt)
    lightning_optimizer._on_trainer_init(trainer)
    closure = driver.recording_closure(torch, model, opt, x, y, events, zero_grad_after_forward=True)
    getattr(lightning_optimizer, target.attribute)(closure=closure, profiler_name="optimizer_step")


def _fabric_event_step(target, torch, events):
    step = driver.recording_step(torch, events)
    plugin = target.owner.__new__(target.owner)  # its __init__ may probe for a TPU; the step uses no state
    getattr(plugin, target.attribute)(step.optimizer, closure=step.closure)


def _accelerator_event_step(target, torch, events):
    step = _loop_step(torch, events)
    getattr(target.owner.__new__(target.owner), target.attribute)(step.optimizer, 0, step.closure)


def _trainer_event_step(target, torch, events):
    pl = _package(target.row)
    _, x, y = driver.tiny_problem(torch)
    module_class = linear_lightning_module(
        pl, torch, (3, 1), partial(_mse, torch), on_training_step=partial(events.append, "forward"),
        on_after_backward=partial(events.append, "backward"),
        optimizer=lambda params: driver.recording_sgd(torch, params, events))
    # the stand-in takes torch_xla's place in this child: in the module of every class whose __init__ may ask
    # (a class kept for an old import path runs its base's __init__, in the base's module)
    for module in {target.module} | {sys.modules.get(klass.__module__) for klass in target.owner.__mro__}:
        if module is not None and hasattr(module, "_XLA_AVAILABLE"):
            module._XLA_AVAILABLE = True
    plugin = _make_precision(target.owner)
    loader = torch.utils.data.DataLoader([(x, y)], batch_size=None)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, plugins=[plugin])
    trainer.fit(module_class(), train_dataloaders=loader)


# ----------------------------------------------------------------------------------------------
# graph check (real torch_xla; the harness intercepts every graph cut and all-reduce call)
# ----------------------------------------------------------------------------------------------

def graph_step(target, harness):
    """Build one training step through ``target`` on the harness's XLA device; see the module doc."""
    kind = kind_of(target.row)
    if kind == TRAINER:
        return _trainer_graph_step(target, harness)
    if kind == FABRIC:
        return _fabric_graph_step(target, harness)
    raise NotImplementedError("no graph step for %s rows (%s): those releases predate torch_xla 2"
                              % (kind, target.row.variant))


def _fabric_graph_step(target, harness):
    pkg = _package(target.row)
    training = driver.graph_training(harness)
    strategy = _single_device_strategy(pkg, harness.device, _make_precision(target.owner))
    wrapper_cls = _optimizer_wrapper(pkg)
    wrapped = wrapper_cls(optimizer=training.optimizer, strategy=strategy)
    # backpropagate as the framework does: through the strategy where its backward takes the module
    backward = partial(_module_backward, strategy, training.net) if _takes(strategy.backward, "module") else None
    closure = driver.traced_closure(harness, training, backward)
    return driver.traced_step(harness, training, run=lambda: wrapped.step(closure),
                              route=["%s.step(closure) -> Strategy.optimizer_step -> %s.%s"
                                     % (wrapper_cls.__name__, target.owner.__name__, target.attribute)])


def _module_backward(strategy, module, loss):
    strategy.backward(loss, module)


def _optimizer_wrapper(pkg):
    """The class Lite/Fabric wraps a user's optimizer in: the one in ``<package>.wrappers`` built
    from an optimizer and a strategy, with a ``step``."""
    for value in vars(pkg.wrappers).values():
        if isinstance(value, type) and value.__module__ == pkg.wrappers.__name__ and hasattr(value, "step") \
                and _takes(value.__init__, "optimizer") and _takes(value.__init__, "strategy"):
            return value
    raise LookupError("%s.wrappers has no optimizer wrapper (a class taking optimizer and strategy)" % pkg.__name__)


def _closure_classes(pl):
    """Lightning's automatic-optimization ``Closure`` and ``ClosureResult``: in
    ``loops.optimization.optimizer_loop`` up to 1.9, ``loops.optimization.automatic`` since 2.0."""
    optimization = pl.loops.optimization
    for value in list(vars(optimization).values()):
        if inspect.ismodule(value) and hasattr(value, "Closure") and hasattr(value, "ClosureResult"):
            return value.Closure, value.ClosureResult
    raise LookupError("no Closure/ClosureResult in %s" % optimization.__name__)


def _cpu_only_accelerators(pl):
    """Make every accelerator but the CPU one report unavailable (test-only, in the child).

    There is nothing else on this machine; the TPU probe of some releases starts a process,
    which a replica thread cannot, and the Trainer only uses it to pick defaults."""
    accelerators = pl.accelerators
    changed = []
    for name, value in sorted(vars(accelerators).items()):
        if isinstance(value, type) and issubclass(value, accelerators.Accelerator) \
                and value not in (accelerators.Accelerator, accelerators.CPUAccelerator) \
                and "is_available" in dir(value):
            value.is_available = staticmethod(lambda: False)
            changed.append(name)
    return changed


def _traced_loss(harness, layer, batch):
    """The Trainer graph step's loss, kept in the harness (the analysis reads its graph)."""
    x, y = batch
    harness.loss = harness.torch.nn.functional.mse_loss(layer(x), y)
    return harness.loss


def _trainer_graph_step(target, harness):
    pl = _package(target.row)
    module_class = linear_lightning_module(pl, harness.torch, (4, 2), partial(_traced_loss, harness),
                                                  on_training_step=partial(harness.record, "training_step"))
    model = harness.make_net(module_class)
    training = driver.graph_training(harness, net=model)
    optimizer = training.optimizer
    plugin = _make_precision(target.owner)
    changed = harness.once("cpu-only accelerators", lambda: _cpu_only_accelerators(pl))
    if changed:
        harness.note("test-only: %s.is_available -> False (no accelerator but the CPU here)" % ", ".join(changed))
    strategy = _single_device_strategy(pl, harness.device, plugin)
    trainer = pl.Trainer(accelerator="cpu", devices=1, strategy=strategy, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, max_steps=1)
    harness.note("Trainer(strategy=SingleDeviceStrategy(xla device, %s))" % type(plugin).__name__)
    strategy = trainer.strategy
    if strategy.precision_plugin is not plugin:
        raise RuntimeError("the Trainer replaced the precision plugin %s by %s"
                           % (type(plugin).__name__, type(strategy.precision_plugin).__name__))
    strategy.connect(model)
    model.trainer = trainer
    to_lightning = pl.core.optimizer.LightningOptimizer._to_lightning_optimizer
    lopt = to_lightning(optimizer, strategy, 0) if _takes(to_lightning, "opt_idx") else to_lightning(optimizer, strategy)
    Closure, ClosureResult = _closure_classes(pl)

    def step_fn():
        return ClosureResult.from_training_step_output(model.training_step(training.step_batch, 1), 1)

    def zero_grad_fn():
        harness.record("zero_grad")
        optimizer.zero_grad()

    def backward_fn(loss):
        harness.record("backward")
        if _takes(strategy.backward, "optimizer_idx"):
            strategy.backward(loss, optimizer, 0)
        else:
            strategy.backward(loss, optimizer)

    closure = Closure(step_fn=step_fn, backward_fn=backward_fn, zero_grad_fn=zero_grad_fn)
    if _takes(model.optimizer_step, "optimizer_idx"):  # pytorch-lightning <= 1.9
        run = partial(model.optimizer_step, 0, 1, lopt, 0, closure)
    else:
        run = partial(model.optimizer_step, 0, 1, lopt, closure)
    return driver.traced_step(
        harness, training, run=run,
        route=["LightningModule.optimizer_step -> LightningOptimizer.step -> Strategy.optimizer_step -> %s.%s"
               % (target.owner.__name__, target.attribute)],
        keep=(trainer,))  # the module and optimizer refer to it through weak proxies


# ----------------------------------------------------------------------------------------------
# the upstream order, by hand (the graph check's harness self-test)
# ----------------------------------------------------------------------------------------------

def reference_fix(target):
    """Replace the row's method by the upstream fix order written out by hand (pytorch-lightning
    1.9's ``_tpu_wrap_closure``): closure, then ``reduce_gradients``, then the step, then
    ``mark_step``.  Only for rows the shim patches; fixed-upstream rows already have it."""
    kind = kind_of(target.row)
    if kind == TRAINER:
        method = _reference_trainer_step(target.function)
    elif kind == FABRIC:
        method = _reference_fabric_step
    else:
        raise NotImplementedError("no reference order for %s rows" % kind)
    setattr(target.owner, target.attribute, method)


def _reference_trainer_step(original):
    import torch_xla.core.xla_model as xm

    def finish(optimizer, wrapped, kwargs):
        closure_result = optimizer.step(closure=wrapped, **kwargs)
        xm.mark_step()
        return closure_result

    if _takes(original, "optimizer_idx"):  # pytorch-lightning <= 1.9
        def optimizer_step(self, optimizer, model, optimizer_idx, closure, **kwargs):
            wrapped = driver.xla_reduced_closure(optimizer, closure)
            return finish(optimizer, partial(self._wrap_closure, model, optimizer, optimizer_idx, wrapped), kwargs)
    else:
        def optimizer_step(self, optimizer, model, closure, **kwargs):
            wrapped = driver.xla_reduced_closure(optimizer, closure)
            return finish(optimizer, partial(self._wrap_closure, model, optimizer, wrapped), kwargs)
    return optimizer_step


def _reference_fabric_step(self, optimizer, **kwargs):
    import torch_xla.core.xla_model as xm

    closure = kwargs.pop("closure", None)
    if closure is None:
        return xm.optimizer_step(optimizer, optimizer_args=kwargs)
    result = optimizer.step(closure=driver.xla_reduced_closure(optimizer, closure), **kwargs)
    xm.mark_step()
    return result


def _base_row(site):
    """The row an inheriting (bf16) row inherits its method from (itself if it inherits nothing)."""
    if not site.inherits:
        return site
    from ...sites import base_rows

    return next(iter(base_rows(site)), site)


def matrix_scenarios(site, target):
    """Names of the scenarios of a release-matrix ``target`` (its trimmed summary) that ran through ``site``.

    Trainer scenarios are named ``trainer-*``, Lite/Fabric ones ``lite-*``; a row is the Trainer's
    when its code shape is (:func:`kind_of`). pytorch-lightning 1.5-1.7's ``LightningLite`` goes
    through the Trainer's precision plugin, so its ``lite-*`` scenarios count for the Trainer rows
    there. An inheriting (bf16) row is verified by the ``*-bf16`` scenarios only.
    """
    run = target.get("scenarios_run") or []
    lite_kind = (target.get("lightning") or {}).get("lite") or ""
    if kind_of(_base_row(site)) != FABRIC:
        names = [n for n in run if n.startswith("trainer-")]
        if lite_kind.endswith("(pl-lite)"):
            names += [n for n in run if n.startswith("lite-")]
    else:
        names = [n for n in run if n.startswith("lite-")]
    if site.inherits:
        names = [n for n in names if n.endswith("-bf16")]
    return names

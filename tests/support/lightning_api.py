"""Adapters over the installed Lightning release: one training API across 1.2 - 2.6.

The tests drive the *real* Lightning code from the top: ``Trainer.fit`` with the
TPU precision plugin, and the LightningLite / Lite / Fabric loop with
``optimizer.step(closure)``. What differs between releases (constructor
arguments, hook signatures, class names) is absorbed here, in one place.

Where a release cannot run that way it goes lower, and says so:

* pytorch-lightning 1.2-1.4: the buggy call lives in
  ``TPUAccelerator.run_optimizer_step``, which the Trainer reaches only with a
  real XLA device. The scenario calls that installed method directly with a
  closure built like those releases' training loop (forward, zero_grad,
  backward, clipping inside the closure) -- see :func:`_run_accelerator`.

Only torch_xla is replaced (by the stand-in): :func:`bind_standin` binds it
where Lightning would have bound torch_xla had it been importable, and sets
the call-site modules' ``_XLA_AVAILABLE`` so their constructors accept it.
Lightning's own lazy availability checks are settled first, before the
stand-in exists (:func:`_settle_availability`), so accelerator detection still
sees a CPU-only machine.

Every other matrix target runs from the top with the same code: pytorch-lightning
1.5.10 - 2.6.6 and lightning 1.8.6 / 2.6.6 (``Trainer.fit``; PL 1.5-1.7 also
``pytorch_lightning.lite.LightningLite``), lightning-lite 1.8.x and the
``lightning_lite`` inside PL 1.8 / ``lightning.lite`` (``LightningLite``),
lightning-fabric 1.9.5 - 2.6.6 and the copies inside PL >= 1.9 / ``lightning``
(``Fabric``). bf16 scenarios use data that is exact in bfloat16, so a bf16
plugin's input conversion (Lite/Fabric ``convert_input``) changes no value.
"""
import importlib
import sys

from packaging.version import Version

from support.step_hook import after_each_step

pl = None        # pytorch_lightning or lightning.pytorch, when installed
lite = None      # (kind, module) for LightningLite / lightning_lite / lightning_fabric / lightning.fabric
PL_RELEASE = None


def _try(name):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def import_lightning():
    """Import whatever Lightning the target provides (before the stand-in is installed)."""
    global pl, lite, PL_RELEASE
    pl = _try("pytorch_lightning") or _try("lightning.pytorch")
    if pl is not None:
        top = sys.modules[pl.__name__.split(".")[0]]
        PL_RELEASE = Version(top.__version__)
    for kind, name in (("fabric", "lightning_fabric"), ("fabric", "lightning.fabric"), ("lite", "lightning_lite"),
                       ("lite", "lightning.lite")):
        module = _try(name)
        if module is not None:
            lite = (kind, module)
            break
    else:
        if pl is not None and PL_RELEASE is not None and Version("1.5") <= PL_RELEASE < Version("1.8"):
            lite = ("pl-lite", importlib.import_module(pl.__name__ + ".lite"))
    _call_site_modules()
    _settle_availability()
    return pl, lite


def _settle_availability():
    """Evaluate Lightning's lazy ``_XLA_AVAILABLE`` checks now, before the stand-in exists.

    lightning-utilities' ``RequirementCache`` / ``ModuleAvailableCache`` (lite 1.8,
    fabric 1.9+) check ``find_spec("torch_xla")`` on first use and cache the
    answer. Left lazy, the first use comes after the stand-in is installed (PL 1.9.5's
    ``Trainer.__init__`` logs ``TPUAccelerator.is_available()``), and the answer would
    depend on how the stand-in presents itself to ``find_spec``. Settled here, they
    answer what they would on this machine -- no torch_xla, no TPU -- and only the
    call-site modules are told XLA is available (:func:`bind_standin`).
    """
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(("pytorch_lightning", "lightning")):
            continue
        flag = getattr(module, "_XLA_AVAILABLE", None)
        if flag is not None and not isinstance(flag, bool):
            try:
                bool(flag)
            except Exception:
                pass


def describe():
    out = {}
    if pl is not None:
        out["trainer"] = "%s %s" % (pl.__name__, PL_RELEASE)
    if lite is not None:
        top = sys.modules[lite[1].__name__.split(".")[0]]
        out["lite"] = "%s %s (%s)" % (lite[1].__name__, getattr(top, "__version__", "?"), lite[0])
    return out


def release_of(module):
    top = sys.modules[module.__name__.split(".")[0]]
    return Version(top.__version__)


# --------------------------------------------------------------------------- call-site modules
def trainer_precision_module():
    """(module, class name, bf16 module, bf16 class name) of the Trainer's TPU precision plugin (before 1.2: of
    the class whose method hands the closure to torch_xla)."""
    if PL_RELEASE < Version("1.1"):
        return importlib.import_module(pl.__name__ + ".core.lightning"), "LightningModule", None, None
    if PL_RELEASE < Version("1.2"):
        return importlib.import_module(pl.__name__ + ".core.optimizer"), "LightningOptimizer", None, None
    if PL_RELEASE < Version("1.5"):
        return importlib.import_module(pl.__name__ + ".accelerators.tpu"), "TPUAccelerator", None, None
    if PL_RELEASE < Version("2.1"):
        return (importlib.import_module(pl.__name__ + ".plugins.precision.tpu"), "TPUPrecisionPlugin",
                importlib.import_module(pl.__name__ + ".plugins.precision.tpu_bf16"), "TPUBf16PrecisionPlugin")
    module = importlib.import_module(pl.__name__ + ".plugins.precision.xla")
    name = "XLAPrecisionPlugin" if hasattr(module, "XLAPrecisionPlugin") else "XLAPrecision"
    return module, name, None, None


def lite_precision_module():
    kind, module = lite
    if kind == "pl-lite":
        return trainer_precision_module()
    base = module.__name__
    if release_of(module) >= Version("2.1"):
        return importlib.import_module(base + ".plugins.precision.xla"), "XLAPrecision", None, None
    return (importlib.import_module(base + ".plugins.precision.tpu"), "TPUPrecision",
            importlib.import_module(base + ".plugins.precision.tpu_bf16"), "TPUBf16Precision")


def _call_site_modules():
    mods = []
    if pl is not None:
        mods.extend(m for m in trainer_precision_module()[::2] if m is not None)
    if lite is not None:
        mods.extend(m for m in lite_precision_module()[::2] if m is not None)
    return mods


def bind_standin(xm):
    """Put the stand-in where Lightning binds torch_xla (module-level ``xm``) and say XLA is available."""
    for module in _call_site_modules():
        module.xm = xm
        module._XLA_AVAILABLE = True


def make_precision(api_name, bf16=False):
    module, name, bf16_module, bf16_name = (trainer_precision_module() if api_name == "trainer"
                                            else lite_precision_module())
    if bf16:
        if bf16_module is None:
            raise ValueError("no bf16 TPU precision class in this release")
        return getattr(bf16_module, bf16_name)()
    cls = getattr(module, name)
    if name == "XLAPrecision" or name == "XLAPrecisionPlugin":
        return cls("32-true")
    return cls()


# --------------------------------------------------------------------------- Trainer
def _module_class(scenario, harness):
    from support import xla_standin as xm

    two = bool(scenario.get("two_optimizers"))
    manual = bool(scenario.get("manual"))

    class ScenarioModule(pl.LightningModule):
        def __init__(self):
            super().__init__()
            layers = harness.make_layers(scenario)
            self.layer0, self.layer1 = layers
            if manual:
                self.automatic_optimization = False

        def forward(self, x):
            return self.layer1(__import__("torch").tanh(self.layer0(x)))

        def training_step(self, batch, batch_idx, *optimizer_idx):
            xm.record("forward")
            x, y = batch
            loss = harness.loss_fn([self.layer0, self.layer1], x, y)
            if manual:
                opt = self.optimizers()
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
                return None
            if scenario.get("return_none"):
                return None
            return loss

        def optimizer_zero_grad(self, *args, **kwargs):
            xm.record("zero_grad")
            return super().optimizer_zero_grad(*args, **kwargs)

        def on_after_backward(self):
            xm.record("backward")

        def on_before_optimizer_step(self, *args, **kwargs):
            grads = [p.grad for p in self.parameters() if p.grad is not None]
            xm.record("before_optimizer_step", grads=len(grads))

        def configure_optimizers(self):
            groups = ([list(self.layer0.parameters()), list(self.layer1.parameters())] if two
                      else [list(self.parameters())])
            opts = [harness.make_optimizer(scenario["optimizer"], g) for g in groups]
            for opt in opts:
                after_each_step(opt, lambda: xm.record("step"))
            return opts if two else opts[0]

    return ScenarioModule


def run_trainer(scenario, rank, world, harness):
    """Train ``scenario["steps"]`` optimizer steps with Trainer.fit; return params after each step."""
    import torch

    if PL_RELEASE < Version("1.5"):
        return _run_accelerator(scenario, rank, world, harness)
    model = _module_class(scenario, harness)()
    data = harness.batches(rank, scenario["steps"], scenario.get("accumulate", 1), scenario.get("bf16", False))
    loader = torch.utils.data.DataLoader(data, batch_size=None, shuffle=False)
    trajectory = []

    accumulate = scenario.get("accumulate", 1)

    class Snapshot(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx, *rest):
            if (batch_idx + 1) % accumulate == 0:
                trajectory.append(harness.flat(list(module.parameters())))

    # One epoch over exactly steps x accumulate batches: no max_steps, whose meaning changed across releases.
    kwargs = dict(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                  plugins=[make_precision("trainer", bf16=scenario.get("bf16", False))],
                  callbacks=[Snapshot()] + synccheck_callbacks(scenario))
    if scenario.get("clip"):
        kwargs["gradient_clip_val"] = scenario["clip"]
    if scenario.get("accumulate", 1) > 1:
        kwargs["accumulate_grad_batches"] = scenario["accumulate"]
    trainer = pl.Trainer(**kwargs)
    trainer.fit(model, train_dataloaders=loader)
    return trajectory


def _run_accelerator(scenario, rank, world, harness):
    """PL 1.2-1.4: call the installed TPUAccelerator.run_optimizer_step (see module docstring).

    Mirrors those releases' training loop (``TrainLoop.run_training_batch`` /
    ``TrainingBatchLoop``): for each optimizer, the micro-batches that only
    accumulate run forward/backward outside the optimizer step; the stepping
    micro-batch runs inside Lightning's closure ``training_step_and_backward``
    (forward, zero_grad on the first micro-batch of an accumulation window,
    backward scaled by ``1/accumulate_grad_batches``, then clipping --
    ``track_and_norm_grad`` -- on the stepping batch). Manual optimization:
    ``manual_backward`` then ``opt.step()``, which reaches
    ``run_optimizer_step`` with Lightning's ``do_nothing_closure``.
    """
    import torch
    from support import xla_standin as xm

    core_optimizer = _try(pl.__name__ + ".core.optimizer")
    do_nothing = getattr(core_optimizer, "do_nothing_closure", None) or (lambda: None)
    layers = harness.make_layers(scenario)
    params = [p for layer in layers for p in layer.parameters()]
    groups = ([list(layers[0].parameters()), list(layers[1].parameters())] if scenario.get("two_optimizers")
              else [params])
    opts = [harness.make_optimizer(scenario["optimizer"], g) for g in groups]
    for opt in opts:
        after_each_step(opt, lambda: xm.record("step"))
    run_optimizer_step = _optimizer_step_of_release(layers, opts)
    accumulate = scenario.get("accumulate", 1)
    data = harness.batches(rank, scenario["steps"], accumulate)
    trajectory = []

    def training_step_and_backward(opt, x, y, first):
        xm.record("forward")
        loss = harness.loss_fn(layers, x, y)
        if accumulate > 1:
            loss = loss / accumulate
        if first:
            xm.record("zero_grad")
            opt.zero_grad()
        loss.backward()
        xm.record("backward")
        return loss.detach()

    for step in range(scenario["steps"]):
        chunk = data[step * accumulate:(step + 1) * accumulate]
        for opt_idx, (opt, group) in enumerate(zip(opts, groups)):
            if scenario.get("manual"):
                x, y = chunk[0]
                xm.record("forward")
                loss = harness.loss_fn(layers, x, y)
                xm.record("zero_grad")
                opt.zero_grad()
                loss.backward()
                xm.record("backward")
                run_optimizer_step(opt, opt_idx, do_nothing)
                continue
            for i, (x, y) in enumerate(chunk[:-1]):
                training_step_and_backward(opt, x, y, first=(i == 0))
            x, y = chunk[-1]

            def closure(opt=opt, group=group, x=x, y=y):
                loss = training_step_and_backward(opt, x, y, first=(accumulate == 1))
                if scenario.get("clip"):
                    torch.nn.utils.clip_grad_norm_(group, scenario["clip"])
                return loss

            run_optimizer_step(opt, opt_idx, closure)
        trajectory.append(harness.flat(params))
    return trajectory


def _optimizer_step_of_release(layers, opts):
    """``step(optimizer, optimizer_idx, closure)``: the installed method that hands the closure to torch_xla.

    PL 1.2-1.4: ``TPUAccelerator.run_optimizer_step``. PL 1.0.x: the default
    ``LightningModule.optimizer_step`` hook, as those releases' TPU accelerator calls it (``on_tpu=True``).
    PL 1.1.x: ``LightningOptimizer.__optimizer_step``, which the default hook and overrides reach through
    ``optimizer.step(closure=...)``, with a CPU Trainer told it is on TPU and holding the module whose
    zero_grad hooks follow the step.
    """
    if PL_RELEASE >= Version("1.2"):
        module = importlib.import_module(pl.__name__ + ".accelerators.tpu")
        return module.TPUAccelerator.__new__(module.TPUAccelerator).run_optimizer_step
    import torch

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(layers)

    model = Module()
    if PL_RELEASE < Version("1.1"):
        def module_hook(opt, opt_idx, closure):
            model.optimizer_step(epoch=0, batch_idx=0, optimizer=opt, optimizer_idx=opt_idx,
                                 optimizer_closure=closure, on_tpu=True, using_native_amp=False, using_lbfgs=False)
        return module_hook
    trainer = pl.Trainer(max_epochs=1, logger=False, checkpoint_callback=False)
    trainer.model, trainer.on_tpu, trainer.optimizers = model, True, list(opts)
    model.trainer = trainer
    lightning_optimizers = []
    for opt in opts:
        lightning_optimizer = pl.core.optimizer.LightningOptimizer(opt)
        lightning_optimizer._on_trainer_init(trainer)
        lightning_optimizers.append(lightning_optimizer)

    def lightning_optimizer_step(opt, opt_idx, closure):
        # the private method LightningOptimizer.step calls once it decided to step (the trainer is held here)
        getattr(lightning_optimizers[opt_idx], "_LightningOptimizer__optimizer_step")(
            closure=closure, profiler_name="optimizer_step_and_closure_%d" % opt_idx)
    lightning_optimizer_step.trainer = trainer  # LightningOptimizer holds only a weak proxy of it
    return lightning_optimizer_step


# --------------------------------------------------------------------------- Lite / Fabric
def _ToFloat():
    import torch

    class ToFloat(torch.nn.Module):
        def forward(self, x):
            return x.to(torch.float32)

    return ToFloat()


def run_lite(scenario, rank, world, harness):
    """Lite/Fabric loop: ``optimizer.step(closure)`` (or backward then ``optimizer.step()``)."""
    import torch
    from support import xla_standin as xm

    kind, module = lite
    precision = make_precision("lite", bf16=scenario.get("bf16", False))
    trajectory = []
    use_closure = scenario.get("closure", True)

    def loop(runner):
        layers = harness.make_layers(scenario)
        # _ToFloat: a bf16 plugin converts the (bf16-exact) inputs to bfloat16; the fp32 layers take them back.
        model = torch.nn.Sequential(_ToFloat(), layers[0], torch.nn.Tanh(), layers[1])
        opt = harness.make_optimizer(scenario["optimizer"], model.parameters())
        after_each_step(opt, lambda: xm.record("step"))
        model, opt = runner.setup(model, opt)
        for x, y in harness.batches(rank, scenario["steps"], 1, scenario.get("bf16", False)):
            def closure(x=x, y=y):
                xm.record("zero_grad")
                opt.zero_grad()
                xm.record("forward")
                loss = torch.nn.functional.mse_loss(model(x), y)
                runner.backward(loss)
                xm.record("backward")
                return loss

            if use_closure:
                opt.step(closure)
            else:
                closure()
                opt.step()
            trajectory.append(harness.flat(list(model.parameters())))
            synccheck_step(scenario, model, len(trajectory))

    if kind == "fabric":
        fabric = module.Fabric(accelerator="cpu", devices=1, plugins=[precision])
        loop(fabric)
    else:
        base = module.LightningLite

        class Runner(base):
            def run(self):
                loop(self)

        Runner(accelerator="cpu", devices=1, plugins=[precision]).run()
    return trajectory


# --------------------------------------------------------------------------- SyncCheck (issue #5)
# Optional scenario key ``"synccheck": N``: the Trainer gets a tpu_closure_fix.SyncCheck(every=N)
# callback, the Lite/Fabric loop calls tpu_closure_fix.check_sync(model, step, every=N) after each
# step. Every check's report and every warning message go to ``synccheck_results()`` (the callback's reports
# are read from the callback: it starts a fresh list at every ``fit``).
_synccheck = {"reports": [], "warnings": [], "callback": None}


def _synccheck_divergence(report):
    import warnings

    from tpu_closure_fix.config import TPUClosureFixWarning

    _synccheck["warnings"].append(report.message())
    warnings.warn(report.message(), TPUClosureFixWarning)


def synccheck_callbacks(scenario):
    _synccheck["reports"], _synccheck["warnings"], _synccheck["callback"] = [], [], None
    if not scenario.get("synccheck"):
        return []
    from tpu_closure_fix import synccheck

    callback = synccheck.SyncCheck(every=scenario["synccheck"], on_divergence=_synccheck_divergence)
    _synccheck["callback"] = callback
    return [callback]


def synccheck_step(scenario, model, step):
    if step == 1:
        _synccheck["reports"], _synccheck["warnings"], _synccheck["callback"] = [], [], None
    if not scenario.get("synccheck"):
        return
    from tpu_closure_fix import synccheck

    report = synccheck.check_sync(model, step, every=scenario["synccheck"], on_divergence=_synccheck_divergence)
    if report is not None:
        _synccheck["reports"].append(report)


def synccheck_results():
    callback = _synccheck["callback"]
    reports = callback.reports if callback is not None else _synccheck["reports"]
    return {"reports": [r.as_dict() for r in reports], "warnings": list(_synccheck["warnings"])}

"""The Lightning integration: every Lightning TPU optimizer-step variant, as data.

One row per variant (pytorch-lightning, lightning, lightning-lite,
lightning-fabric), grouped by call-site family. The core
(:mod:`tpu_closure_fix.engine`) is generic over these rows; supporting a new
release is one row here plus its matrix target.

Row fields: see :class:`tpu_closure_fix.sites.CallSite`. Here ``package`` is the
top-level package, or a sub-package of the unified ``lightning`` distribution
(``lightning.pytorch``...), whose release is ``lightning.__version__``.
"""
import sys

from ...shape import Shape
from ...sites import NotAffected, fingerprint_table, make_site
from .fixes import AcceleratorStepFix, LightningOptimizerFix, LiteClosureFix, ModuleHookFix, TrainerClosureFix

NAME = "lightning"
#: Top-level packages whose import arms the start-up watcher.
PACKAGES = frozenset(("pytorch_lightning", "lightning", "lightning_lite", "lightning_fabric"))



#: Code fingerprints (:mod:`tpu_closure_fix.identity`) of each fixed row's known code: one
#: ``(release, fingerprint)`` pair per distinct code, named by the newest release that has it.
#: Measured from the released wheels by ``python scripts/fingerprints.py`` (every release of each
#: range; docs/fingerprints.json holds them per release); a test checks them against that file and,
#: in the release matrix, against the loaded code.
FINGERPRINTS = fingerprint_table("""
pl-1.0.4              1.0.4=sha256:7e20882947495f3d  1.0.6=sha256:531ec17e9e44ee1b
pl-1.0.7              1.0.8=sha256:1091ba501fc27f9c
pl-1.1.0              1.1.3=sha256:a85b0436d8ac616e
pl-1.1.4              1.1.8=sha256:bf07531de89760f2
pl-1.2.0              1.2.2=sha256:b45ca96081378e9d
pl-1.2.3              1.2.7=sha256:219d54974ee7349e
pl-1.2.8              1.2.10=sha256:5a1a985b8d6b3495
pl-1.3                1.3.8=sha256:268bb6f7cc0a9f29
pl-1.4                1.4.9=sha256:268bb6f7cc0a9f29
pl-1.5                1.5.10.post0=sha256:901aededd375c714
pl-1.6                1.6.4=sha256:57954283a281a8cd  1.6.5.post0=sha256:eb84e582c74f60d2
pl-1.7                1.7.7=sha256:6e820f3821fdc03c
pl-1.8                1.8.6=sha256:d6b09a497b671e1e
lightning-1.8         1.8.6=sha256:d6b09a497b671e1e
lite-1.8              1.8.6=sha256:7f423218dcd724d6
lightning-lite-1.8    1.8.6=sha256:7f423218dcd724d6
fabric-1.9            2.0.9=sha256:7f423218dcd724d6
lightning-fabric-1.9  2.0.0=sha256:7f423218dcd724d6
fabric-2.1            2.1.4=sha256:6dbeb102b5d4fecd  2.6.6=sha256:9133ab807b8a63a7
lightning-fabric-2.1  2.1.0=sha256:6dbeb102b5d4fecd  2.6.6=sha256:9133ab807b8a63a7
# Upstream-fixed code: a release past the newest verified one is "fixed upstream" only when identical.
pl-1.9                1.9.5=sha256:64cff128118197f3
pl-2.0                2.0.9=sha256:9f9c801172a2140a
pl-2.1.1+             2.6.6=sha256:5fc7a46a99caed8b
lightning-2.1.1+      2.6.6=sha256:5fc7a46a99caed8b
""")


def _site(variant, package, distribution, module, qualname, releases, shape=None, fix=None, inherits=None,
          note=""):
    return make_site(variant, NAME, package, distribution, module, qualname, releases, shape, fix, inherits,
                     fingerprints=FINGERPRINTS.get(variant, ()), note=note)


# --- shapes ------------------------------------------------------------------
# The buggy call is ``xm.optimizer_step(optimizer, ..., optimizer_args=...)``;
# an upstream-fixed body calls ``_tpu_wrap_closure``/``_xla_wrap_closure`` and
# ``mark_step`` and never ``optimizer_args``.
_BUGGY = ("optimizer_step", "optimizer_args")
_NOT_FIXED = ("reduce_gradients", "mark_step", "_tpu_wrap_closure", "_xla_wrap_closure")

# PL 1.0.4-1.0.6: the default hook, every argument positional; 1.0.7-1.0.8: ``*args`` then keyword-only
# arguments and ``**kwargs`` (no positional parameter but ``self``: the names are read from the code).
MODULE_HOOK_POSITIONAL = Shape(
    ("epoch", "batch_idx", "optimizer", "optimizer_idx", "optimizer_closure", "on_tpu", "using_native_amp",
     "using_lbfgs"),
    varkw=False,
    requires=_BUGGY + ("optimizer_closure", "on_tpu"),
    forbids=_NOT_FIXED,
)
MODULE_HOOK_KEYWORDS = Shape(
    (),
    requires=_BUGGY + ("args", "kwargs", "optimizer", "optimizer_closure", "on_tpu"),
    forbids=_NOT_FIXED,
)
# PL 1.1: ``LightningOptimizer.__optimizer_step(self, *args, closure=None, profiler_name=None, **kwargs)``; the
# fix also runs what follows the step (the zero_grad hooks), so their names are part of the shape.
LIGHTNING_OPTIMIZER_1_1 = Shape(
    (),
    requires=_BUGGY + ("args", "kwargs", "closure", "profiler_name", "on_tpu", "_optimizer", "_optimizer_idx",
                       "get_model", "profiler", "rpc_enabled", "on_before_zero_grad", "optimizer_zero_grad"),
    forbids=_NOT_FIXED,
)
ACCELERATOR_1_2 = Shape(
    ("optimizer", "optimizer_idx", "lambda_closure"),
    requires=_BUGGY + ("closure", "lambda_closure"),
    forbids=_NOT_FIXED,
)
ACCELERATOR_1_2_BARRIER = Shape(
    ("optimizer", "optimizer_idx", "lambda_closure"),
    requires=_BUGGY + ("closure", "lambda_closure", "barrier"),
    forbids=_NOT_FIXED,
)
TRAINER_MODEL_FIRST = Shape(  # PL 1.5-1.7: (model, optimizer, optimizer_idx, closure)
    ("model", "optimizer", "optimizer_idx", "closure"),
    requires=_BUGGY + ("closure", "_wrap_closure", "LightningModule"),
    forbids=_NOT_FIXED,
)
TRAINER_OPTIMIZER_FIRST = Shape(  # PL 1.8: (optimizer, model, optimizer_idx, closure)
    ("optimizer", "model", "optimizer_idx", "closure"),
    requires=_BUGGY + ("closure", "_wrap_closure"),
    forbids=_NOT_FIXED,
)
# The upstream fix's order lives in its helper: the closure runs, then the gradients are reduced.
_TPU_HELPER_ORDER = (("_tpu_wrap_closure", ("closure", "reduce_gradients")),)
_XLA_HELPER_ORDER = (("_xla_wrap_closure", ("closure", "reduce_gradients")),)
FIXED_1_9 = Shape(
    ("optimizer", "model", "optimizer_idx", "closure"),
    requires=("_tpu_wrap_closure", "_wrap_closure", "mark_step"),
    forbids=("optimizer_args",),
    helpers=_TPU_HELPER_ORDER,
)
FIXED_2_0 = Shape(
    ("optimizer", "model", "closure"),
    requires=("_tpu_wrap_closure", "_wrap_closure", "mark_step"),
    forbids=("optimizer_args",),
    helpers=_TPU_HELPER_ORDER,
)
FIXED_2_1 = Shape(
    ("optimizer", "model", "closure"),
    requires=("_xla_wrap_closure", "_wrap_closure", "mark_step"),
    forbids=("optimizer_args",),
    helpers=_XLA_HELPER_ORDER,
)
LITE = Shape(("optimizer",), requires=_BUGGY, forbids=_NOT_FIXED + ("barrier",))
LITE_BARRIER = Shape(("optimizer",), requires=_BUGGY + ("barrier",), forbids=_NOT_FIXED)

# --- fixes -------------------------------------------------------------------
MODULE_HOOK = ModuleHookFix()
LIGHTNING_OPTIMIZER_1_1_0 = LightningOptimizerFix(hook_gets_wrapper=True)  # on_before_zero_grad(self)
LIGHTNING_OPTIMIZER_1_1_4 = LightningOptimizerFix(hook_gets_wrapper=False)  # on_before_zero_grad(optimizer)
ACCELERATOR = AcceleratorStepFix()
TRAINER_1_5 = TrainerClosureFix(returns_result=False, lite_when_not_lightning_module=True)
TRAINER_1_6 = TrainerClosureFix(returns_result=True, lite_when_not_lightning_module=True)
TRAINER_1_8 = TrainerClosureFix(returns_result=True, lite_when_not_lightning_module=False)
LITE_FIX = LiteClosureFix(barrier=False)
FABRIC_XLA_FIX = LiteClosureFix(barrier=True)

PL = "pytorch-lightning"
PL_TPU = "pytorch_lightning.plugins.precision.tpu"
PL_BF16 = "pytorch_lightning.plugins.precision.tpu_bf16"
PL_XLA = "pytorch_lightning.plugins.precision.xla"
L_TPU = "lightning.pytorch.plugins.precision.tpu"
L_BF16 = "lightning.pytorch.plugins.precision.tpu_bf16"
L_XLA = "lightning.pytorch.plugins.precision.xla"
RUN_STEP = "TPUAccelerator.run_optimizer_step"
PLUGIN_STEP = "TPUPrecisionPlugin.optimizer_step"
BF16_PLUGIN_STEP = "TPUBf16PrecisionPlugin.optimizer_step"
LITE_STEP = "TPUPrecision.optimizer_step"
LITE_BF16_STEP = "TPUBf16Precision.optimizer_step"
XLA_STEP = "XLAPrecision.optimizer_step"
ACC = "pytorch_lightning.accelerators.tpu"

PL_CORE = "pytorch_lightning.core.lightning"
PL_OPTIMIZER = "pytorch_lightning.core.optimizer"
MODULE_STEP = "LightningModule.optimizer_step"
LIGHTNING_OPTIMIZER_STEP = "LightningOptimizer._LightningOptimizer__optimizer_step"

CALL_SITES = (
    # ---- Trainer, pytorch-lightning 1.0.4-1.0.8: the default LightningModule.optimizer_step hook (1.0.0-1.0.3
    #      step after the loop's own backward, without a closure: not affected, no row)
    _site("pl-1.0.4", "pytorch_lightning", PL, PL_CORE, MODULE_STEP, ">=1.0.4,<1.0.7", MODULE_HOOK_POSITIONAL,
          MODULE_HOOK, note="the default hook only: an override that steps the optimizer itself is not covered"),
    _site("pl-1.0.7", "pytorch_lightning", PL, PL_CORE, MODULE_STEP, ">=1.0.7,<1.1.0", MODULE_HOOK_KEYWORDS,
          MODULE_HOOK, note="the default hook only: an override that steps the optimizer itself is not covered"),
    # ---- Trainer, pytorch-lightning 1.1: LightningOptimizer, reached by the default hook and by overrides
    _site("pl-1.1.0", "pytorch_lightning", PL, PL_OPTIMIZER, LIGHTNING_OPTIMIZER_STEP, ">=1.1.0,<1.1.4",
          LIGHTNING_OPTIMIZER_1_1, LIGHTNING_OPTIMIZER_1_1_0),
    _site("pl-1.1.4", "pytorch_lightning", PL, PL_OPTIMIZER, LIGHTNING_OPTIMIZER_STEP, ">=1.1.4,<1.2.0",
          LIGHTNING_OPTIMIZER_1_1, LIGHTNING_OPTIMIZER_1_1_4),
    # ---- Trainer, pytorch-lightning 1.2-1.4: TPUAccelerator.run_optimizer_step
    _site("pl-1.2.0", "pytorch_lightning", PL, ACC, RUN_STEP, ">=1.2.0,<1.2.3", ACCELERATOR_1_2, ACCELERATOR),
    _site("pl-1.2.3", "pytorch_lightning", PL, ACC, RUN_STEP, ">=1.2.3,<1.2.8", ACCELERATOR_1_2_BARRIER, ACCELERATOR),
    _site("pl-1.2.8", "pytorch_lightning", PL, ACC, RUN_STEP, ">=1.2.8,<1.3.0", ACCELERATOR_1_2_BARRIER, ACCELERATOR),
    _site("pl-1.3", "pytorch_lightning", PL, ACC, RUN_STEP, ">=1.3.0,<1.4.0", ACCELERATOR_1_2, ACCELERATOR),
    _site("pl-1.4", "pytorch_lightning", PL, ACC, RUN_STEP, ">=1.4.0,<1.5.0", ACCELERATOR_1_2, ACCELERATOR),
    # ---- Trainer (and LightningLite 1.5-1.7), pytorch-lightning 1.5-1.8: TPUPrecisionPlugin.optimizer_step
    _site("pl-1.5", "pytorch_lightning", PL, PL_TPU, PLUGIN_STEP, ">=1.5.0,<1.6.0", TRAINER_MODEL_FIRST, TRAINER_1_5,
          note="also LightningLite"),
    _site("pl-1.6", "pytorch_lightning", PL, PL_TPU, PLUGIN_STEP, ">=1.6.0,<1.7.0", TRAINER_MODEL_FIRST, TRAINER_1_6,
          note="also LightningLite"),
    _site("pl-1.7", "pytorch_lightning", PL, PL_TPU, PLUGIN_STEP, ">=1.7.0,<1.8.0", TRAINER_MODEL_FIRST, TRAINER_1_6,
          note="also LightningLite"),
    _site("pl-1.8", "pytorch_lightning", PL, PL_TPU, PLUGIN_STEP, ">=1.8.0,<1.9.0", TRAINER_OPTIMIZER_FIRST, TRAINER_1_8),
    _site("lightning-1.8", "lightning.pytorch", "lightning", L_TPU, PLUGIN_STEP, ">=1.8.0,<1.9.0",
          TRAINER_OPTIMIZER_FIRST, TRAINER_1_8),
    # bf16 subclasses inherit optimizer_step: covered by the base patch.
    _site("pl-bf16", "pytorch_lightning", PL, PL_BF16, BF16_PLUGIN_STEP, ">=1.5.0,<1.9.0", inherits=PLUGIN_STEP),
    _site("lightning-bf16", "lightning.pytorch", "lightning", L_BF16, BF16_PLUGIN_STEP, ">=1.8.0,<1.9.0",
          inherits=PLUGIN_STEP),
    # ---- Trainer, fixed upstream (verified, never touched)
    _site("pl-1.9", "pytorch_lightning", PL, PL_TPU, PLUGIN_STEP, ">=1.9.0,<2.0.0", FIXED_1_9),
    _site("lightning-1.9", "lightning.pytorch", "lightning", L_TPU, PLUGIN_STEP, ">=1.9.0,<2.0.0", FIXED_1_9),
    _site("pl-2.0", "pytorch_lightning", PL, PL_TPU, PLUGIN_STEP, ">=2.0.0,<2.1.0", FIXED_2_0),
    _site("lightning-2.0", "lightning.pytorch", "lightning", L_TPU, PLUGIN_STEP, ">=2.0.0,<2.1.0", FIXED_2_0),
    _site("pl-bf16-fixed", "pytorch_lightning", PL, PL_BF16, BF16_PLUGIN_STEP, ">=1.9.0,<2.1.0", inherits=PLUGIN_STEP),
    _site("lightning-bf16-fixed", "lightning.pytorch", "lightning", L_BF16, BF16_PLUGIN_STEP, ">=1.9.0,<2.1.0",
          inherits=PLUGIN_STEP),
    _site("pl-2.1.0", "pytorch_lightning", PL, PL_XLA, "XLAPrecisionPlugin.optimizer_step", ">=2.1.0,<2.1.1",
          FIXED_2_1),
    _site("lightning-2.1.0", "lightning.pytorch", "lightning", L_XLA, "XLAPrecisionPlugin.optimizer_step",
          ">=2.1.0,<2.1.1", FIXED_2_1),
    # Capped at the newest verified release: a newer one is "fixed upstream" only when its code is identical
    # to 2.6.6's (fingerprint), else "skipped (unknown release: not verified)". Names never decide it.
    _site("pl-2.1.1+", "pytorch_lightning", PL, PL_XLA, XLA_STEP, ">=2.1.1,<2.6.7", FIXED_2_1,
          note="newer releases: only code identical to 2.6.6"),
    _site("lightning-2.1.1+", "lightning.pytorch", "lightning", L_XLA, XLA_STEP, ">=2.1.1,<2.6.7", FIXED_2_1,
          note="newer releases: only code identical to 2.6.6"),
    # ---- Lite, 1.8.x: standalone lightning-lite, the copy vendored in pytorch-lightning 1.8, lightning.lite
    _site("lite-1.8", "lightning_lite", "lightning-lite | pytorch-lightning (vendored)",
          "lightning_lite.plugins.precision.tpu", LITE_STEP, ">=1.8.0,<1.9.0", LITE, LITE_FIX),
    _site("lite-1.8-bf16", "lightning_lite", "lightning-lite | pytorch-lightning (vendored)",
          "lightning_lite.plugins.precision.tpu_bf16", LITE_BF16_STEP, ">=1.8.0,<1.9.0", inherits=LITE_STEP),
    _site("lightning-lite-1.8", "lightning.lite", "lightning", "lightning.lite.plugins.precision.tpu", LITE_STEP,
          ">=1.8.0,<1.9.0", LITE, LITE_FIX),
    _site("lightning-lite-1.8-bf16", "lightning.lite", "lightning", "lightning.lite.plugins.precision.tpu_bf16",
          LITE_BF16_STEP, ">=1.8.0,<1.9.0", inherits=LITE_STEP),
    # ---- Fabric 1.9-2.0: standalone lightning-fabric, vendored in pytorch-lightning, lightning.fabric
    _site("fabric-1.9", "lightning_fabric", "lightning-fabric | pytorch-lightning (vendored)",
          "lightning_fabric.plugins.precision.tpu", LITE_STEP, ">=1.9.0,<2.1.0", LITE, LITE_FIX),
    _site("fabric-1.9-bf16", "lightning_fabric", "lightning-fabric | pytorch-lightning (vendored)",
          "lightning_fabric.plugins.precision.tpu_bf16", LITE_BF16_STEP, ">=1.9.0,<2.1.0", inherits=LITE_STEP),
    _site("lightning-fabric-1.9", "lightning.fabric", "lightning", "lightning.fabric.plugins.precision.tpu",
          LITE_STEP, ">=1.9.0,<2.1.0", LITE, LITE_FIX),
    _site("lightning-fabric-1.9-bf16", "lightning.fabric", "lightning",
          "lightning.fabric.plugins.precision.tpu_bf16", LITE_BF16_STEP, ">=1.9.0,<2.1.0", inherits=LITE_STEP),
    # ---- Fabric 2.1-2.6.6: XLAPrecision, barrier=True
    _site("fabric-2.1", "lightning_fabric", "lightning-fabric | pytorch-lightning (vendored)",
          "lightning_fabric.plugins.precision.xla", XLA_STEP, ">=2.1.0,<2.6.7", LITE_BARRIER, FABRIC_XLA_FIX),
    _site("lightning-fabric-2.1", "lightning.fabric", "lightning", "lightning.fabric.plugins.precision.xla",
          XLA_STEP, ">=2.1.0,<2.6.7", LITE_BARRIER, FABRIC_XLA_FIX),
)


#: LightningModule.optimizer_step outside 1.0.4-1.0.8, read in every release 0.2-1.0.3 and 1.1.0-1.1.8:
#: "not in this release" while it holds no ``optimizer_args`` (the source scan, verify/scan.py, still searches
#: the rest of the package).
NOT_AFFECTED = (
    NotAffected("pytorch_lightning", PL_CORE, MODULE_STEP, "<1.0.4", ("optimizer_args",),
                "not affected: the hook steps after the loop's forward and backward, "
                "xm.optimizer_step with no closure"),
    NotAffected("pytorch_lightning", PL_CORE, MODULE_STEP, ">=1.1.0", ("optimizer_args",),
                "the hook calls optimizer.step(closure=...); the XLA step is in another site of the table"),
)


#: Where the Trainer class lives, for the late-enable check below.
_TRAINER_MODULES = ("pytorch_lightning.trainer.trainer", "lightning.pytorch.trainer.trainer")


def late_enable_warning():
    """Enabled after Lightning was imported: a message if a live Trainer has already stepped unfixed.

    Looks only at instances of the loaded Trainer classes (and their subclasses), found
    with ``gc.get_referrers`` (an instance of a heap type refers to its class), which runs
    in C: a Python loop over ``gc.get_objects()`` cost about 80 ms with torch loaded.
    A Trainer is held in reference cycles, so one the program has dropped stays findable
    until the collector happens to run: whether it counted would depend on allocation
    timing. Only live Trainers count: when the scan finds a stepped one, a full
    collection runs (once, only then) and the scan is repeated.
    """
    import gc

    classes, todo = [], [getattr(sys.modules.get(name), "Trainer", None) for name in _TRAINER_MODULES]
    while todo:
        cls = todo.pop()
        if isinstance(cls, type) and cls not in classes:
            classes.append(cls)
            todo.extend(cls.__subclasses__())
    if not classes:
        return None
    classes = tuple(classes)
    if _stepped_trainer(gc.get_referrers(*classes), classes) is None:
        return None
    gc.collect()
    trainer = _stepped_trainer(gc.get_referrers(*classes), classes)
    if trainer is None:
        return None
    return ("tpu-closure-fix was enabled after a Trainer had already taken %d optimizer step(s) with the "
            "unfixed code; those steps were not reduced correctly. Import tpu_closure_fix before training "
            "starts." % trainer.global_step)


def _stepped_trainer(referrers, classes):
    """The first Trainer among ``referrers`` whose global_step is not zero, else None."""
    for obj in referrers:
        if isinstance(obj, classes) and getattr(obj, "global_step", 0):
            return obj
    return None


_CALLBACK_PACKAGES = ("pytorch_lightning", "lightning.pytorch")
def callback_bases():
    """For SyncCheck: Callback classes of the Lightning trainers already imported (both, when both are), else of the
    first importable one: the callback then passes the isinstance check of whichever Trainer is used."""
    bases = []
    for name in _CALLBACK_PACKAGES:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "Callback", None) is not None:
            bases.append(module.Callback)
    if not bases:
        import importlib

        for name in _CALLBACK_PACKAGES:
            try:
                bases.append(importlib.import_module(name).Callback)
                break
            except ImportError:
                continue
    if not bases:
        raise ImportError("SyncCheck needs pytorch_lightning or lightning (for Lite/Fabric loops use "
                          "tpu_closure_fix.check_sync)")
    return tuple(bases)

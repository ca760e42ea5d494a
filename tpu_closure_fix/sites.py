"""The call-site table: every Lightning TPU optimizer-step variant, as data.

One row per variant (see shared research CALLSITES.md; its row number is kept in
``callsites_row``). Everything else -- the patch engine, ``status()``, the CLI,
the README support table and the release-matrix tests -- is generic over this
table. Supporting a new release is one row here plus its matrix target.

Row fields:

* ``package``: the package whose release governs the row. It is the top-level
  package, or a sub-package of the unified ``lightning`` distribution
  (``lightning.pytorch``...), whose release is ``lightning.__version__``.
* ``distribution``: who ships that code, for reports.
* ``module`` / ``qualname``: where the method lives.
* ``releases``: PEP 440 specifier of the releases this row was checked against.
  A release outside every row of its package is *unknown* and never patched.
* ``shape``: the expected code shape (:mod:`tpu_closure_fix.shape`).
* ``fix``: the fix strategy (:mod:`tpu_closure_fix.fixes`), or None for code
  that already carries the upstream fix (verified by ``shape``, never touched).
* ``inherits``: for subclasses (bf16 plugins) that inherit the method: the
  qualname of the base class method; they are covered by patching the base.
"""
from collections import namedtuple

from .fixes import AcceleratorStepFix, LiteClosureFix, TrainerClosureFix
from .shape import Shape

CallSite = namedtuple(
    "CallSite",
    "variant callsites_row package distribution module qualname releases shape fix inherits note",
)


def _site(variant, row, package, distribution, module, qualname, releases, shape=None, fix=None,
          inherits=None, note=""):
    return CallSite(variant, row, package, distribution, module, qualname, releases, shape, fix, inherits, note)


# --- shapes ------------------------------------------------------------------
# The buggy call is ``xm.optimizer_step(optimizer, ..., optimizer_args=...)``;
# an upstream-fixed body calls ``_tpu_wrap_closure``/``_xla_wrap_closure`` and
# ``mark_step`` and never ``optimizer_args``.
_BUGGY = ("optimizer_step", "optimizer_args")
_NOT_FIXED = ("reduce_gradients", "mark_step", "_tpu_wrap_closure", "_xla_wrap_closure")

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
FIXED_1_9 = Shape(
    ("optimizer", "model", "optimizer_idx", "closure"),
    requires=("_tpu_wrap_closure", "_wrap_closure", "mark_step"),
    forbids=("optimizer_args",),
)
FIXED_2_0 = Shape(
    ("optimizer", "model", "closure"),
    requires=("_tpu_wrap_closure", "_wrap_closure", "mark_step"),
    forbids=("optimizer_args",),
)
FIXED_2_1 = Shape(
    ("optimizer", "model", "closure"),
    requires=("_xla_wrap_closure", "_wrap_closure", "mark_step"),
    forbids=("optimizer_args",),
)
LITE = Shape(("optimizer",), requires=_BUGGY, forbids=_NOT_FIXED + ("barrier",))
LITE_BARRIER = Shape(("optimizer",), requires=_BUGGY + ("barrier",), forbids=_NOT_FIXED)

# --- fixes -------------------------------------------------------------------
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

CALL_SITES = (
    # ---- Trainer, pytorch-lightning 1.2-1.4: TPUAccelerator.run_optimizer_step
    _site("pl-1.2.0", 1, "pytorch_lightning", PL, ACC, RUN_STEP, ">=1.2.0,<1.2.3", ACCELERATOR_1_2, ACCELERATOR),
    _site("pl-1.2.3", 2, "pytorch_lightning", PL, ACC, RUN_STEP, ">=1.2.3,<1.2.8", ACCELERATOR_1_2_BARRIER, ACCELERATOR),
    _site("pl-1.2.8", 3, "pytorch_lightning", PL, ACC, RUN_STEP, ">=1.2.8,<1.3.0", ACCELERATOR_1_2_BARRIER, ACCELERATOR),
    _site("pl-1.3", 4, "pytorch_lightning", PL, ACC, RUN_STEP, ">=1.3.0,<1.4.0", ACCELERATOR_1_2, ACCELERATOR),
    _site("pl-1.4", 5, "pytorch_lightning", PL, ACC, RUN_STEP, ">=1.4.0,<1.5.0", ACCELERATOR_1_2, ACCELERATOR),
    # ---- Trainer (and LightningLite 1.5-1.7), pytorch-lightning 1.5-1.8: TPUPrecisionPlugin.optimizer_step
    _site("pl-1.5", 6, "pytorch_lightning", PL, PL_TPU, PLUGIN_STEP, ">=1.5.0,<1.6.0", TRAINER_MODEL_FIRST, TRAINER_1_5,
          note="also LightningLite (row 15)"),
    _site("pl-1.6", 7, "pytorch_lightning", PL, PL_TPU, PLUGIN_STEP, ">=1.6.0,<1.7.0", TRAINER_MODEL_FIRST, TRAINER_1_6,
          note="also LightningLite (row 15)"),
    _site("pl-1.7", 8, "pytorch_lightning", PL, PL_TPU, PLUGIN_STEP, ">=1.7.0,<1.8.0", TRAINER_MODEL_FIRST, TRAINER_1_6,
          note="also LightningLite (row 15)"),
    _site("pl-1.8", 9, "pytorch_lightning", PL, PL_TPU, PLUGIN_STEP, ">=1.8.0,<1.9.0", TRAINER_OPTIMIZER_FIRST, TRAINER_1_8),
    _site("lightning-1.8", 9, "lightning.pytorch", "lightning", L_TPU, PLUGIN_STEP, ">=1.8.0,<1.9.0",
          TRAINER_OPTIMIZER_FIRST, TRAINER_1_8),
    # bf16 subclasses inherit optimizer_step: covered by the base patch.
    _site("pl-bf16", 6, "pytorch_lightning", PL, PL_BF16, BF16_PLUGIN_STEP, ">=1.5.0,<1.9.0", inherits=PLUGIN_STEP),
    _site("lightning-bf16", 9, "lightning.pytorch", "lightning", L_BF16, BF16_PLUGIN_STEP, ">=1.8.0,<1.9.0",
          inherits=PLUGIN_STEP),
    # ---- Trainer, fixed upstream (verified, never touched)
    _site("pl-1.9", 10, "pytorch_lightning", PL, PL_TPU, PLUGIN_STEP, ">=1.9.0,<2.0.0", FIXED_1_9),
    _site("lightning-1.9", 10, "lightning.pytorch", "lightning", L_TPU, PLUGIN_STEP, ">=1.9.0,<2.0.0", FIXED_1_9),
    _site("pl-2.0", 11, "pytorch_lightning", PL, PL_TPU, PLUGIN_STEP, ">=2.0.0,<2.1.0", FIXED_2_0),
    _site("lightning-2.0", 11, "lightning.pytorch", "lightning", L_TPU, PLUGIN_STEP, ">=2.0.0,<2.1.0", FIXED_2_0),
    _site("pl-bf16-fixed", 10, "pytorch_lightning", PL, PL_BF16, BF16_PLUGIN_STEP, ">=1.9.0,<2.1.0", inherits=PLUGIN_STEP),
    _site("lightning-bf16-fixed", 10, "lightning.pytorch", "lightning", L_BF16, BF16_PLUGIN_STEP, ">=1.9.0,<2.1.0",
          inherits=PLUGIN_STEP),
    _site("pl-2.1.0", 12, "pytorch_lightning", PL, PL_XLA, "XLAPrecisionPlugin.optimizer_step", ">=2.1.0,<2.1.1",
          FIXED_2_1),
    _site("lightning-2.1.0", 12, "lightning.pytorch", "lightning", L_XLA, "XLAPrecisionPlugin.optimizer_step",
          ">=2.1.0,<2.1.1", FIXED_2_1),
    _site("pl-2.1.1+", 13, "pytorch_lightning", PL, PL_XLA, XLA_STEP, ">=2.1.1", FIXED_2_1,
          note="rows 13-14; open-ended: the shape check still verifies the fix"),
    _site("lightning-2.1.1+", 13, "lightning.pytorch", "lightning", L_XLA, XLA_STEP, ">=2.1.1", FIXED_2_1,
          note="rows 13-14; open-ended: the shape check still verifies the fix"),
    # ---- Lite, 1.8.x: standalone lightning-lite, the copy vendored in pytorch-lightning 1.8, lightning.lite
    _site("lite-1.8", 16, "lightning_lite", "lightning-lite | pytorch-lightning (vendored)",
          "lightning_lite.plugins.precision.tpu", LITE_STEP, ">=1.8.0,<1.9.0", LITE, LITE_FIX),
    _site("lite-1.8-bf16", 16, "lightning_lite", "lightning-lite | pytorch-lightning (vendored)",
          "lightning_lite.plugins.precision.tpu_bf16", LITE_BF16_STEP, ">=1.8.0,<1.9.0", inherits=LITE_STEP),
    _site("lightning-lite-1.8", 16, "lightning.lite", "lightning", "lightning.lite.plugins.precision.tpu", LITE_STEP,
          ">=1.8.0,<1.9.0", LITE, LITE_FIX),
    _site("lightning-lite-1.8-bf16", 16, "lightning.lite", "lightning", "lightning.lite.plugins.precision.tpu_bf16",
          LITE_BF16_STEP, ">=1.8.0,<1.9.0", inherits=LITE_STEP),
    # ---- Fabric 1.9-2.0: standalone lightning-fabric, vendored in pytorch-lightning, lightning.fabric
    _site("fabric-1.9", 17, "lightning_fabric", "lightning-fabric | pytorch-lightning (vendored)",
          "lightning_fabric.plugins.precision.tpu", LITE_STEP, ">=1.9.0,<2.1.0", LITE, LITE_FIX),
    _site("fabric-1.9-bf16", 17, "lightning_fabric", "lightning-fabric | pytorch-lightning (vendored)",
          "lightning_fabric.plugins.precision.tpu_bf16", LITE_BF16_STEP, ">=1.9.0,<2.1.0", inherits=LITE_STEP),
    _site("lightning-fabric-1.9", 17, "lightning.fabric", "lightning", "lightning.fabric.plugins.precision.tpu",
          LITE_STEP, ">=1.9.0,<2.1.0", LITE, LITE_FIX),
    _site("lightning-fabric-1.9-bf16", 17, "lightning.fabric", "lightning",
          "lightning.fabric.plugins.precision.tpu_bf16", LITE_BF16_STEP, ">=1.9.0,<2.1.0", inherits=LITE_STEP),
    # ---- Fabric 2.1-2.6.6: XLAPrecision, barrier=True
    _site("fabric-2.1", 18, "lightning_fabric", "lightning-fabric | pytorch-lightning (vendored)",
          "lightning_fabric.plugins.precision.xla", XLA_STEP, ">=2.1.0,<2.6.7", LITE_BARRIER, FABRIC_XLA_FIX),
    _site("lightning-fabric-2.1", 18, "lightning.fabric", "lightning", "lightning.fabric.plugins.precision.xla",
          XLA_STEP, ">=2.1.0,<2.6.7", LITE_BARRIER, FABRIC_XLA_FIX),
)


def site_key(site):
    return site.module, site.qualname


def site_keys():
    """Distinct (module, qualname) pairs, in table order."""
    seen = []
    for site in CALL_SITES:
        key = site_key(site)
        if key not in seen:
            seen.append(key)
    return seen


def rows_for(module, qualname=None):
    return [s for s in CALL_SITES if s.module == module and (qualname is None or s.qualname == qualname)]


def module_names():
    """Modules the engine watches, in table order."""
    names = []
    for site in CALL_SITES:
        if site.module not in names:
            names.append(site.module)
    return names


def top_level_packages():
    return frozenset(site.package.split(".")[0] for site in CALL_SITES)

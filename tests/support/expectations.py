"""Ground truth the tests hold the shim to, written from Lightning's history, not from sites.py.

* The Trainer's TPU path reduces before the closure in every pytorch-lightning
  (and lightning.pytorch) release before 1.9.0; 1.9.0 fixed it.
* Lite (PL 1.5-1.7 LightningLite, lightning-lite 1.8) and Fabric (through 2.6.6)
  reduce before a user closure passed to ``optimizer.step(closure)`` in every
  release.
* torch_xla's ``xm.optimizer_step`` reduces, then calls
  ``optimizer.step(**optimizer_args)``: a closure passed there runs after the
  reduction, in every release (a plain loop is affected whatever framework is
  installed).
"""
from packaging.version import Version

TRAINER_FIXED_IN = Version("1.9.0")


def parse_target(target):
    """'pytorch-lightning==1.8.6[+wrapt==X]' -> ('pytorch-lightning', Version('1.8.6'))."""
    head = target.split("+")[0]
    dist, _, version = head.partition("==")
    return dist, Version(version)


def trainer_affected(target):
    dist, version = parse_target(target)
    return dist in ("pytorch-lightning", "lightning") and version < TRAINER_FIXED_IN


def trainer_site_carries_step(target, site):
    """Whether ``site`` ("module:Class.method" of the Trainer) is where ``target``'s Trainer hands its closure to
    torch_xla: the default ``LightningModule.optimizer_step`` hook in 1.0.x, ``LightningOptimizer`` in 1.1.x,
    the TPU accelerator or precision plugin from 1.2 (the hook and LightningOptimizer step through them there)."""
    version = parse_target(target)[1]
    hook, lightning_optimizer = site.endswith(":LightningModule.optimizer_step"), ":LightningOptimizer." in site
    if version < Version("1.1"):
        return hook
    if version < Version("1.2"):
        return lightning_optimizer
    return not (hook or lightning_optimizer)


def has_trainer(target):
    dist, _ = parse_target(target)
    return dist in ("pytorch-lightning", "lightning")


def has_lite(target):
    dist, version = parse_target(target)
    if dist in ("lightning-lite", "lightning-fabric"):
        return True
    return version >= Version("1.5")


def lite_affected(target):
    return has_lite(target)


# --------------------------------------------------------------------------- issue #3: replica scenarios
#: Every scenario the replica equivalence test knows. ``api`` picks the loop;
#: the other keys are read by support.replica / support.lightning_api.
SCENARIOS = {
    "trainer-sgd": {"api": "trainer", "optimizer": "sgd", "steps": 3},
    # clip=0.01 is far below the gradient norm of this model, so every step clips.
    "trainer-adam-clip": {"api": "trainer", "optimizer": "adam", "steps": 3, "clip": 0.01},
    "trainer-accumulate": {"api": "trainer", "optimizer": "sgd", "steps": 2, "accumulate": 2},
    "trainer-two-optimizers": {"api": "trainer", "optimizer": "sgd", "steps": 2, "two_optimizers": True},
    "trainer-manual": {"api": "trainer", "optimizer": "sgd", "steps": 2, "manual": True},
    "trainer-bf16": {"api": "trainer", "optimizer": "sgd", "steps": 2, "bf16": True},
    "lite-sgd": {"api": "lite", "optimizer": "sgd", "steps": 3},
    "lite-adam": {"api": "lite", "optimizer": "adam", "steps": 3},
    "lite-lbfgs": {"api": "lite", "optimizer": "lbfgs", "steps": 2},
    "lite-bf16": {"api": "lite", "optimizer": "sgd", "steps": 2, "bf16": True},
    # A plain PyTorch loop calling torch_xla's xm.optimizer_step(opt, optimizer_args={"closure": closure}):
    # reduce-then-step in every torch_xla release, whatever framework is installed (the torch_xla guard).
    "xla-sgd": {"api": "xla", "optimizer": "sgd", "steps": 3},
    "xla-adam": {"api": "xla", "optimizer": "adam", "steps": 3},
    # LBFGS returns each replica's local loss from the closure; its loss-based branch (tolerance_change,
    # 1e-9) takes the same turn on both replicas with this data, so they stay in lockstep.
    "xla-lbfgs": {"api": "xla", "optimizer": "lbfgs", "steps": 2},
}

#: The plain-loop scenarios test torch_xla's own function, not the Lightning release: they run on the
#: representative targets only (the main affected release, the oldest supported wrapt, the newest Fabric).
XLA_LOOP_TARGETS = ("pytorch-lightning==1.8.6", "pytorch-lightning==1.8.6+wrapt==1.14.1", "lightning-fabric==2.6.6")


def _trainer_version(target):
    dist, version = parse_target(target)
    return version if dist in ("pytorch-lightning", "lightning") else None


def _lite_version(target):
    """Release of the Lite/Fabric code the target carries (vendored copies follow the PL release)."""
    return parse_target(target)[1] if has_lite(target) else None


def scenario_names(target):
    """The scenarios that apply to ``target``, in run order, each one explicit (see not_applicable)."""
    return [name for name in SCENARIOS if name not in not_applicable(target)]


def not_applicable(target):
    """{scenario: why it does not apply to ``target``} -- nothing is skipped silently."""
    out = {}
    trainer = _trainer_version(target)
    lite = _lite_version(target)
    trainer_names = [n for n in SCENARIOS if SCENARIOS[n]["api"] == "trainer"]
    lite_names = [n for n in SCENARIOS if SCENARIOS[n]["api"] == "lite"]
    if trainer is None:
        for n in trainer_names:
            out[n] = "target has no Trainer"
    else:
        if trainer >= Version("2.0"):
            out["trainer-two-optimizers"] = "multiple optimizers under automatic optimization removed in 2.0"
        if trainer < Version("1.5"):
            out["trainer-bf16"] = ("PL < 1.5: the call site is TPUAccelerator.run_optimizer_step, the same code "
                                   "for every precision plugin (no bf16 subclass of the call site)")
        elif trainer >= Version("2.1"):
            out["trainer-bf16"] = ("PL >= 2.1: no bf16 subclass of the call site in the table; the graveyard "
                                   "bf16 classes run bf16-true (a different dtype from the fp32 reference)")
    if lite is None:
        for n in lite_names:
            out[n] = "target has no Lite/Fabric"
    elif lite >= Version("2.1"):
        out["lite-bf16"] = ("Fabric >= 2.1: no TPUBf16Precision subclass of the call site in the table; "
                            "the graveyard bf16 classes run bf16-true (a different dtype)")
    if target not in XLA_LOOP_TARGETS:
        for n in (n for n in SCENARIOS if SCENARIOS[n]["api"] == "xla"):
            out[n] = ("plain torch_xla loop: independent of the Lightning release, run on %s only"
                      % ", ".join(XLA_LOOP_TARGETS))
    return out


def scenarios(target):
    """Scenario dicts (with their ``name``) for ``target``."""
    out = []
    for name in scenario_names(target):
        scenario = dict(SCENARIOS[name], name=name)
        if scenario.get("clip") and clips_before_reduce(target):
            scenario["clip_local"] = True
        out.append(scenario)
    return out


def accelerator_path(target):
    """PL 1.2-1.4: the replica drives TPUAccelerator.run_optimizer_step directly (see lightning_api)."""
    trainer = _trainer_version(target)
    return trainer is not None and trainer < Version("1.5")


def clips_before_reduce(target):
    """PL 1.2-1.4 clip inside Lightning's closure, i.e. before the shim's reduction (FACTS.md §3).

    The shim cannot move that (a documented limitation), so for these releases the
    adam-clip scenario is compared with a reference that clips each replica's local
    gradients and then averages -- what those releases do on a correctly ordered TPU.
    """
    return accelerator_path(target)


def bug_can_occur(target, name):
    """Whether, without the shim, replicas diverge in scenario ``name`` on ``target``.

    Manual optimization: the user's backward has run before ``opt.step()``, the
    closure is a do-nothing one, so reducing before it is right: never affected.
    Trainer scenarios: affected before 1.9.0. Lite/Fabric with a closure: always.
    A plain loop passing its closure to ``xm.optimizer_step``: always.
    """
    scenario = SCENARIOS[name]
    if scenario.get("manual"):
        return False
    if scenario["api"] == "trainer":
        return trainer_affected(target)
    if scenario["api"] == "xla":
        return True  # torch_xla's optimizer_step reduces before the closure in every release
    return lite_affected(target)


#: Event-order scenarios (tests/target/test_event_order.py), run in the same replica processes as the
#: equivalence scenarios (one launch per target and shim mode).
ORDER_TRAINER = {"name": "order-trainer", "api": "trainer", "optimizer": "sgd", "steps": 2}
ORDER_LITE = [
    {"name": "order-lite", "api": "lite", "optimizer": "sgd", "steps": 2},
    {"name": "order-lbfgs", "api": "lite", "optimizer": "lbfgs", "steps": 2},
    {"name": "order-lite-no-closure", "api": "lite", "optimizer": "sgd", "steps": 2, "closure": False},
]


def order_scenarios(target):
    return ([ORDER_TRAINER] if has_trainer(target) else []) + (list(ORDER_LITE) if has_lite(target) else [])


#: SyncCheck's replica scenarios (tests/target/test_synccheck.py): a check every SYNCCHECK_EVERY of SYNCCHECK_STEPS
SYNCCHECK_EVERY = 2
SYNCCHECK_STEPS = 6


def synccheck_scenarios(target):
    """The replica scenarios with SyncCheck attached (Lightning >= 1.5): the Trainer's callback, Lite/Fabric's call."""
    out = []
    dist, version = parse_target(target)
    if has_trainer(target) and version >= Version("1.5"):
        out.append({"name": "synccheck-trainer", "api": "trainer", "optimizer": "sgd", "steps": SYNCCHECK_STEPS,
                    "synccheck": SYNCCHECK_EVERY})
    if has_lite(target):
        out.append({"name": "synccheck-lite", "api": "lite", "optimizer": "sgd", "steps": SYNCCHECK_STEPS,
                    "synccheck": SYNCCHECK_EVERY})
    return out


def all_replica_scenarios(target):
    """Everything the replica processes run for ``target``: equivalence scenarios, then event-order ones."""
    return scenarios(target) + order_scenarios(target)

"""The lifecycle contract (lifecycle_contract.py), once per site family, on the target that carries it.

Each family runs on one target: the contract exercises the patch machinery,
not the release history (the replica tests cover every release). A family
that does not apply to the target under test is not defined there at all.
"""
from conftest import TARGET, defined_where
from lifecycle_contract import LifecycleContract

PL_186 = "pytorch-lightning==1.8.6"
FABRIC = "lightning-fabric==2.6.6"


@defined_where(TARGET == PL_186)
class TestTrainerLifecycle(LifecycleContract):
    """pytorch-lightning 1.8.6 TPUPrecisionPlugin.optimizer_step, through Trainer.fit."""

    family = "trainer"


@defined_where(TARGET == PL_186)
class TestLiteLifecycle(LifecycleContract):
    """lightning-lite 1.8.6 (inside pytorch-lightning 1.8.6) TPUPrecision.optimizer_step."""

    family = "lite-1.8"


@defined_where(TARGET == FABRIC)
class TestFabricLifecycle(LifecycleContract):
    """lightning-fabric 2.6.6 XLAPrecision.optimizer_step (barrier=True)."""

    family = "fabric-xla"


@defined_where(TARGET == PL_186)
class TestTorchXlaGuardLifecycle(LifecycleContract):
    """torch_xla's xm.optimizer_step, called by a plain PyTorch loop with a closure (independent of
    the Lightning release: one target is enough)."""

    family = "guard"

"""Ground truth the tests hold the shim to, written from Lightning's history, not from sites.py.

* The Trainer's TPU path reduces before the closure in every pytorch-lightning
  (and lightning.pytorch) release before 1.9.0; 1.9.0 fixed it.
* Lite (PL 1.5-1.7 LightningLite, lightning-lite 1.8) and Fabric (through 2.6.6)
  reduce before a user closure passed to ``optimizer.step(closure)`` in every
  release.
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

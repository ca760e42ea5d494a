"""What the installed torch can do, as pytest markers: a test of a feature torch lacks is skipped, naming the torch."""
import importlib

import pytest


def has_step_hooks():
    """Whether torch has the global optimizer step hooks the zero-code SyncCheck arms (torch >= 2.0)."""
    return hasattr(importlib.import_module("torch.optim.optimizer"), "register_optimizer_step_post_hook")


def needs_step_hooks():
    """The marker of a test of the zero-code SyncCheck."""
    torch = importlib.import_module("torch")
    return pytest.mark.skipif(not has_step_hooks(), reason="the zero-code SyncCheck needs torch >= 2.0 (its global "
                                                           "step hooks); torch %s here" % torch.__version__)

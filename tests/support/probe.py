"""A real pytorch-lightning 1.8.6 Trainer on the torch_xla stand-in, for the scenario modules.

Imported by child processes only (``support.fault_scenarios``,
``support.concurrency_scenarios``, ``support.families``), never by the pytest
process: importing Lightning there would auto-enable the shim in the process
that runs the tests. Importing this module imports neither Lightning nor the
shim; each function does what it needs, when it is called, so a scenario
decides the order of imports itself.
"""
import importlib.util
import json
import os
import sys

from support.layers import depth


MODULE = "pytorch_lightning.plugins.precision.tpu"
BF16_MODULE = MODULE + "_bf16"


def standin():
    """The torch_xla stand-in (support.xla_standin), imported on first use."""
    from support import xla_standin

    return xla_standin


def _by_path(name, *parts):
    """A module of the package loaded by path, under ``name``: importing it through the package would run
    ``tpu_closure_fix/__init__`` and so enable the shim, which each scenario decides itself."""
    if name not in sys.modules:
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "tpu_closure_fix", *parts)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def lightning_module():
    """The Lightning driver's one-layer module builder (tpu_closure_fix/integrations/lightning/module.py)."""
    return _by_path("tpu_closure_fix_lightning_module_by_path", "integrations", "lightning", "module.py")


def _mean_square_output(layer, batch):
    return layer(batch).pow(2).mean()


def lightning():
    """Import pytorch_lightning, put the stand-in in torch_xla's place and bind it in the call-site module."""
    import importlib

    import pytorch_lightning as pl

    xm = standin()
    xm.install()
    module = importlib.import_module(MODULE)
    module.xm = xm
    module._XLA_AVAILABLE = True
    return pl, module


def site_depth():
    return depth(vars(sys.modules[MODULE].TPUPrecisionPlugin).get("optimizer_step"))


def train(steps=2, subclass=False):
    """Trainer.fit for ``steps`` optimizer steps (no fit for 0; a Trainer subclass if asked);
    returns (trainer, model, stand-in events)."""
    import torch

    pl, module = lightning()
    xm = standin()

    Model = lightning_module().linear_lightning_module(pl, torch, (2, 1), _mean_square_output,
                                                       on_training_step=lambda: xm.record("forward"),
                                                       on_after_backward=lambda: xm.record("backward"))

    class UserTrainer(pl.Trainer):
        pass

    model = Model()
    trainer_class = UserTrainer if subclass else pl.Trainer
    trainer = trainer_class(max_steps=max(steps, 1), accelerator="cpu", devices=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            num_sanity_val_steps=0, plugins=[module.TPUPrecisionPlugin()])
    xm.clear()
    if steps:
        trainer.fit(model, train_dataloaders=torch.utils.data.DataLoader(torch.randn(2 * steps, 2), batch_size=2))
    return trainer, model, xm.names()


def step_once(trainer, model, closure=None, **kwargs):
    """One optimizer_step through the fitted trainer's plugin; returns the stand-in events."""
    import torch

    xm = standin()

    def default_closure():
        xm.record("closure")
        return torch.tensor(1.0)

    xm.clear()
    trainer.strategy.precision_plugin.optimizer_step(trainer.optimizers[0], model, 0,
                                                     closure or default_closure, **kwargs)
    return xm.names()


def site_status():
    import tpu_closure_fix

    return [r for r in tpu_closure_fix.status() if r["module"] in (MODULE, BF16_MODULE)]


def emit(**out):
    """The scenario's result, on one stdout line the test reads (``PROBE {json}``)."""
    print("PROBE " + json.dumps(out, default=str))
    sys.stdout.flush()

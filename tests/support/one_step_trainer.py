"""A pytorch-lightning 1.8 ``TPUPrecisionPlugin`` attached to a real Trainer and model, after one CPU step.

Calling the plugin's ``optimizer_step`` directly needs the objects ``Trainer.fit`` wires together (the
strategy, the model's trainer reference, the loop's hooks): one ``max_steps=1`` fit on the CPU builds them.
The caller binds the torch_xla stand-in (``tpu.xm``, ``tpu._XLA_AVAILABLE``) before, so the fit step
already runs the plugin's XLA path on it.
"""


def fitted_tpu_precision_plugin():
    """Fit a one-layer model for one step with ``TPUPrecisionPlugin``; returns (trainer, its plugin, model).

    The model's optimizer is SGD with lr=0.0, so the step leaves its parameters unchanged. The caller
    keeps the trainer for as long as it calls the plugin: the model holds it by a weak reference only
    (pytorch-lightning 1.8's ``LightningModule.trainer`` is a weak proxy), and the plugin's step reads it.
    """
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.plugins.precision import tpu

    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    model = Model()
    trainer = pl.Trainer(max_steps=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, plugins=[tpu.TPUPrecisionPlugin()])
    trainer.fit(model, train_dataloaders=torch.utils.data.DataLoader(torch.randn(2, 2), batch_size=2))
    return trainer, trainer.strategy.precision_plugin, model

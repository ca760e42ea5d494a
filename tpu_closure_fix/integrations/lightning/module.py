"""The one-layer ``LightningModule`` of the Lightning verification driver, for the steps a Trainer runs itself.

Only the standard library is imported here, nothing from this package: test code that must not import
``tpu_closure_fix`` (importing it enables the shim) loads this file by path. Lightning and torch are
passed in, so the class derives from the ``LightningModule`` of the package the caller found.
"""


def _nothing():
    return None


def linear_lightning_module(pl, torch, features, loss, on_training_step=_nothing, on_after_backward=_nothing,
                            optimizer=None):
    """A ``pl.LightningModule`` class whose one layer, ``layer``, is ``torch.nn.Linear(*features)``.

    ``training_step`` calls ``on_training_step()`` and returns ``loss(layer, batch)``; the module's
    ``on_after_backward`` hook calls ``on_after_backward()``; ``configure_optimizers`` returns
    ``optimizer(parameters)`` (default: SGD, learning rate 0.1)."""
    make_optimizer = optimizer or (lambda params: torch.optim.SGD(params, lr=0.1))

    class LinearModule(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(*features)

        def forward(self, batch):
            return self.layer(batch)

        def training_step(self, batch, batch_idx, *args):
            on_training_step()
            return loss(self.layer, batch)

        def on_after_backward(self):
            on_after_backward()

        def configure_optimizers(self):
            return make_optimizer(self.parameters())

    return LinearModule

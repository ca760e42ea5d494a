"""Event-order self-test for ``tpu-closure-fix check``: needs no TPU and no torch_xla.

In a child process (the caller's process is never touched), it imports the
installed Lightning call-site classes, puts a *recording* stand-in where
``import torch_xla.core.xla_model`` finds it (child only), and runs one
optimizer step through each installed call site:

* Trainer sites (pytorch-lightning / lightning.pytorch >= 1.5): a real
  one-step ``Trainer.fit`` on the CPU with the installed TPU precision plugin;
* Trainer sites of pytorch-lightning 1.2-1.4: the installed
  ``TPUAccelerator.run_optimizer_step`` with a closure like theirs;
* Lite/Fabric sites: the installed precision plugin's ``optimizer_step`` called
  with ``closure=...``, as ``optimizer.step(closure)`` does.

It records forward/backward/reduce_gradients/step/mark_step and passes a site
when every gradient reduction comes after the backward of the same step and
before the optimizer's update -- the order of the upstream fix.
"""
import json
import os
import subprocess
import sys

EVENTS = []


def _record(name, **info):
    if name == "reduce_gradients" and not info.get("grads"):
        name = "reduce_gradients(no grads)"
    EVENTS.append(name)


def _install_recording_xla_model():
    """The package's CPU simulation of torch_xla (world size 1) with an event recorder, in this child only."""
    from . import _simulated_xla

    _simulated_xla.configure(1, 0)
    _simulated_xla.recorder = _record
    return _simulated_xla.install()


def verdict(events):
    """True when each step is: backward ... reduce_gradients ... step, never a reduction first."""
    if "reduce_gradients" not in events or "step" not in events:
        return False
    last_backward = None
    for i, ev in enumerate(events):
        if ev == "backward":
            last_backward = i
        elif ev.startswith("reduce_gradients"):
            if ev != "reduce_gradients" or last_backward is None:
                return False
            last_backward = None
    first_step = events.index("step")
    return max(i for i, ev in enumerate(events[:first_step + 1]) if ev.startswith("reduce")) < first_step


def _tiny(torch):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x, y = torch.randn(4, 3), torch.randn(4, 1)
    return model, x, y


def _lite_step(cls, torch):
    model, x, y = _tiny(torch)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.register_step_post_hook(lambda *a: EVENTS.append("step"))

    def closure():
        opt.zero_grad()
        EVENTS.append("forward")
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        EVENTS.append("backward")
        return loss

    plugin = cls.__new__(cls)  # its __init__ may probe for a TPU; optimizer_step uses no state
    plugin.optimizer_step(opt, closure=closure)


def _accelerator_step(cls, torch):
    model, x, y = _tiny(torch)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.register_step_post_hook(lambda *a: EVENTS.append("step"))

    def closure():
        EVENTS.append("forward")
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        EVENTS.append("backward")
        return loss.detach()

    cls.__new__(cls).run_optimizer_step(opt, 0, closure)


def _trainer_step(module, cls, torch):
    pl = sys.modules[module.__name__.split(".plugins")[0]]
    _, x, y = _tiny(torch)

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx, *args):
            EVENTS.append("forward")
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def on_after_backward(self):
            EVENTS.append("backward")

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            opt.register_step_post_hook(lambda *a: EVENTS.append("step"))
            return opt

    module._XLA_AVAILABLE = True  # the stand-in takes torch_xla's place in this child
    plugin = cls("32-true") if cls.__name__.startswith("XLA") else cls()
    loader = torch.utils.data.DataLoader([(x, y)], batch_size=None)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, plugins=[plugin])
    trainer.fit(Tiny(), train_dataloaders=loader)


def child():
    import importlib
    import warnings

    warnings.simplefilter("ignore")
    import torch

    import tpu_closure_fix
    from tpu_closure_fix import report, sites

    report.import_installed_sites()
    records = [r for r in tpu_closure_fix.status() if r["verdict"] in ("patched", "fixed upstream", "disabled")]
    xm = _install_recording_xla_model()
    results = []
    for record in records:
        rows = [s for s in sites.CALL_SITES if s.module == record["module"] and s.qualname == record["method"]]
        if not rows or rows[0].inherits:
            continue
        module = importlib.import_module(record["module"])
        module.xm = xm  # where Lightning binds torch_xla at module level (1.2-1.7); unused by later releases
        cls = getattr(module, record["method"].split(".")[0])
        del EVENTS[:]
        try:
            if record["method"].endswith("run_optimizer_step"):
                _accelerator_step(cls, torch)
            elif record["module"].startswith(("pytorch_lightning.", "lightning.pytorch.")):
                _trainer_step(module, cls, torch)
            else:
                _lite_step(cls, torch)
            error = None
        except Exception as exc:
            error = "%s: %s" % (type(exc).__name__, exc)
        results.append({"site": "%s:%s" % (record["module"], record["method"]), "verdict": record["verdict"],
                        "events": list(EVENTS), "ok": error is None and verdict(EVENTS), "error": error})
    print(json.dumps(results))


def run_event_check(timeout=300, env=None):
    """Run the self-test in a child process; list of per-site results (see module docstring)."""
    proc = subprocess.run([sys.executable, "-m", "tpu_closure_fix.selftest", "--child"], capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, **(env or {})))
    if proc.returncode != 0:
        return [{"site": "(self-test)", "verdict": "-", "events": [], "ok": False,
                 "error": "self-test process exited %d: %s" % (proc.returncode, proc.stderr[-1500:])}]
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        child()

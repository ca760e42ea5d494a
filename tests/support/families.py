"""Site families for the lifecycle contract: how to import, step, hold and reload each kind of call site.

A *family* is one patched call site and the real code that reaches it: the
Trainer's TPU precision plugin, a Lite/Fabric precision, the torch_xla guard on
``xm.optimizer_step``. :mod:`support.lifecycle` runs the same cases against
every family (orderings of import / enable / disable / reload, wrapper depth,
a wrapper disable() cannot remove, an object held from before a reload, a fix
that cannot be prepared, the TPU_CLOSURE_FIX=0 twin); a family only says how
its site is reached. Adding a family is one subclass of :class:`Family` here,
its name in :data:`FAMILIES`, and one small subclass of the contract in
tests/target/test_lifecycle.py.

Events are what the torch_xla stand-in records (``reduce_gradients``,
``mark_step``) plus what the family's own code records (``forward``,
``backward``, ``step``, ``closure``), in order. Each family states the order
of one step three ways, from the history of the code it drives (not from the
shim): ``fixed`` (the shim's fix), ``original`` (the release's own, buggy
order) and ``guarded`` (the family's own fix is unavailable, but its call goes
through the patched torch_xla guard; None for the guard itself).

Imported in child processes only (it imports Lightning and the stand-in when
called, never at import time).
"""
import importlib
import sys

from support import probe
from support.step_hook import after_each_step


def standin():
    from support import xla_standin

    return xla_standin


def owner_and_attr(module_name, qualname):
    """(class or module, attribute name) of a site, read from ``sys.modules`` now."""
    module = sys.modules[module_name]
    if "." in qualname:
        class_name, attr = qualname.rsplit(".", 1)
        return getattr(module, class_name), attr
    return module, qualname


class Family(object):
    """One call site, the code that reaches it, and the orders of one step."""

    name = None
    module = None        # the site's module, as in the call-site table
    qualname = None      # "Class.method" or "function"
    fixed = ()
    original = ()
    guarded = None
    #: The class of the fix this family's row uses (``module:Class``), broken by the fault case.
    fix_class = None
    #: The name of a subclass that inherits the site in the same package (a row with ``inherits``), or None.
    inheriting_subclass = None
    #: Whether enabling the shim after this family's code stepped unfixed warns (the framework integration's
    #: ``late_enable_warning``: Lightning looks for Trainers that have stepped).
    warns_when_enabled_late = False
    #: Modules the framework imports that neither the shim nor the contract is about (its dependencies):
    #: support.lifecycle imports them once, before forking, to save every child the time.
    preloaded = ()

    def import_framework(self):
        """Import the framework (as a user's script does), then put the stand-in in torch_xla's place."""
        raise NotImplementedError

    def hold(self):
        """Build the objects one step needs (a Trainer, a Lite runner, a reference to a function) from the
        classes and functions in place now; ``step(held)`` reuses them."""
        raise NotImplementedError

    def step(self, held=None):
        """One optimizer step through the site (with ``held`` objects, or new ones); returns the events."""
        raise NotImplementedError

    def reload(self):
        """``importlib.reload`` of the site's module, and the stand-in bound again where the module expects it."""
        raise NotImplementedError

    def site(self):
        return owner_and_attr(self.module, self.qualname)

    def current(self):
        owner, attr = self.site()
        return vars(owner).get(attr)


#: pytorch-lightning 1.8's and lightning-lite 1.8's heavy dependencies (none of them imports Lightning).
LIGHTNING_1_8_DEPENDENCIES = ("numpy", "yaml", "fsspec", "pkg_resources", "lightning_utilities", "tensorboardX",
                              "torchmetrics")


class TrainerFamily(Family):
    """pytorch-lightning 1.8.6 ``TPUPrecisionPlugin.optimizer_step``, reached by ``Trainer.fit``.

    ``step()`` fits a new Trainer for one step (forward, backward, then the
    reduction and the barrier with the fix); ``step(held)`` calls the plugin of
    a Trainer fitted earlier directly with a closure that records ``closure``.
    """

    name = "trainer"
    module = probe.MODULE
    qualname = "TPUPrecisionPlugin.optimizer_step"
    fixed = ("forward", "backward", "reduce_gradients", "mark_step")
    original = ("reduce_gradients", "forward", "backward")
    # The release's code passes its closure to xm.optimizer_step (barrier=False): the guard reduces after it.
    guarded = ("forward", "backward", "reduce_gradients")
    held_fixed = ("closure", "reduce_gradients", "mark_step")
    held_original = ("reduce_gradients", "closure")
    fix_class = "tpu_closure_fix.integrations.lightning.fixes:TrainerClosureFix"
    inheriting_subclass = "TPUBf16PrecisionPlugin"
    warns_when_enabled_late = True
    preloaded = LIGHTNING_1_8_DEPENDENCIES

    def import_framework(self):
        probe.lightning()

    def hold(self):
        trainer, model, _ = probe.train(1)
        return trainer, model

    def step(self, held=None):
        if held is None:
            trainer, model, events = probe.train(1)
            assert trainer.global_step == 1, trainer.global_step
            return events
        return probe.step_once(*held)

    def expected(self, kind, held):
        if held:
            return {"fixed": self.held_fixed, "original": self.held_original}[kind]
        return getattr(self, kind)

    def reload(self):
        module = importlib.reload(sys.modules[self.module])
        module.xm = standin()
        module._XLA_AVAILABLE = True


class LiteFamily(Family):
    """A Lite/Fabric precision's ``optimizer_step``, reached by ``optimizer.step(closure)`` of the
    installed LightningLite / Fabric (support.lightning_api builds them as in the replica tests).

    The subclasses name the precision class of their release line.
    """

    fix_class = "tpu_closure_fix.integrations.lightning.fixes:LiteClosureFix"
    #: Whether the release's ``optimizer_step`` passes ``barrier=True`` (a ``mark_step`` after every step).
    barrier = False

    def __init__(self):
        barrier = ("mark_step",) if self.barrier else ()
        self.fixed = ("forward", "backward", "reduce_gradients", "step") + barrier
        self.original = ("reduce_gradients", "forward", "backward", "step") + barrier
        self.guarded = self.fixed  # the guard does what the Lite fix does, barrier included

    @staticmethod
    def api():
        from support import lightning_api

        return lightning_api

    def expected(self, kind, held):
        return getattr(self, kind)

    def import_framework(self):
        self.api().import_lightning()
        xm = standin()
        xm.install()
        self.api().bind_standin(xm)

    def hold(self):
        import torch

        xm = standin()
        kind, lite = self.api().lite
        precision = self.api().make_precision("lite")
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        after_each_step(optimizer, lambda: xm.record("step"))
        if kind == "fabric":
            runner = lite.Fabric(accelerator="cpu", devices=1, plugins=[precision])
            model, optimizer = runner.setup(model, optimizer)
            return runner, model, optimizer

        class Runner(lite.LightningLite):
            def run(self):
                set_up = self.setup(model, optimizer)
                return (self,) + tuple(set_up)

        return Runner(accelerator="cpu", devices=1, plugins=[precision]).run()

    def step(self, held=None):
        import torch

        xm = standin()
        runner, model, optimizer = held or self.hold()

        def closure():
            optimizer.zero_grad()
            xm.record("forward")
            loss = model(torch.ones(2, 2)).pow(2).mean()
            runner.backward(loss)
            xm.record("backward")
            return loss

        xm.clear()
        optimizer.step(closure)
        return xm.names()

    def reload(self):
        importlib.reload(sys.modules[self.module])
        self.api().bind_standin(standin())


class Lite18Family(LiteFamily):
    """lightning-lite 1.8 (the copy inside pytorch-lightning 1.8.6): ``TPUPrecision``, no barrier."""

    name = "lite-1.8"
    module = "lightning_lite.plugins.precision.tpu"
    qualname = "TPUPrecision.optimizer_step"
    inheriting_subclass = "TPUBf16Precision"
    preloaded = LIGHTNING_1_8_DEPENDENCIES  # support.lightning_api imports pytorch_lightning too


class FabricXlaFamily(LiteFamily):
    """lightning-fabric >= 2.1: ``XLAPrecision``, ``barrier=True``."""

    name = "fabric-xla"
    module = "lightning_fabric.plugins.precision.xla"
    qualname = "XLAPrecision.optimizer_step"
    barrier = True
    preloaded = ("numpy", "fsspec", "lightning_utilities")


class GuardFamily(Family):
    """torch_xla's ``xm.optimizer_step`` itself, called by a plain PyTorch loop with a closure.

    The stand-in plays torch_xla; "import the framework" is the stand-in taking
    ``torch_xla.core.xla_model``'s place (its post-import hooks run, as for a
    real import). ``hold()`` is ``from torch_xla.core.xla_model import
    optimizer_step``: a reference to whatever the module attribute is now.
    """

    name = "guard"
    module = "torch_xla.core.xla_model"
    qualname = "optimizer_step"
    fixed = ("forward", "backward", "reduce_gradients", "step")
    original = ("reduce_gradients", "forward", "backward", "step")
    guarded = None
    fix_class = "tpu_closure_fix.integrations.torch_xla.fixes:OptimizerStepGuard"

    def expected(self, kind, held):
        return getattr(self, kind)

    def import_framework(self):
        standin().install()

    def hold(self):
        from torch_xla.core.xla_model import optimizer_step

        return optimizer_step

    def step(self, held=None):
        import torch

        xm = standin()
        if held is None:
            import torch_xla.core.xla_model as installed

            held = installed.optimizer_step
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        after_each_step(optimizer, lambda: xm.record("step"))

        def closure():
            optimizer.zero_grad()
            xm.record("forward")
            loss = model(torch.ones(2, 2)).pow(2).mean()
            loss.backward()
            xm.record("backward")
            return loss

        xm.clear()
        held(optimizer, optimizer_args={"closure": closure})
        return xm.names()

    def reload(self):
        """What ``importlib.reload`` of torch_xla's xla_model does: its body runs again in the same module
        object (new function objects), then the post-import hooks listed for its name run (wrapt's finder
        calls them after a reload; the stand-in's own import name differs, so they are called here)."""
        module = sys.modules[self.module]
        with open(module.__file__) as handle:
            source = handle.read()
        exec(compile(source, module.__file__, "exec"), vars(module))
        standin().install()  # the event recorder, which the re-run body reset
        wrapt = sys.modules.get("wrapt")
        if wrapt is not None:
            wrapt.notify_module_loaded(module)


FAMILIES = {cls.name: cls for cls in (TrainerFamily, Lite18Family, FabricXlaFamily, GuardFamily)}


def family(name):
    return FAMILIES[name]()

"""Fault scenarios against the real pytorch-lightning 1.8.6, one per child process.

Run as ``python -m support.fault_scenarios NAME [options]`` (``tests`` on
PYTHONPATH); tests/target/test_faults.py starts each in a fresh interpreter
with the environment of the fault (an edited copy of Lightning first on the
path, ``python -S``, a read-only venv...) and reads the ``PROBE {json}`` line
it prints. Nothing is imported at module level beyond the standard library:
each scenario chooses what gets imported, and when.
"""
import argparse
import sys

from support import probe as p


def standard():
    """Two Trainer steps; the events, the wrapper depth and the status of the site."""
    trainer, model, events = p.train(2)
    p.emit(global_step=trainer.global_step, events=events, depth=p.site_depth(), status=p.site_status())


def hook_raises():
    """The Trainer fix's ``prepare`` raises: the shim is active (hooks registered) before Lightning loads."""
    from tpu_closure_fix.integrations.lightning import fixes

    def broken_prepare(self, site, original, switch):
        raise RuntimeError("injected fault in prepare()")

    fixes.TrainerClosureFix.prepare = broken_prepare
    standard()


def wrapt_missing():
    sys.modules["wrapt"] = None  # what Python does for a module that is not installed
    standard()


def reload():
    """Reload the call-site module after training; a new Trainer, and one built before the reload."""
    import importlib

    trainer, model, events = p.train(2)
    first = dict(global_step=trainer.global_step, events=events, depth=p.site_depth(), status=p.site_status())
    old_class, old_trainer, old_model = sys.modules[p.MODULE].TPUPrecisionPlugin, trainer, model
    importlib.reload(sys.modules[p.MODULE])
    assert sys.modules[p.MODULE].TPUPrecisionPlugin is not old_class
    after_reload = {"depth": p.site_depth(), "status": p.site_status()}
    trainer, model, events = p.train(2)  # a new Trainer, built from the reloaded class
    import wrapt

    p.emit(wrapt=wrapt.__version__, result=dict(first=first, after_reload=after_reload, events=events,
                                                global_step=trainer.global_step,
                                                old_class_step=p.step_once(old_trainer, old_model)))


def from_zip():
    import pytorch_lightning

    trainer, model, events = p.train(2)
    p.emit(origin=pytorch_lightning.__file__, global_step=trainer.global_step, events=events,
           depth=p.site_depth(), status=p.site_status())


def no_site():
    """``python -S``: no .pth auto-enable; the shim is imported only after training started."""
    assert sys.flags.no_site
    trainer, model, events = p.train(2)
    loaded = "tpu_closure_fix" in sys.modules
    import tpu_closure_fix  # noqa: F401  (e.g. to ask status(): activates now, after training started)

    p.emit(global_step=trainer.global_step, events=events, loaded_before=loaded, depth=p.site_depth(),
           status=p.site_status(), next_step=p.step_once(trainer, model))


def late():
    """TPU_CLOSURE_FIX=0 in the environment, then ``enable()`` after a Trainer stepped."""
    trainer, model, events = p.train(2)
    import tpu_closure_fix

    off = p.site_status()
    tpu_closure_fix.enable()
    p.emit(global_step=trainer.global_step, events=events, off=off, depth=p.site_depth(),
           status=p.site_status(), next_step=p.step_once(trainer, model))


def late_any_trainer(steps, subclass, dropped=False):
    """``enable()`` after a Trainer took ``steps`` steps. ``dropped``: the program let go of that Trainer
    first; its reference cycles keep it uncollected (the collector is held off to make that certain) until
    something collects."""
    import gc
    import weakref

    trainer, model, events = p.train(steps, subclass=subclass)
    global_step, alive = trainer.global_step, weakref.ref(trainer)
    import tpu_closure_fix

    if dropped:
        gc.disable()
        del trainer, model
    uncollected_before_enable = alive() is not None
    tpu_closure_fix.enable()
    gc.enable()
    p.emit(global_step=global_step, events=events, depth=p.site_depth(), status=p.site_status(),
           uncollected_before_enable=uncollected_before_enable)


def read_only():
    """The standard scenario, in a venv whose site-packages cannot be written."""
    import os
    import sysconfig

    trainer, model, events = p.train(2)
    writable = os.access(sysconfig.get_paths()["purelib"], os.W_OK)
    p.emit(global_step=trainer.global_step, events=events, depth=p.site_depth(), status=p.site_status(),
           site_packages_writable=writable)


SCENARIOS = {"standard": standard, "hook-raises": hook_raises, "wrapt-missing": wrapt_missing, "reload": reload,
             "from-zip": from_zip, "no-site": no_site, "late": late, "read-only": read_only}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted(SCENARIOS) + ["late-any-trainer"])
    parser.add_argument("--steps", type=int, default=2, help="late-any-trainer: optimizer steps before enable()")
    parser.add_argument("--subclass", action="store_true", help="late-any-trainer: a Trainer subclass")
    parser.add_argument("--dropped", action="store_true", help="late-any-trainer: the Trainer was let go of")
    args = parser.parse_args(argv)
    if args.scenario == "late-any-trainer":
        late_any_trainer(args.steps, args.subclass, args.dropped)
    else:
        SCENARIOS[args.scenario]()
    return 0


if __name__ == "__main__":
    sys.exit(main())

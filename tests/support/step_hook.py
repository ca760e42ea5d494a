"""Record each optimizer step on any torch the tests run with.

torch >= 2.0 has ``Optimizer.register_step_post_hook``; torch 1.x (1.12 is the one the Python 3.8
stage of scripts/pythons.py installs) has not, so there the instance's ``step`` is wrapped: called
the same way (the closure included), it returns the step's result and then records.
"""


def after_each_step(optimizer, callback):
    """Call ``callback()`` after every ``optimizer.step(...)``."""
    register = getattr(optimizer, "register_step_post_hook", None)
    if register is not None:
        register(lambda *args: callback())
        return
    step = optimizer.step

    def step_then_record(*args, **kwargs):
        result = step(*args, **kwargs)
        callback()
        return result

    optimizer.step = step_then_record

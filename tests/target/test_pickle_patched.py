"""Patched methods pickle, copy and deep-copy as Lightning's originals do (by reference).

Real pytorch-lightning 1.8.6 (and the oldest supported wrapt, 1.14.1), the torch_xla stand-in: after
one ``Trainer.fit`` step, ``TPUPrecisionPlugin.optimizer_step``, the inherited
``TPUBf16PrecisionPlugin.optimizer_step`` and the fitted trainer's bound ``plugin.optimizer_step``
and the guarded module-level ``xla_model.optimizer_step`` (the stand-in) go through pickle (every
protocol), ``copy.copy`` and ``copy.deepcopy``. The same scenario runs with
the shim and with ``TPU_CLOSURE_FIX=0`` (the originals); what the program can observe must be the
same, except that every result called with the shim reduces after the closure, and without it before.
"""

from conftest import run_module
from test_faults import warnings_of




def observe(tmp_path, shim):
    out, proc = run_module("pickle_scenario", cwd=tmp_path, env={"TPU_CLOSURE_FIX": "1" if shim else "0"})
    warned = warnings_of(proc.stderr)
    assert warned == []
    return out


def test_patched_methods_pickle_and_copy_like_the_originals(tmp_path):
    (tmp_path / "off").mkdir()
    (tmp_path / "on").mkdir()
    original = observe(tmp_path / "off", shim=False)  # the twin: Lightning's own functions
    patched = observe(tmp_path / "on", shim=True)
    assert original["depth"] == 0 and patched["depth"] == 1
    assert original["guarded"] is False and patched["guarded"] is True
    before, after = original["observations"], patched["observations"]
    assert set(before) == set(after) and len(before) == 4 * (6 + 3)
    # The originals, pinned: the bug is there (reduce first); pickle/copy keep the binding as Python does.
    assert {o["order"] for o in before.values()} == {"reduce first", "not called"}
    assert before["plugin.optimizer_step deepcopy"]["bound to"] == "a copy"
    assert before["plugin.optimizer_step copy"]["bound to"] == "the same instance"
    assert before["TPUBf16PrecisionPlugin.optimizer_step pickle 2"]["function"] == "TPUPrecisionPlugin.optimizer_step"
    # With the shim every result is the patched method (closure first), and nothing else differs
    # except the identity of a class-accessed method after pickle: wrapt binds a new wrapper on
    # every attribute access, so ``Plugin.optimizer_step is Plugin.optimizer_step`` is False anyway.
    assert {o["order"] for o in after.values()} == {"closure first", "not called"}
    for key, seen in after.items():
        expected = dict(before[key], order="closure first" if before[key]["order"] != "not called" else "not called")
        if " pickle " in key and not key.startswith(("plugin.", "xla_model.")):
            assert seen["same object"] is False and expected["same object"] is True
            expected["same object"] = False
        assert seen == expected, key
        assert seen.get("names_shim") in (None, False), key  # a pickle never needs tpu_closure_fix to load

"""Patched methods pickle, copy and deep-copy as Lightning's originals do (by reference).

Real pytorch-lightning 1.8.6 (and the oldest supported wrapt, 1.14.1), the torch_xla stand-in: after
one ``Trainer.fit`` step, ``TPUPrecisionPlugin.optimizer_step``, the inherited
``TPUBf16PrecisionPlugin.optimizer_step`` and the fitted trainer's bound ``plugin.optimizer_step``
and the guarded module-level ``xla_model.optimizer_step`` (the stand-in) go through pickle (every
protocol), ``copy.copy`` and ``copy.deepcopy``. The same scenario runs with
the shim and with ``TPU_CLOSURE_FIX=0`` (the originals); what the program can observe must be the
same, except that every result called with the shim reduces after the closure, and without it before.
"""
import textwrap

from test_faults import scenario  # the shared Lightning 1.8.6 probe (tcf_probe.py)

OBSERVE = textwrap.dedent(
    """
    import copy, inspect, pickle, re, sys
    import torch
    import tcf_probe as p

    SHIM_NAME = re.compile(rb"tpu_closure_fix(?![_a-zA-Z0-9])")  # the package, not the stand-in's module name

    trainer, model, _ = p.train(1)
    Plugin = sys.modules[p.MODULE].TPUPrecisionPlugin
    Bf16Plugin = sys.modules[p.MODULE + "_bf16"].TPUBf16PrecisionPlugin
    plugin = trainer.strategy.precision_plugin
    bf16_plugin = Bf16Plugin()
    xla_model = sys.modules["torch_xla.core.xla_model"]  # the stand-in; its optimizer_step is guarded
    optimizer = trainer.optimizers[0]

    def closure():
        p.xm.record("closure")
        return torch.tensor(1.0)

    def call(result, owner_instance):
        if owner_instance is xla_model:  # torch_xla's own function: not called, only compared
            return "not called"
        p.xm.clear()
        if getattr(result, "__self__", None) is None:  # reached through a class: called with an instance of it
            result(owner_instance, optimizer, model, 0, closure)
        else:
            result(optimizer, model, 0, closure)
        names = p.xm.names()
        return "closure first" if names.index("closure") < names.index("reduce_gradients") else "reduce first"

    def describe(result, subject, instance, current, owner_instance):
        bound_to = getattr(result, "__self__", None)
        now = current() if current else getattr(bound_to, "optimizer_step", None)
        return {
            "bound to": ("the same instance" if bound_to is instance else
                         "a copy" if type(bound_to) is type(instance) else repr(bound_to)),
            "function": inspect.unwrap(getattr(result, "__func__", result)).__qualname__,
            "same object": result is subject,
            "equals what the name holds now": result == now,
            "order": call(result, owner_instance),
        }

    subjects = {
        "TPUPrecisionPlugin.optimizer_step": (Plugin.optimizer_step, lambda: Plugin.optimizer_step, plugin),
        "TPUBf16PrecisionPlugin.optimizer_step": (Bf16Plugin.optimizer_step, lambda: Bf16Plugin.optimizer_step,
                                                  bf16_plugin),
        "plugin.optimizer_step": (plugin.optimizer_step, None, None),
        "xla_model.optimizer_step": (xla_model.optimizer_step, lambda: xla_model.optimizer_step, xla_model),
    }
    out = {}
    for name, (subject, current, owner_instance) in subjects.items():
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            data = pickle.dumps(subject, protocol)
            loaded = pickle.loads(data)
            instance = loaded.__self__ if name == "plugin.optimizer_step" else plugin
            out["%s pickle %d" % (name, protocol)] = dict(describe(loaded, subject, instance, current, owner_instance),
                                                          names_shim=bool(SHIM_NAME.search(data)))
        out[name + " copy"] = describe(copy.copy(subject), subject, plugin, current, owner_instance)
        out[name + " deepcopy"] = describe(copy.deepcopy(subject), subject, plugin, current, owner_instance)
        twin = copy.deepcopy({"f": subject, "plugin": plugin})
        out[name + " deepcopy in a dict"] = describe(twin["f"], subject, twin["plugin"], current, owner_instance)
    from tpu_closure_fix.engine import is_ours
    p.emit(observations=out, depth=p.site_depth(), guarded=is_ours(xla_model.optimizer_step))
    """
)


def observe(tmp_path, shim):
    out, _, warned = scenario(tmp_path, OBSERVE, env={"TPU_CLOSURE_FIX": "1" if shim else "0"})
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

"""Scenario of tests/target/test_pickle_patched.py: pickle/copy/deepcopy of the patched methods after a real
Trainer.fit on the torch_xla stand-in (run as ``python -m support.pickle_scenario``)."""

import copy, inspect, pickle, re, sys
import torch
from support import probe as p

SHIM_NAME = re.compile(rb"tpu_closure_fix(?![_a-zA-Z0-9])")  # the package, not the stand-in's module name

trainer, model, _ = p.train(1)
Plugin = sys.modules[p.MODULE].TPUPrecisionPlugin
Bf16Plugin = sys.modules[p.MODULE + "_bf16"].TPUBf16PrecisionPlugin
plugin = trainer.strategy.precision_plugin
bf16_plugin = Bf16Plugin()
xla_model = sys.modules["torch_xla.core.xla_model"]  # the stand-in; its optimizer_step is guarded
optimizer = trainer.optimizers[0]

def closure():
    p.standin().record("closure")
    return torch.tensor(1.0)

def call(result, owner_instance):
    if owner_instance is xla_model:  # torch_xla's own function: not called, only compared
        return "not called"
    p.standin().clear()
    if getattr(result, "__self__", None) is None:  # reached through a class: called with an instance of it
        result(owner_instance, optimizer, model, 0, closure)
    else:
        result(optimizer, model, 0, closure)
    names = p.standin().names()
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

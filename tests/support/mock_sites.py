"""Lightning-style unit checks of the patched sites, with ``mock.patch("torch_xla.core.xla_model")``.

Lightning tests its TPU precision plugins this way (for example
``test_optimizer_step_calls_mark_step`` in pytorch-lightning 1.9): the whole
``xla_model`` module is a ``MagicMock``, the optimizer, model and closure are
mocks, and the test counts calls. Run as ``python -m support.mock_sites`` in
the target's environment, the shim on or off by TPU_CLOSURE_FIX as for a user;
prints one ``PROBE {json}`` line: for each site the target has, what the mocks
saw (``calls``: call counts; ``order``: the order of the recorded calls).

The stand-in is installed first only so that ``torch_xla.core`` exists for
``mock.patch`` to replace its ``xla_model`` attribute, as a test machine with
torch_xla installed has it.
"""
import json
import sys
from unittest import mock


def _counts(xm_mock, optimizer):
    return {"optimizer.step": optimizer.step.call_count, "xm.mark_step": xm_mock.mark_step.call_count,
            "xm.reduce_gradients": xm_mock.reduce_gradients.call_count,
            "xm.optimizer_step": xm_mock.optimizer_step.call_count}


def trainer_plugin(module):
    """pytorch-lightning's TPUPrecisionPlugin.optimizer_step, as Lightning's own test calls it."""
    plugin = module.TPUPrecisionPlugin()
    optimizer = mock.Mock()
    with mock.patch("torch_xla.core.xla_model") as xm_mock:
        plugin.optimizer_step(optimizer=optimizer, model=mock.Mock(), optimizer_idx=0, closure=mock.Mock())
    return {"calls": _counts(xm_mock, optimizer)}


def lite_precision(precision):
    """A Lite/Fabric precision's optimizer_step(optimizer, closure=...): an optimizer whose step runs the
    closure, as torch optimizers do; the order of step, closure and the xla_model calls is recorded."""
    order = []
    optimizer = mock.Mock()

    def step(closure=None, **kwargs):
        order.append("optimizer.step")
        return closure()

    optimizer.step.side_effect = step
    closure = mock.Mock(side_effect=lambda: order.append("closure") or 1.0)
    with mock.patch("torch_xla.core.xla_model") as xm_mock:
        for name in ("reduce_gradients", "mark_step", "optimizer_step"):
            getattr(xm_mock, name).side_effect = lambda *a, _name=name, **k: order.append("xm." + _name)
        precision.optimizer_step(optimizer, closure=closure)
    calls = _counts(xm_mock, optimizer)
    calls["closure"] = closure.call_count
    reduced_with = xm_mock.reduce_gradients.call_args
    return {"calls": calls, "order": order,
            "reduced_this_optimizer": bool(reduced_with) and reduced_with[0][:1] == (optimizer,)}


def main():
    import warnings

    warnings.simplefilter("ignore")
    from support import lightning_api as api
    from support import xla_standin

    api.import_lightning()
    xla_standin.install()
    api.bind_standin(xla_standin)
    import tpu_closure_fix

    out = {"shim": tpu_closure_fix.is_enabled(), "sites": {}}
    if api.pl is not None and api.PL_RELEASE is not None and api.trainer_precision_module()[1] == "TPUPrecisionPlugin":
        module = api.trainer_precision_module()[0]
        out["sites"]["%s:TPUPrecisionPlugin.optimizer_step" % module.__name__] = trainer_plugin(module)
    if api.lite is not None:
        module, class_name = api.lite_precision_module()[:2]
        out["sites"]["%s:%s.optimizer_step" % (module.__name__, class_name)] = lite_precision(
            api.make_precision("lite"))
    print("PROBE " + json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

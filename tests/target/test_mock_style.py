"""The patched sites pass Lightning's own style of unit test, ``mock.patch("torch_xla.core.xla_model")``.

pytorch-lightning 1.9 tests its fixed TPU plugin with the whole xla_model
module mocked: ``optimizer.step`` and ``xm.mark_step`` must each be called
once. The patched 1.8.6 plugin must pass that test, and a patched Lite/Fabric
precision called with a closure must run the closure, then
``xm.reduce_gradients`` on the mock, then step (and ``mark_step`` where the
release asks for a barrier). The twin, TPU_CLOSURE_FIX=0: the release's own
code hands everything to the mocked ``xm.optimizer_step``, so the optimizer is
never stepped, nothing is reduced and the closure never runs.

The checks run in support/mock_sites.py (one child per shim mode, the
target's real Lightning); the assertions are here.
"""
import pytest

from conftest import TARGET, defined_where, run_module
from support import expectations

TRAINER_SITE = "pytorch_lightning.plugins.precision.tpu:TPUPrecisionPlugin.optimizer_step"


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    """{shim: what the mocks saw}, from one support.mock_sites child per mode."""
    out = {}
    for shim in (True, False):
        out[shim], _ = run_module("mock_sites", cwd=tmp_path_factory.mktemp("mock"),
                                  env={"TPU_CLOSURE_FIX": "1" if shim else "0"}, timeout=300)
        assert out[shim]["shim"] is shim
    return out


def lite_site(seen):
    (key,) = [key for key in seen[True]["sites"] if key != TRAINER_SITE]
    return key


def lite_barrier():
    """Fabric >= 2.1 (XLAPrecision) passes barrier=True to xm.optimizer_step; lightning-lite 1.8 does not."""
    dist, version = expectations.parse_target(TARGET)
    return dist == "lightning-fabric" and version >= expectations.Version("2.1")


@defined_where(TARGET == "pytorch-lightning==1.8.6")
def test_trainer_plugin_calls_step_and_mark_step_once(seen):
    calls = seen[True]["sites"][TRAINER_SITE]["calls"]
    assert calls["optimizer.step"] == 1
    assert calls["xm.mark_step"] == 1
    assert calls["xm.optimizer_step"] == 0


@defined_where(TARGET == "pytorch-lightning==1.8.6")
def test_trainer_plugin_twin_without_shim(seen):
    calls = seen[False]["sites"][TRAINER_SITE]["calls"]
    assert calls == {"optimizer.step": 0, "xm.mark_step": 0, "xm.reduce_gradients": 0, "xm.optimizer_step": 1}


def test_lite_precision_reduces_on_the_mock_after_the_closure(seen):
    site = seen[True]["sites"][lite_site(seen)]
    barrier = ["xm.mark_step"] if lite_barrier() else []
    assert site["order"] == ["optimizer.step", "closure", "xm.reduce_gradients"] + barrier
    assert site["reduced_this_optimizer"]
    assert site["calls"] == {"optimizer.step": 1, "closure": 1, "xm.reduce_gradients": 1,
                             "xm.mark_step": len(barrier), "xm.optimizer_step": 0}


def test_lite_precision_twin_without_shim(seen):
    site = seen[False]["sites"][lite_site(seen)]
    assert site["order"] == ["xm.optimizer_step"]
    assert site["calls"] == {"optimizer.step": 0, "closure": 0, "xm.reduce_gradients": 0, "xm.mark_step": 0,
                             "xm.optimizer_step": 1}

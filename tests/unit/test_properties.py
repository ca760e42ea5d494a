"""Issue #6, bad input, property-based (hypothesis).

* Any value of TPU_CLOSURE_FIX: the package and the start-up module agree on
  on/off, and only values outside the accepted spellings produce a message.
* Against the real patched pytorch-lightning 1.8.6 ``TPUPrecisionPlugin.optimizer_step``
  (only when a 1.8.x target is importable; torch_xla is the stand-in): a closure
  that raises propagates the very same exception with no reduction and no step;
  a closure returning None under automatic optimization gives the upstream
  error; a closure evaluated k times is reduced k times, each after it; keyword
  arguments reach ``optimizer.step`` untouched.
"""
import os
import sys

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from tpu_closure_fix import config, settings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "..", "startup"))
sys.path.insert(0, os.path.dirname(HERE))

SPELLINGS = sorted(config.ON_VALUES | config.OFF_VALUES)


def _case_and_space(draw_word):
    return st.tuples(st.sampled_from(SPELLINGS), st.lists(st.booleans(), max_size=8),
                     st.sampled_from(["", " ", "\t", "  \n"])).map(
        lambda t: t[2] + "".join(c.upper() if (t[1][i % len(t[1])] if t[1] else False) else c
                                 for i, c in enumerate(t[0])) + t[2])


# Anything an environment variable can hold (no NUL, no lone surrogates).
ENV_TEXT = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=12)
VALUES = st.one_of(ENV_TEXT, _case_and_space(None), st.just(""), st.none())


@given(VALUES)
def test_switch_any_value(raw):
    import _tpu_closure_fix_startup as startup

    enabled, problem = settings.parse_switch(raw)
    # the documented rule: ASCII whitespace around the value and ASCII case ignored, nothing else
    norm = None if raw is None else raw.strip(config.ASCII_WHITESPACE)
    norm = norm.lower() if norm is not None and norm.isascii() else norm
    assert enabled == (norm not in config.OFF_VALUES)
    assert (problem is None) == (norm is None or norm == "" or norm in config.ON_VALUES | config.OFF_VALUES)
    if problem is not None:
        assert config.ENV_VAR in problem and "0/false/off/no" in problem
    env = {} if raw is None else {config.ENV_VAR: raw}
    old = dict(os.environ)
    try:
        os.environ.pop(config.ENV_VAR, None)
        os.environ.update(env)
        assert startup._disabled_by_environment() == (not enabled)
    finally:
        os.environ.clear()
        os.environ.update(old)


# --------------------------------------------------------------------------- the patched Trainer site
@pytest.fixture(scope="module")
def site():
    pl = pytest.importorskip("pytorch_lightning")
    if not pl.__version__.startswith("1.8."):
        pytest.skip("closure properties run against a pytorch-lightning 1.8.x target")
    import torch
    import tpu_closure_fix
    from pytorch_lightning.plugins.precision import tpu
    from support import xla_standin as xm
    from support.one_step_trainer import fitted_tpu_precision_plugin

    tpu_closure_fix.enable()
    xm.install()
    tpu.xm = xm
    tpu._XLA_AVAILABLE = True
    assert tpu_closure_fix.engine.is_ours(vars(tpu.TPUPrecisionPlugin)["optimizer_step"])

    trainer, plugin, model = fitted_tpu_precision_plugin()

    class Evaluating(torch.optim.Optimizer):
        """Evaluates the closure ``times`` times per step (like LBFGS) and records its keyword arguments."""

        def __init__(self, params):
            super().__init__(params, {})
            self.times, self.seen = 1, None

        def step(self, closure=None, **kwargs):
            self.seen = kwargs
            xm.record("step")
            result = None
            for _ in range(self.times):
                result = closure()
            return result

    yield plugin, model, Evaluating(model.parameters()), xm
    del trainer  # held until here: the model refers to it weakly and the plugin's step reads it
    sys.modules.pop("torch_xla.core.xla_model", None)
    sys.modules.pop("torch_xla.core", None)
    sys.modules.pop("torch_xla", None)


SETTINGS = hypothesis_settings(max_examples=40, deadline=None,
                               suppress_health_check=[HealthCheck.function_scoped_fixture])
EXCEPTIONS = st.sampled_from([ValueError, RuntimeError, KeyError, ZeroDivisionError, MemoryError, KeyboardInterrupt])


@SETTINGS
@given(exc_type=EXCEPTIONS, message=st.text(max_size=20))
def test_raising_closure_propagates_unchanged(site, exc_type, message):
    plugin, model, optimizer, xm = site
    error = exc_type(message)

    def closure():
        xm.record("closure")
        raise error

    xm.clear()
    with pytest.raises(exc_type) as caught:
        plugin.optimizer_step(optimizer, model, 0, closure)
    assert caught.value is error
    assert xm.names() == ["step", "closure"]  # the step called it; nothing was reduced, no mark_step


@SETTINGS
@given(times=st.integers(min_value=1, max_value=5))
def test_closure_evaluated_k_times_is_reduced_after_each(site, times):
    import torch

    plugin, model, optimizer, xm = site
    optimizer.times = times

    def closure():
        xm.record("closure")
        return torch.tensor(1.0)

    xm.clear()
    try:
        plugin.optimizer_step(optimizer, model, 0, closure)
    finally:
        optimizer.times = 1
    assert xm.names() == ["step"] + ["closure", "reduce_gradients"] * times + ["mark_step"]


def test_none_from_closure_in_automatic_optimization(site):
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    plugin, model, optimizer, xm = site
    with pytest.raises(MisconfigurationException, match="Skipping backward by returning `None`"):
        plugin.optimizer_step(optimizer, model, 0, lambda: None)


KWARGS = st.dictionaries(st.from_regex(r"[a-z][a-z_0-9]{0,8}", fullmatch=True).filter(
    lambda k: k not in ("closure", "optimizer", "model", "optimizer_idx", "self")),
    st.one_of(st.integers(), st.text(max_size=5), st.none(), st.lists(st.integers(), max_size=3)), max_size=4)


@SETTINGS
@given(kwargs=KWARGS, positional=st.booleans())
def test_keyword_arguments_pass_through_untouched(site, kwargs, positional):
    import torch

    plugin, model, optimizer, xm = site
    values = [object() if isinstance(v, list) else v for v in kwargs.values()]  # identity is checked too
    sent = dict(zip(kwargs, values))
    closure = lambda: torch.tensor(1.0)  # noqa: E731
    if positional:
        result = plugin.optimizer_step(optimizer, model, 0, closure, **sent)
    else:
        result = plugin.optimizer_step(optimizer=optimizer, model=model, optimizer_idx=0, closure=closure, **sent)
    assert float(result) == 1.0
    assert optimizer.seen.keys() == sent.keys()
    assert all(optimizer.seen[k] is sent[k] for k in sent)

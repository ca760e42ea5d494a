"""The shape guard reads the helper an upstream-fixed method reaches: the closure before the reduction.

The upstream fix (pytorch-lightning 1.9+) keeps its order in ``_tpu_wrap_closure`` / ``_xla_wrap_closure``:
run the closure, then ``xm.reduce_gradients``. A copy of the method with that helper reordered must not be
"fixed upstream" (tests/target/test_next_release.py does it on the real 2.6.6 code presented as 2.7.0).
"""
from tpu_closure_fix.integrations.lightning import FIXED_2_1
from tpu_closure_fix.shape import Shape


class xm:  # the names the helpers load; never called here
    @staticmethod
    def reduce_gradients(optimizer):
        raise AssertionError("not called")


class Fixed:
    def optimizer_step(self, optimizer, model, closure, **kwargs):
        closure = self._xla_wrap_closure  # noqa: F841  (the names the row requires)
        self._wrap_closure, xm.mark_step  # noqa: B018

    def _xla_wrap_closure(self, optimizer, closure):
        closure_result = closure()
        xm.reduce_gradients(optimizer)
        return closure_result


class ReducingFirst(Fixed):
    def _xla_wrap_closure(self, optimizer, closure):
        xm.reduce_gradients(optimizer)
        return closure()


class NoReduction(Fixed):
    def _xla_wrap_closure(self, optimizer, closure):
        return closure()


class Inheriting(Fixed):
    """A class kept for an old import path: the helper comes from its base."""


class WithoutHelper:
    optimizer_step = Fixed.optimizer_step


def test_the_fixed_order_in_the_helper_passes_for_the_class_and_its_subclasses():
    assert FIXED_2_1.check(Fixed.optimizer_step, Fixed) == (True, "")
    assert FIXED_2_1.check(Fixed.optimizer_step, Inheriting) == (True, "")


def test_a_helper_that_reduces_before_the_closure_fails_naming_it():
    result = FIXED_2_1.check(Fixed.optimizer_step, ReducingFirst)
    assert result == (False, "its helper _xla_wrap_closure loads reduce_gradients before closure")


def test_a_helper_without_the_reduction_or_a_class_without_the_helper_fails():
    assert FIXED_2_1.check(Fixed.optimizer_step, NoReduction) == (
        False, "its helper _xla_wrap_closure lacks reduce_gradients")
    assert FIXED_2_1.check(Fixed.optimizer_step, WithoutHelper) == (
        False, "WithoutHelper has no Python method _xla_wrap_closure")


def test_without_the_class_the_helpers_are_not_read_and_without_helpers_nothing_changes():
    assert FIXED_2_1.check(ReducingFirst.optimizer_step) == (True, "")
    plain = Shape(FIXED_2_1.params, requires=FIXED_2_1.requires, forbids=FIXED_2_1.forbids)
    assert plain.check(Fixed.optimizer_step, ReducingFirst) == (True, "")

"""The IR analysis of the graph check, on IR text dumped by torch_xla 2.1 (no torch_xla needed).

FIXED_IR: one step in the upstream order (the all-reduce between the backward and the SGD update);
BUGGY_IR: the unfixed order (no all-reduce in the step: the update uses the local gradient);
STALE_IR: an all-reduce of materialised gradients of an earlier step.
"""
from tpu_closure_fix.verify.ir import analyze_ir

FIXED_IR = """IR {
  %0 = f32[] xla::device_data(), xla_shape=f32[], device=CPU:0
  %1 = f32[2,4]{1,0} aten::expand(%0), xla_shape=f32[2,4]{1,0}, size=(2, 4)
  %2 = f32[] xla::device_data(), xla_shape=f32[], device=CPU:0
  %3 = f32[8,2]{1,0} xla::device_data(), xla_shape=f32[8,2]{1,0}, device=CPU:0
  %4 = f32[2]{0} xla::device_data(), xla_shape=f32[2]{0}, device=CPU:0
  %5 = f32[2,4]{1,0} xla::device_data(), xla_shape=f32[2,4]{1,0}, device=CPU:0
  %6 = f32[4,2]{0,1} aten::permute(%5), xla_shape=f32[4,2]{0,1}, dims=(1, 0)
  %7 = f32[8,4]{1,0} xla::device_data(), xla_shape=f32[8,4]{1,0}, device=CPU:0
  %8 = f32[8,2]{1,0} aten::addmm(%7, %6, %4), xla_shape=f32[8,2]{1,0}
  %9 = f32[] prim::Constant(), xla_shape=f32[], value=1
  %10 = f32[] prim::Constant(), xla_shape=f32[], value=1
  %11 = f32[] aten::expand(%10), xla_shape=f32[], size=(), dynamic_dims=()
  %12 = f32[] aten::div(%11, %9), xla_shape=f32[]
  %13 = f32[8,2]{1,0} aten::mse_loss_backward(%12, %8, %3), xla_shape=f32[8,2]{1,0}, reduction=1
  %14 = f32[1,2]{1,0} aten::sum(%13), xla_shape=f32[1,2]{1,0}, dimensions=(0), keep_reduced_dimensions=1, dtype=6
  %15 = f32[2]{0} aten::view(%14), xla_shape=f32[2]{0}, output_size=(2)
  %16 = f32[4,8]{0,1} aten::permute(%7), xla_shape=f32[4,8]{0,1}, dims=(1, 0)
  %17 = f32[4,2]{1,0} aten::mm(%16, %13), xla_shape=f32[4,2]{1,0}
  %18 = f32[2,4]{0,1} aten::permute(%17), xla_shape=f32[2,4]{0,1}, dims=(1, 0)
  %19 = (f32[2,4]{0,1}, f32[2]{0}, f32[]) xla::cross_replica_sum(%18, %15, %2), num_outputs=3, xla_shape=(f32[2,4]{0,1}, f32[2]{0}, f32[]), reduce_type=0, scale=0.5, pin_layout=1, groups=()
  %20 = f32[2,4]{1,0} aten::mul(%19.0, %1), xla_shape=f32[2,4]{1,0}
  %21 = f32[2,4]{1,0} aten::add(%5, %20), xla_shape=f32[2,4]{1,0}, ROOT=0
  %22 = f32[] xla::device_data(), xla_shape=f32[], device=CPU:0
  %23 = f32[2]{0} aten::expand(%22), xla_shape=f32[2]{0}, size=(2)
  %24 = f32[2]{0} aten::mul(%19.1, %23), xla_shape=f32[2]{0}
  %25 = f32[2]{0} aten::add(%4, %24), xla_shape=f32[2]{0}, ROOT=1
}
"""

BUGGY_IR = """IR {
  %0 = f32[] xla::device_data(), xla_shape=f32[], device=CPU:0
  %1 = f32[2,4]{1,0} aten::expand(%0), xla_shape=f32[2,4]{1,0}, size=(2, 4)
  %2 = f32[8,2]{1,0} xla::device_data(), xla_shape=f32[8,2]{1,0}, device=CPU:0
  %3 = f32[2]{0} xla::device_data(), xla_shape=f32[2]{0}, device=CPU:0
  %4 = f32[2,4]{1,0} xla::device_data(), xla_shape=f32[2,4]{1,0}, device=CPU:0
  %5 = f32[4,2]{0,1} aten::permute(%4), xla_shape=f32[4,2]{0,1}, dims=(1, 0)
  %6 = f32[8,4]{1,0} xla::device_data(), xla_shape=f32[8,4]{1,0}, device=CPU:0
  %7 = f32[8,2]{1,0} aten::addmm(%6, %5, %3), xla_shape=f32[8,2]{1,0}
  %8 = f32[] prim::Constant(), xla_shape=f32[], value=1
  %9 = f32[] prim::Constant(), xla_shape=f32[], value=1
  %10 = f32[] aten::expand(%9), xla_shape=f32[], size=(), dynamic_dims=()
  %11 = f32[] aten::div(%10, %8), xla_shape=f32[]
  %12 = f32[8,2]{1,0} aten::mse_loss_backward(%11, %7, %2), xla_shape=f32[8,2]{1,0}, reduction=1
  %13 = f32[4,8]{0,1} aten::permute(%6), xla_shape=f32[4,8]{0,1}, dims=(1, 0)
  %14 = f32[4,2]{1,0} aten::mm(%13, %12), xla_shape=f32[4,2]{1,0}
  %15 = f32[2,4]{0,1} aten::permute(%14), xla_shape=f32[2,4]{0,1}, dims=(1, 0)
  %16 = f32[2,4]{1,0} aten::mul(%15, %1), xla_shape=f32[2,4]{1,0}
  %17 = f32[2,4]{1,0} aten::add(%4, %16), xla_shape=f32[2,4]{1,0}, ROOT=0
  %18 = f32[] xla::device_data(), xla_shape=f32[], device=CPU:0
  %19 = f32[2]{0} aten::expand(%18), xla_shape=f32[2]{0}, size=(2)
  %20 = f32[1,2]{1,0} aten::sum(%12), xla_shape=f32[1,2]{1,0}, dimensions=(0), keep_reduced_dimensions=1, dtype=6
  %21 = f32[2]{0} aten::view(%20), xla_shape=f32[2]{0}, output_size=(2)
  %22 = f32[2]{0} aten::mul(%21, %19), xla_shape=f32[2]{0}
  %23 = f32[2]{0} aten::add(%3, %22), xla_shape=f32[2]{0}, ROOT=1
}
"""

# an all-reduce of materialised (previous-step) gradients whose result is also (wrongly) used:
# operands are bare device data, so they do not come from this step's backward
STALE_IR = """IR {
  %0 = f32[] xla::device_data(), xla_shape=f32[], device=CPU:0
  %1 = f32[2]{0} xla::device_data(), xla_shape=f32[2]{0}, device=CPU:0
  %2 = f32[2]{0} xla::device_data(), xla_shape=f32[2]{0}, device=CPU:0
  %3 = (f32[2]{0}, f32[]) xla::cross_replica_sum(%2, %0), num_outputs=2, xla_shape=(f32[2]{0}, f32[]), reduce_type=0, scale=0.5, pin_layout=1, groups=()
  %4 = f32[2]{0} aten::add(%1, %3.0), xla_shape=f32[2]{0}, ROOT=0
}
"""


def test_parser_fixed_order():
    r = analyze_ir(FIXED_IR, "%all-reduce.48 = (f32[2,4]) all-reduce(f32[2,4] %a), replica_groups={}")
    assert r["all_reduce_count"] == 1 and r["hlo_all_reduce_count"] == 1
    assert r["operands_from_backward"] and r["update_consumes_all_reduce"] and r["update_from_backward"]
    assert [o["node"] for o in r["all_reduce_operands"]] == [18, 15]  # the token %2 is not a gradient
    assert [u["all_reduce_outputs_used"] for u in r["update_ops"]] == [["%19.0"], ["%19.1"]]
    assert any("xla::cross_replica_sum" in line for line in r["excerpt"])
    assert any("mse_loss_backward" in line for line in r["excerpt"])


def test_parser_buggy_order():
    r = analyze_ir(BUGGY_IR, "HloModule m\n ENTRY e { %p = f32[2] parameter(0) }")
    assert r["all_reduce_count"] == 0 and r["hlo_all_reduce_count"] == 0
    assert not r["operands_from_backward"] and not r["update_consumes_all_reduce"]
    assert r["update_from_backward"]  # local gradient
    assert r["param_roots"] == 2


def test_parser_stale_gradient_all_reduce_is_not_from_backward():
    r = analyze_ir(STALE_IR)
    assert r["all_reduce_count"] == 1
    assert r["operands_from_backward"] is False
    assert r["update_consumes_all_reduce"] is True
    assert r["update_from_backward"] is False

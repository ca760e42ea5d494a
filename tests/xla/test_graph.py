"""Real-torch_xla evidence tier: the traced graph of one training step.

With real torch_xla 2.1.0 on CPU (``PJRT_DEVICE=CPU CPU_NUM_DEVICES=2``, replicas as threads),
``tpu_closure_fix.graphcheck.run_graph_check`` builds one step of

* the Trainer path: ``LightningModule.optimizer_step`` -> ``LightningOptimizer.step`` ->
  ``Strategy.optimizer_step`` -> ``TPUPrecisionPlugin.optimizer_step`` with Lightning's own
  ``Closure`` (training_step, zero_grad, backward), and
* the Lite path: ``_LiteOptimizer.step(closure)`` -> ``Strategy.optimizer_step`` ->
  ``TPUPrecision.optimizer_step``,

lazily (``xm.mark_step`` intercepted, no collective is ever executed: on CPU it would hang) and
dumps the pending graph of the parameters.  With the shim the graph holds exactly one
``xla::cross_replica_sum`` (HLO ``all-reduce``) fed by the backward ops and consumed by the SGD
update; with ``TPU_CLOSURE_FIX=0`` it holds none and the update uses the local gradient.

Needs the interpreter built by ``scripts/xla_env.sh`` in ``TPU_CLOSURE_FIX_XLA_PYTHON``; without
it these tests fail under CI (env ``CI`` set) and are skipped otherwise.  The IR-parser tests at
the bottom need nothing and always run.
"""
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:  # the installed package (the test venv installs this checkout), else the checkout itself
    from tpu_closure_fix import graphcheck  # cheap: no torch/torch_xla at import
except ImportError:  # pragma: no cover
    sys.path.insert(0, REPO)
    from tpu_closure_fix import graphcheck

XLA_PY = os.environ.get("TPU_CLOSURE_FIX_XLA_PYTHON", "").strip()
TIMEOUT = float(os.environ.get("TPU_CLOSURE_FIX_XLA_TIMEOUT", "300"))  # per child, hard (group kill)
PATHS = ("trainer", "lite")

_HOW = ("build it with `XLA_PY=$(bash scripts/xla_env.sh)` and run with "
        "TPU_CLOSURE_FIX_XLA_PYTHON=\"$XLA_PY\"")


def _unavailable(reason):
    if os.environ.get("CI"):
        pytest.fail(f"real-torch_xla tier cannot run under CI: {reason}; {_HOW}", pytrace=False)
    pytest.skip(f"real-torch_xla tier not run: {reason}; {_HOW}")


def _xla_python():
    if not XLA_PY:
        _unavailable("TPU_CLOSURE_FIX_XLA_PYTHON is not set")
    if not os.path.exists(XLA_PY):
        _unavailable(f"TPU_CLOSURE_FIX_XLA_PYTHON={XLA_PY!r} does not exist")
    if not graphcheck.graph_check_available(XLA_PY):
        _unavailable(f"torch_xla is not importable by {XLA_PY}")
    return XLA_PY


_cache = {}


def _run(label, **kwargs):
    """One child run per configuration for the whole module (each ~15 s, hard timeout)."""
    if label not in _cache:
        _cache[label] = graphcheck.run_graph_check(TIMEOUT, python=_xla_python(), paths=PATHS, **kwargs)
    res = _cache[label]
    if not res.get("ok"):
        pytest.fail(
            f"graph check ({label}) failed: {res.get('error')}\n"
            f"--- child stderr (tail) ---\n{res.get('stderr_tail', '')}\n"
            + "".join(f"--- {p} traceback ---\n{v.get('traceback', '')}\n" for p, v in res.get("paths", {}).items()),
            pytrace=False,
        )
    return res


@pytest.fixture(scope="module")
def shim_on():
    return _run("shim on", mode="shim", env={"TPU_CLOSURE_FIX": "1"})


@pytest.fixture(scope="module")
def shim_off():
    return _run("TPU_CLOSURE_FIX=0", mode="shim", env={"TPU_CLOSURE_FIX": "0"})


@pytest.fixture(scope="module")
def reference():
    return _run("reference order, shim off", mode="reference")


def _describe(p):
    lines = [f"impl={p.get('impl')} events={p.get('events')}",
             f"all_reduce_count={p.get('all_reduce_count')} hlo={p.get('hlo_all_reduce_count')} "
             f"operands_from_backward={p.get('operands_from_backward')} "
             f"update_consumes_all_reduce={p.get('update_consumes_all_reduce')}",
             "IR excerpt:"] + ["    " + line for line in p.get("excerpt", [])]
    return "\n".join(lines)


def _index(events, prefix):
    for i, e in enumerate(events):
        if e.startswith(prefix):
            return i
    raise AssertionError(f"{prefix!r} not in {events}")


# ---------------------------------------------------------------------------------- shim on

@pytest.mark.parametrize("path", PATHS)
def test_shim_one_all_reduce_fed_by_backward_and_feeding_update(shim_on, path):
    p = shim_on["paths"][path]
    assert "skipped" not in p, p.get("skipped")
    info = _describe(p)
    assert p["all_reduce_count"] == 1, info
    assert p["hlo_all_reduce_count"] == 1, info
    assert p["operands_from_backward"] is True, info
    assert p["update_consumes_all_reduce"] is True, info
    assert p["update_from_backward"] is True, info
    # both parameters (weight, bias) are updated from their own all-reduce output
    used = sorted(o for u in p["update_ops"] for o in u["all_reduce_outputs_used"])
    assert len(used) == 2 and len({o.split(".")[1] for o in used}) == 2, info
    assert all(o["backward_ops"] for o in p["all_reduce_operands"]), info
    # every replica traced the same thing
    assert p["replicas_agree"] is True, p["per_replica"]
    assert len(p["per_replica"]) == 2


@pytest.mark.parametrize("path", PATHS)
def test_shim_reduces_after_backward_before_step_update(shim_on, path):
    ev = shim_on["paths"][path]["events"]
    assert _index(ev, "backward") < _index(ev, "xm.reduce_gradients"), ev
    assert "xm.reduce_gradients (2 grads present)" in ev, ev
    assert _index(ev, "training_step") < _index(ev, "zero_grad") < _index(ev, "backward"), ev


def test_shim_trainer_path_requests_mark_step_after_step(shim_on):
    ev = shim_on["paths"]["trainer"]["events"]
    # the fixed Trainer path ends with xm.mark_step (recorded, never executed here)
    assert ev[-1].startswith("xm.mark_step"), ev


def test_shim_traced_the_installed_lightning_classes(shim_on):
    assert shim_on["paths"]["trainer"]["impl"].endswith("TPUPrecisionPlugin")
    assert shim_on["paths"]["lite"]["impl"].endswith("TPUPrecision")
    assert shim_on["world_size"] == 2
    assert shim_on["versions"]["torch_xla"].startswith("2.1")


_TRACED_SITES = {"trainer": ("pytorch_lightning.plugins.precision.tpu", "TPUPrecisionPlugin.optimizer_step"),
                 "lite": ("lightning_lite.plugins.precision.tpu", "TPUPrecision.optimizer_step")}


def _verdict(res, path):
    module, method = _TRACED_SITES[path]
    rows = (res.get("shim") or {}).get(path) or []
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict) and row.get("module") == module and row.get("method") == method:
            return row.get("verdict")
    return f"no status row for {module}.{method} in {rows!r}"[:500]


@pytest.mark.parametrize("path", PATHS)
def test_child_shim_status_matches(shim_on, shim_off, path):
    """tpu_closure_fix.status() in the traced process: patched with the shim, disabled without."""
    assert _verdict(shim_on, path) == "patched"
    assert _verdict(shim_off, path) == "disabled"


# --------------------------------------------------------------------------------- shim off

@pytest.mark.parametrize("path", PATHS)
def test_disabled_no_all_reduce_update_uses_local_gradient(shim_off, path):
    p = shim_off["paths"][path]
    assert "skipped" not in p, p.get("skipped")
    info = _describe(p)
    assert p["all_reduce_count"] == 0, info
    assert p["hlo_all_reduce_count"] == 0, info
    assert p["update_consumes_all_reduce"] is False, info
    # the update is still this step's backward: the local, unreduced gradient
    assert p["update_from_backward"] is True, info
    assert p["replicas_agree"] is True, p["per_replica"]


@pytest.mark.parametrize("path", PATHS)
def test_disabled_reduces_before_the_closure(shim_off, path):
    ev = shim_off["paths"][path]["events"]
    # the original order: xm.optimizer_step reduces the previous step's gradients, then the
    # closure recomputes them locally
    assert _index(ev, "xm.reduce_gradients") < _index(ev, "training_step") < _index(ev, "backward"), ev
    assert not any(e.startswith("xm.mark_step") for e in ev), ev


# --------------------------------------------------------- harness self-test (no shim involved)

@pytest.mark.parametrize("path", PATHS)
def test_reference_order_gives_the_same_graph(reference, shim_on, path):
    """The upstream (PL 1.9) order applied by hand yields the same all-reduce placement."""
    r, s = reference["paths"][path], shim_on["paths"][path]
    assert r["all_reduce_count"] == 1 and r["operands_from_backward"] and r["update_consumes_all_reduce"], \
        _describe(r)
    assert [u["all_reduce_outputs_used"] for u in r["update_ops"]] == \
        [u["all_reduce_outputs_used"] for u in s["update_ops"]]


# ------------------------------------------------------ IR parser (always runs, no torch_xla)

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
    r = graphcheck.analyze_ir(FIXED_IR, "%all-reduce.48 = (f32[2,4]) all-reduce(f32[2,4] %a), replica_groups={}")
    assert r["all_reduce_count"] == 1 and r["hlo_all_reduce_count"] == 1
    assert r["operands_from_backward"] and r["update_consumes_all_reduce"] and r["update_from_backward"]
    assert [o["node"] for o in r["all_reduce_operands"]] == [18, 15]  # the token %2 is not a gradient
    assert [u["all_reduce_outputs_used"] for u in r["update_ops"]] == [["%19.0"], ["%19.1"]]
    assert any("xla::cross_replica_sum" in line for line in r["excerpt"])
    assert any("mse_loss_backward" in line for line in r["excerpt"])


def test_parser_buggy_order():
    r = graphcheck.analyze_ir(BUGGY_IR, "HloModule m\n ENTRY e { %p = f32[2] parameter(0) }")
    assert r["all_reduce_count"] == 0 and r["hlo_all_reduce_count"] == 0
    assert not r["operands_from_backward"] and not r["update_consumes_all_reduce"]
    assert r["update_from_backward"]  # local gradient
    assert r["param_roots"] == 2


def test_parser_stale_gradient_all_reduce_is_not_from_backward():
    r = graphcheck.analyze_ir(STALE_IR)
    assert r["all_reduce_count"] == 1
    assert r["operands_from_backward"] is False
    assert r["update_consumes_all_reduce"] is True
    assert r["update_from_backward"] is False


def test_graphcheck_module_is_light():
    """Importing graphcheck must not import torch / torch_xla / Lightning."""
    import subprocess

    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(graphcheck.__file__)))
    code = ("import sys; sys.path.insert(0, %r); import tpu_closure_fix.graphcheck as g; "
            "heavy = [m for m in ('torch', 'torch_xla', 'pytorch_lightning', 'lightning_lite') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)" % pkg_parent)
    env = dict(os.environ, TPU_CLOSURE_FIX="0")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr

"""Real-torch_xla graph evidence: where does the gradient all-reduce sit in one training step?

``run_graph_check()`` starts a child interpreter (hard timeout, own process group) that runs
``PJRT_DEVICE=CPU CPU_NUM_DEVICES=<replicas>`` replicas through
``torch_xla._internal.pjrt.run_multiprocess`` and, in every replica, for the Trainer path
(``TPUPrecisionPlugin.optimizer_step`` reached through ``LightningModule.optimizer_step`` ->
``LightningOptimizer.step`` -> ``Strategy.optimizer_step``) and for the Lite/Fabric path
(``_LiteOptimizer.step(closure)`` -> ``Strategy.optimizer_step`` -> ``TPUPrecision.optimizer_step``):

1. runs one warm-up forward/backward with **no collective** and executes it (``xm.mark_step``), so
   every parameter has a materialised ``.grad`` (the unfixed order all-reduces the *previous*
   gradients before the closure; with no gradient at all that would be an all-reduce of an empty
   list, which segfaults torch_xla);
2. builds the next training step lazily with ``xm.mark_step`` intercepted (recorded, never run),
   so nothing is executed: XLA collectives on CPU hang (2.1) or abort (2.9);
3. dumps the pending graph of the parameters with ``torch_xla._XLAC._get_xla_tensors_text`` /
   ``_get_xla_tensors_hlo`` and analyses it: number of ``xla::cross_replica_sum`` nodes (HLO
   ``all-reduce``), whether their operands are computed by the backward pass of this step, and
   whether the parameter update consumes their output;
4. drops every reference to the pending collective (parameters restored from the warm-up values
   on the host, gradients set to ``None``) and never calls a real ``mark_step`` again.

The shim is in whatever state ``import tpu_closure_fix`` leaves it in the child, i.e. enabled
unless ``TPU_CLOSURE_FIX=0`` (the environment is passed through).

Nothing heavy is imported at module import time: torch, torch_xla and Lightning are imported
inside the functions that run in the child.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

__all__ = ["graph_check_available", "run_graph_check", "analyze_ir"]

_RESULT_MARK = "TPU_CLOSURE_FIX_GRAPHCHECK_RESULT:"
_ALL_REDUCE_IR = "xla::cross_replica_sum"
_ALL_REDUCE_HLO = re.compile(r"\ball-reduce(?:-start)?\(")
_MODES = ("shim", "reference", "unpatched")

# Trainer-side precision plugins, in order of preference: (module, class).
_TRAINER_PRECISIONS = (
    ("pytorch_lightning.plugins.precision.tpu", "TPUPrecisionPlugin"),
    ("lightning.pytorch.plugins.precision.tpu", "TPUPrecisionPlugin"),
    ("pytorch_lightning.plugins.precision.xla", "XLAPrecisionPlugin"),
    ("pytorch_lightning.plugins.precision.xla", "XLAPrecision"),
    ("lightning.pytorch.plugins.precision.xla", "XLAPrecisionPlugin"),
    ("lightning.pytorch.plugins.precision.xla", "XLAPrecision"),
)
# Lite/Fabric precision plugins: (module, class, optimizer-wrapper module, wrapper class,
# single-device strategy module).
_LITE_PRECISIONS = (
    ("lightning_lite.plugins.precision.tpu", "TPUPrecision", "lightning_lite.wrappers", "_LiteOptimizer",
     "lightning_lite.strategies"),
    ("lightning.lite.plugins.precision.tpu", "TPUPrecision", "lightning.lite.wrappers", "_LiteOptimizer",
     "lightning.lite.strategies"),
    ("lightning_fabric.plugins.precision.tpu", "TPUPrecision", "lightning_fabric.wrappers", "_FabricOptimizer",
     "lightning_fabric.strategies"),
    ("lightning_fabric.plugins.precision.xla", "XLAPrecision", "lightning_fabric.wrappers", "_FabricOptimizer",
     "lightning_fabric.strategies"),
    ("lightning.fabric.plugins.precision.tpu", "TPUPrecision", "lightning.fabric.wrappers", "_FabricOptimizer",
     "lightning.fabric.strategies"),
    ("lightning.fabric.plugins.precision.xla", "XLAPrecision", "lightning.fabric.wrappers", "_FabricOptimizer",
     "lightning.fabric.strategies"),
)


# --------------------------------------------------------------------------------------------
# parent side (cheap, no heavy imports)
# --------------------------------------------------------------------------------------------

def graph_check_available(python: Optional[str] = None) -> bool:
    """True when torch_xla is importable (in this interpreter, or in ``python`` if given)."""
    # compare launcher paths, not realpaths: every venv's python is a symlink to the same binary
    if python is None or os.path.abspath(python) == os.path.abspath(sys.executable):
        try:
            return importlib.util.find_spec("torch_xla") is not None
        except (ImportError, ValueError):
            return False
    try:
        proc = subprocess.run(
            [python, "-c", "import importlib.util,sys; sys.exit(importlib.util.find_spec('torch_xla') is None)"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


def _kill_group(proc: "subprocess.Popen[str]") -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        try:
            proc.kill()
        except OSError:
            pass


def run_graph_check(
    timeout: float = 600.0,
    *,
    python: Optional[str] = None,
    replicas: int = 2,
    mode: str = "shim",
    paths: Sequence[str] = ("trainer", "lite"),
    env: Optional[Dict[str, str]] = None,
) -> Dict[str, Any]:
    """Trace one training step per path on ``replicas`` CPU replicas of real torch_xla.

    Runs in a child interpreter (``python``, default this one) in its own process group, killed
    as a whole after ``timeout`` seconds.  ``mode``: ``"shim"`` (the child imports
    ``tpu_closure_fix``, so the shim is on unless ``TPU_CLOSURE_FIX=0``), ``"reference"`` (shim
    off, the child hand-applies the upstream fix order instead: a self-test of the harness) or
    ``"unpatched"`` (shim off, Lightning as installed).

    Returns ``{"ok": bool, "error": str|None, "seconds": float, "replicas": n, "mode": ...,
    "shim": <status in the child>, "versions": {...}, "paths": {"trainer": {...}, "lite": {...}}}``;
    each path holds ``all_reduce_count`` (IR), ``hlo_all_reduce_count``, ``operands_from_backward``,
    ``update_consumes_all_reduce``, ``events`` (call order seen in the step), ``excerpt`` (IR lines),
    ``impl`` (the precision class traced) and ``per_replica`` (the same for every replica).
    """
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    if replicas < 2:
        raise ValueError("the all-reduce is a no-op with fewer than 2 replicas")
    python = python or sys.executable
    child_env = dict(os.environ)
    if env:
        child_env.update(env)
    child_env["PJRT_DEVICE"] = "CPU"
    child_env["CPU_NUM_DEVICES"] = str(replicas)
    child_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    child_env.setdefault("OMP_NUM_THREADS", "1")
    child_env.pop("XRT_TPU_CONFIG", None)
    child_env.pop("TPU_NUM_DEVICES", None)
    child_env.pop("GPU_NUM_DEVICES", None)
    if mode != "shim":
        child_env["TPU_CLOSURE_FIX"] = "0"
    # stacks of a hung child land in stderr_tail before the kill
    child_env["TPU_CLOSURE_FIX_GRAPHCHECK_DUMP_AFTER"] = str(max(5.0, timeout - 10.0))
    # the child must import *this* tpu_closure_fix and nothing else from our environment (it may
    # live in another venv's site-packages): expose just the package through a private folder
    import shutil
    import tempfile

    shim_dir = tempfile.mkdtemp(prefix="tpu-closure-fix-graphcheck-")
    pkg = os.path.dirname(os.path.abspath(__file__))
    try:
        os.symlink(pkg, os.path.join(shim_dir, "tpu_closure_fix"))
    except OSError:
        shutil.copytree(pkg, os.path.join(shim_dir, "tpu_closure_fix"),
                        ignore=shutil.ignore_patterns("__pycache__"))
    child_env["PYTHONPATH"] = os.pathsep.join(
        [shim_dir] + [p for p in child_env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    try:
        return _run_child(python, mode, paths, replicas, timeout, child_env, shim_dir)
    finally:
        shutil.rmtree(shim_dir, ignore_errors=True)


def _run_child(python: str, mode: str, paths: Sequence[str], replicas: int, timeout: float,
               child_env: Dict[str, str], cwd: str) -> Dict[str, Any]:
    cmd = [python, "-m", "tpu_closure_fix.graphcheck", "--child", "--mode", mode, "--paths", ",".join(paths)]
    result: Dict[str, Any] = {"ok": False, "error": None, "mode": mode, "replicas": replicas,
                              "python": python, "paths": {}}
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        result.update(seconds=round(time.monotonic() - start, 1),
                      error=f"timed out after {timeout:.0f} s (process group killed)",
                      stderr_tail=(err or "")[-4000:])
        return result
    finally:
        if proc.poll() is None:  # pragma: no cover - defensive
            _kill_group(proc)
    # the replicas' process pool may leave a straggler in the group: end it
    _kill_group(proc)
    result["seconds"] = round(time.monotonic() - start, 1)
    payload = None
    for line in (out or "").splitlines():
        if line.startswith(_RESULT_MARK):
            payload = json.loads(line[len(_RESULT_MARK):])
    if payload is None:
        result.update(error=f"child exited with {proc.returncode} and no result",
                      stderr_tail=(err or "")[-4000:], stdout_tail=(out or "")[-2000:])
        return result
    result.update(payload)
    result["returncode"] = proc.returncode
    if proc.returncode != 0 and not result.get("error"):
        result["error"] = f"child exited with {proc.returncode}"
    if result.get("error"):
        result["stderr_tail"] = (err or "")[-4000:]
    return result


# --------------------------------------------------------------------------------------------
# IR analysis (pure text; usable anywhere)
# --------------------------------------------------------------------------------------------

_NODE_RE = re.compile(r"^\s*%(\d+) = (.*)$")
_OP_RE = re.compile(r"^(?:\([^=]*?\)|\S+)\s+([A-Za-z_][\w:.]*)\((.*?)\)(?:,|$)")
_REF_RE = re.compile(r"%(\d+)(?:\.(\d+))?")
# autograd nodes lowered by torch_xla keep their names: the traced model is Linear + MSE, whose
# backward starts with aten::mse_loss_backward (weight grad: mm/permute, bias grad: sum/view)
_BACKWARD_OP = re.compile(r"_backward\b")


def _parse_ir(text: str) -> Dict[int, Dict[str, Any]]:
    nodes: Dict[int, Dict[str, Any]] = {}
    for line in text.splitlines():
        m = _NODE_RE.match(line)
        if not m:
            continue
        idx, rest = int(m.group(1)), m.group(2)
        om = _OP_RE.match(rest)
        op, args = (om.group(1), om.group(2)) if om else ("?", "")
        operands = [(int(a), int(b) if b is not None else None) for a, b in _REF_RE.findall(args)
                    for a, b in [(a, b or None)]]
        root = re.search(r"ROOT=(\d+)", rest)
        nodes[idx] = {"op": op, "operands": operands, "line": line.strip(),
                      "root": int(root.group(1)) if root else None}
    return nodes


def _ancestors(nodes: Dict[int, Dict[str, Any]], start: Sequence[int]) -> set:
    seen: set = set()
    stack = list(start)
    while stack:
        n = stack.pop()
        if n in seen or n not in nodes:
            continue
        seen.add(n)
        stack.extend(o for o, _ in nodes[n]["operands"])
    return seen


def _users(nodes: Dict[int, Dict[str, Any]]) -> Dict[int, List[int]]:
    users: Dict[int, List[int]] = {}
    for idx, node in nodes.items():
        for o, _ in node["operands"]:
            users.setdefault(o, []).append(idx)
    return users


def analyze_ir(ir_text: str, hlo_text: str = "", loss_ir_text: str = "") -> Dict[str, Any]:
    """Analyse the pending graph of the parameters after one traced step.

    * ``all_reduce_count``: ``xla::cross_replica_sum`` nodes in the graph.
    * ``operands_from_backward``: every tensor operand of every all-reduce (the token, its last
      operand, excluded) is computed in this graph (not a materialised ``device_data`` gradient
      of an earlier step) and has an autograd backward op (``aten::*_backward``) among its
      ancestors; when ``loss_ir_text`` (the loss of the traced step) is given, the ancestry must
      also share forward ops (``addmm``...) with it.
    * ``update_consumes_all_reduce``: every parameter root (``ROOT=i``) has an all-reduce among
      its ancestors, and the last op producing it (the SGD update) reaches the all-reduce.
    """
    nodes = _parse_ir(ir_text)
    users = _users(nodes)
    ar = [i for i, n in nodes.items() if n["op"] == _ALL_REDUCE_IR]
    roots = {n["root"]: i for i, n in nodes.items() if n["root"] is not None}
    res: Dict[str, Any] = {
        "all_reduce_count": len(ar),
        "hlo_all_reduce_count": len(_ALL_REDUCE_HLO.findall(hlo_text)) if hlo_text else None,
        "param_roots": len(roots),
        "operands_from_backward": False,
        "update_consumes_all_reduce": False,
        "all_reduce_operands": [],
        "update_ops": [],
        "excerpt": [],
    }
    loss_ops = set()
    if loss_ir_text:
        loss_ops = {n["op"] for n in _parse_ir(loss_ir_text).values()} - {"xla::device_data", "prim::Constant"}
    if ar:
        operand_ok = []
        for a in ar:
            operands = [o for o, _ in nodes[a]["operands"]]
            nout = re.search(r"num_outputs=(\d+)", nodes[a]["line"])
            if nout and int(nout.group(1)) == len(operands) and len(operands) > 1:
                operands = operands[:-1]  # the last operand/output is the collective's token
            for o in operands:
                on = nodes.get(o)
                if on is None:
                    operand_ok.append(False)
                    continue
                anc = _ancestors(nodes, [o])
                bw = [x for x in anc if _BACKWARD_OP.search(nodes[x]["op"])]
                ops = {nodes[x]["op"] for x in anc}
                has_loss = bool(loss_ops & ops) if loss_ops else True
                # a materialised gradient of an earlier step would be a bare xla::device_data
                ok = on["op"] != "xla::device_data" and bool(bw) and has_loss
                operand_ok.append(ok)
                res["all_reduce_operands"].append({"node": o, "op": on["op"], "from_backward": ok,
                                                   "backward_ops": sorted({nodes[x]["op"] for x in bw})})
        res["operands_from_backward"] = bool(operand_ok) and all(operand_ok)
        consumed = []
        ar_set = set(ar)
        for r, idx in sorted(roots.items()):
            anc = _ancestors(nodes, [idx])
            # which all-reduce outputs (%ar.k) feed this parameter's new value
            outs = sorted({f"%{o}.{k}" if k is not None else f"%{o}" for x in anc | {idx}
                           for o, k in nodes[x]["operands"] if o in ar_set})
            hit = bool(outs) and nodes[idx]["op"] != _ALL_REDUCE_IR
            consumed.append(hit)
            res["update_ops"].append({"root": r, "node": idx, "op": nodes[idx]["op"],
                                      "consumes_all_reduce": hit, "all_reduce_outputs_used": outs})
        res["update_consumes_all_reduce"] = bool(consumed) and all(consumed)
    else:
        res["update_ops"] = [{"root": r, "node": idx, "op": nodes[idx]["op"], "consumes_all_reduce": False}
                             for r, idx in sorted(roots.items())]
    # every parameter's new value is computed from this step's backward (true in both orders:
    # with the fix through the all-reduce, without it from the local gradient)
    bw_all = {i for i, n in nodes.items() if _BACKWARD_OP.search(n["op"])}
    root_anc = {idx: _ancestors(nodes, [idx]) for idx in roots.values()}
    res["update_from_backward"] = bool(roots) and all(anc & bw_all for anc in root_anc.values())
    # excerpt: the chain backward op -> (all-reduce) -> update, i.e. nodes that descend from a
    # backward op and are ancestors of a parameter root
    desc: set = set()
    frontier = list(bw_all)
    while frontier:
        u = frontier.pop()
        if u in desc:
            continue
        desc.add(u)
        frontier.extend(users.get(u, []))
    on_chain = desc & set().union(*root_anc.values()) if root_anc else set()
    res["excerpt"] = [nodes[i]["line"] for i in sorted(on_chain)]
    res["excerpt"] = [_short(line) for line in res["excerpt"]][:30]
    return res


def _short(line: str, width: int = 220) -> str:
    line = re.sub(r", location=[^,]*(?=,|$)", "", line)
    return line if len(line) <= width else line[: width - 3] + "..."


# --------------------------------------------------------------------------------------------
# child side (runs inside the XLA interpreter)
# --------------------------------------------------------------------------------------------

_tls = threading.local()
_install_lock = threading.Lock()
_installed: Dict[str, Any] = {}


def _events() -> List[str]:
    ev = getattr(_tls, "events", None)
    if ev is None:
        ev = _tls.events = []
    return ev


def _arm_stack_dump() -> None:
    """Dump every thread's stack to stderr shortly before the parent's hard timeout."""
    with _install_lock:
        if _installed.get("faulthandler"):
            return
        after = float(os.environ.get("TPU_CLOSURE_FIX_GRAPHCHECK_DUMP_AFTER", "0") or 0)
        if after > 0:
            import faulthandler

            faulthandler.dump_traceback_later(after, exit=False)
        _installed["faulthandler"] = True


def _install_interceptors() -> None:
    """Process-wide wrappers around xm.mark_step / xm.reduce_gradients (thread-aware)."""
    with _install_lock:
        if _installed.get("done"):
            return
        import torch_xla.core.xla_model as xm

        real_mark_step = xm.mark_step
        real_reduce = xm.reduce_gradients

        def mark_step(*args: Any, **kwargs: Any) -> None:
            if getattr(_tls, "tracing", False):
                _events().append("xm.mark_step (intercepted, not executed)")
                return None
            if getattr(_tls, "traced", False):
                # this replica holds a pending collective: executing anything now would run it
                raise RuntimeError("graphcheck: refusing a real xm.mark_step after a traced step")
            return real_mark_step(*args, **kwargs)

        def reduce_gradients(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(_tls, "tracing", False):
                n = sum(1 for g in optimizer.param_groups for p in g["params"] if p.grad is not None)
                _events().append(f"xm.reduce_gradients ({n} grads present)")
                if n == 0:
                    # all_reduce of an empty list segfaults torch_xla: refuse, and say so
                    _events().append("xm.reduce_gradients skipped: no gradient (would segfault)")
                    return None
            return real_reduce(optimizer, *args, **kwargs)

        mark_step.__wrapped__ = real_mark_step  # type: ignore[attr-defined]
        reduce_gradients.__wrapped__ = real_reduce  # type: ignore[attr-defined]
        xm.mark_step = mark_step
        xm.reduce_gradients = reduce_gradients
        _installed.update(done=True, real_mark_step=real_mark_step)


def _apply_reference_fix() -> List[str]:
    """Hand-written upstream order (PL 1.9 ``_tpu_wrap_closure``) for the harness self-test."""
    with _install_lock:
        if "reference" in _installed:
            return _installed["reference"]
        from functools import partial

        patched: List[str] = []

        def _reduce_after(optimizer: Any, closure: Any) -> Any:
            import torch_xla.core.xla_model as xm

            closure_result = closure()
            xm.reduce_gradients(optimizer)
            return closure_result

        cls = _find_class(_TRAINER_PRECISIONS)
        if cls is not None:
            import inspect

            def _finish(self: Any, optimizer: Any, wrapped: Any, kwargs: Dict[str, Any]) -> Any:
                import torch_xla.core.xla_model as xm

                closure_result = optimizer.step(closure=wrapped, **kwargs)
                xm.mark_step()
                return closure_result

            if "optimizer_idx" in inspect.signature(cls.optimizer_step).parameters:  # PL <= 1.9
                def optimizer_step(self: Any, optimizer: Any, model: Any, optimizer_idx: int, closure: Any,
                                   **kwargs: Any) -> Any:
                    wrapped = partial(_reduce_after, optimizer, closure)
                    wrapped = partial(self._wrap_closure, model, optimizer, optimizer_idx, wrapped)
                    return _finish(self, optimizer, wrapped, kwargs)
            else:  # PL >= 2.0
                def optimizer_step(self: Any, optimizer: Any, model: Any, closure: Any,  # type: ignore[misc]
                                   **kwargs: Any) -> Any:
                    wrapped = partial(_reduce_after, optimizer, closure)
                    wrapped = partial(self._wrap_closure, model, optimizer, wrapped)
                    return _finish(self, optimizer, wrapped, kwargs)

            cls.optimizer_step = optimizer_step
            patched.append(f"{cls.__module__}.{cls.__qualname__}.optimizer_step")
        for mod, name, *_ in _LITE_PRECISIONS:
            lcls = _import_attr(mod, name)
            if lcls is None:
                continue

            def lite_step(self: Any, optimizer: Any, **kwargs: Any) -> Any:
                import torch_xla.core.xla_model as xm

                closure = kwargs.pop("closure", None)
                if closure is None:
                    return xm.optimizer_step(optimizer, optimizer_args=kwargs)
                result = optimizer.step(closure=partial(_reduce_after, optimizer, closure), **kwargs)
                xm.mark_step()
                return result

            lcls.optimizer_step = lite_step
            patched.append(f"{lcls.__module__}.{lcls.__qualname__}.optimizer_step")
        _installed["reference"] = patched
        return patched


def _import_attr(module: str, name: str) -> Any:
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001 - not installed / not importable
        return None


def _find_class(candidates: Sequence[Sequence[str]]) -> Any:
    for cand in candidates:
        cls = _import_attr(cand[0], cand[1])
        if cls is not None:
            return cls
    return None


def _disable_tpu_probe() -> List[str]:
    """Lightning's TPU availability probe starts a process (pickling a decorated function); from
    a replica thread that fails.  There is no TPU here: answer False without a probe."""
    with _install_lock:
        if "probe" in _installed:
            return _installed["probe"]
        done: List[str] = []
        for mod in ("lightning_lite.accelerators.tpu", "lightning.lite.accelerators.tpu",
                    "lightning_fabric.accelerators.tpu", "lightning.fabric.accelerators.tpu"):
            try:
                m = __import__(mod, fromlist=["_is_device_tpu"])
            except Exception:  # noqa: BLE001
                continue
            if hasattr(m, "_is_device_tpu"):
                m._is_device_tpu = lambda: False
                acc = getattr(m, "TPUAccelerator", None)
                cache_clear = getattr(getattr(acc, "is_available", None), "cache_clear", None)
                if cache_clear is not None:
                    cache_clear()
                done.append(f"{mod}._is_device_tpu")
        _installed["probe"] = done
        return done


def _make_net(torch: Any, device: Any, base: Any) -> Any:
    net = base()
    with torch.no_grad():
        # deterministic, replica-independent weights (torch.manual_seed is shared across threads)
        for i, p in enumerate(net.parameters()):
            p.copy_(torch.linspace(-0.5, 0.5, p.numel()).reshape(p.shape) * (i + 1))
    return net.to(device)


def _batch(torch: Any, device: Any, ordinal: int, step: int) -> Any:
    g = torch.Generator().manual_seed(1000 * ordinal + step)
    x = torch.randn(8, 4, generator=g)
    y = torch.randn(8, 2, generator=g)
    return x.to(device), y.to(device)


def _warmup(torch: Any, xm: Any, params: Sequence[Any], loss_fn: Any) -> List[Any]:
    """One forward/backward with no collective, executed; returns host copies of the params."""
    loss = loss_fn()
    loss.backward()
    xm.mark_step()  # real: the graph has no collective
    missing = [i for i, p in enumerate(params) if p.grad is None]
    if missing:
        raise RuntimeError(f"warm-up left parameters {missing} without a gradient")
    return [p.detach().cpu().clone() for p in params]


def _dump_and_neutralise(torch: Any, xm: Any, params: Sequence[Any], saved: Sequence[Any],
                         loss: Any) -> Dict[str, Any]:
    import torch_xla

    ir = torch_xla._XLAC._get_xla_tensors_text(list(params))
    hlo = torch_xla._XLAC._get_xla_tensors_hlo(list(params))
    loss_ir = torch_xla._XLAC._get_xla_tensors_text([loss]) if loss is not None else ""
    grads_ir = torch_xla._XLAC._get_xla_tensors_text([p.grad for p in params if p.grad is not None])
    analysis = analyze_ir(ir, hlo, loss_ir)
    analysis["grads_all_reduce_count"] = grads_ir.count(_ALL_REDUCE_IR + "(")
    analysis["ir_chars"] = len(ir)
    analysis["ir"] = ir
    analysis["hlo_all_reduce_lines"] = [_short(l.strip()) for l in hlo.splitlines()
                                        if _ALL_REDUCE_HLO.search(l)][:4]
    # drop every reference to the pending collective: never execute it
    device = params[0].device
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.data = s.to(device)
            p.grad = None
    return analysis


class _Box:
    loss = None


def _record_optimizer_steps(optimizer: Any) -> Any:
    """Record every ``optimizer.step`` call in the traced replica's event log (an instance attribute);
    returns the original bound ``step`` so the caller can put it back."""
    orig_step = optimizer.step

    def traced_step(*args: Any, **kwargs: Any) -> Any:
        _events().append("optimizer.step")
        return orig_step(*args, **kwargs)

    optimizer.step = traced_step
    return orig_step


def _trace_trainer(ordinal: int) -> Dict[str, Any]:
    import inspect

    import torch
    import torch_xla.core.xla_model as xm

    cls = _find_class(_TRAINER_PRECISIONS)
    if cls is None:
        return {"skipped": "no Lightning Trainer TPU/XLA precision plugin importable"}
    root = cls.__module__.split(".plugins")[0]
    import importlib

    plm = importlib.import_module(root)
    device = xm.xla_device()
    box = _Box()

    class Net(plm.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            _events().append("training_step")
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            box.loss = loss
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    model = _make_net(torch, device, Net)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=0.1)
    xb, yb = _batch(torch, device, ordinal, 0)
    saved = _warmup(torch, xm, params,
                    lambda: torch.nn.functional.mse_loss(model.layer(xb), yb))

    plugin = cls() if "precision" not in inspect.signature(cls.__init__).parameters else cls("32-true")
    strategies = importlib.import_module(root + ".strategies")
    trainer_mod = importlib.import_module(root + ".trainer.trainer")
    strategy = strategies.SingleDeviceStrategy(device=device, precision_plugin=plugin)
    route = _tls.route = []
    trainer = None
    probe = _disable_tpu_probe()
    if probe:
        route.append("test-only: " + ", ".join(probe) + " -> False (the TPU probe spawns a process, which a "
                     "replica thread cannot; the Trainer only uses it to pick defaults)")
    try:
        trainer = trainer_mod.Trainer(
            accelerator="cpu", devices=1, strategy=strategy, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, max_steps=1,
        )
        route.append("Trainer(strategy=SingleDeviceStrategy(xla device, precision_plugin=%s))" % cls.__name__)
    except Exception as exc:  # noqa: BLE001
        route.append(f"Trainer construction failed ({type(exc).__name__}: {exc}); stub trainer")
    if trainer is not None:
        strategy = trainer.strategy
        if strategy.precision_plugin is not plugin:
            route.append(f"trainer replaced the precision plugin by {type(strategy.precision_plugin).__name__}")
            strategy.precision_plugin = plugin
    strategy.connect(model)
    if trainer is not None:
        model.trainer = trainer
    optimizer_mod = importlib.import_module(root + ".core.optimizer")
    lopt = optimizer_mod.LightningOptimizer._to_lightning_optimizer(optimizer, strategy, 0) \
        if "opt_idx" in inspect.signature(optimizer_mod.LightningOptimizer._to_lightning_optimizer).parameters \
        else optimizer_mod.LightningOptimizer._to_lightning_optimizer(optimizer, strategy)
    loop_mod = importlib.import_module(root + ".loops.optimization.optimizer_loop")
    Closure, ClosureResult = loop_mod.Closure, loop_mod.ClosureResult

    x1, y1 = _batch(torch, device, ordinal, 1)

    def step_fn() -> Any:
        out = model.training_step((x1, y1), 1)
        return ClosureResult.from_training_step_output(out, 1)

    def zero_grad_fn() -> None:
        _events().append("zero_grad")
        optimizer.zero_grad()

    def backward_fn(loss: Any) -> None:
        _events().append("backward")
        bsig = inspect.signature(strategy.backward).parameters
        if "optimizer_idx" in bsig:
            strategy.backward(loss, optimizer, 0)
        else:
            strategy.backward(loss, optimizer)

    closure = Closure(step_fn=step_fn, backward_fn=backward_fn, zero_grad_fn=zero_grad_fn)
    route.append("LightningModule.optimizer_step -> LightningOptimizer.step -> Strategy.optimizer_step -> "
                 f"{cls.__name__}.optimizer_step")
    orig_step = _record_optimizer_steps(optimizer)
    _tls.tracing, _tls.events, _tls.traced = True, [], True
    try:
        osig = inspect.signature(model.optimizer_step).parameters
        if "optimizer_idx" in osig:
            model.optimizer_step(0, 1, lopt, 0, closure)
        else:
            model.optimizer_step(0, 1, lopt, closure)
        events = list(_events())
        res = _dump_and_neutralise(torch, xm, params, saved, box.loss)
    finally:
        _tls.tracing = False
        optimizer.step = orig_step
    res.update(events=events, impl=f"{cls.__module__}.{cls.__qualname__}", route=route)
    return res


def _trace_lite(ordinal: int) -> Dict[str, Any]:
    import importlib
    import inspect

    import torch
    import torch_xla.core.xla_model as xm

    found = None
    for mod, name, wmod, wname, smod in _LITE_PRECISIONS:
        cls = _import_attr(mod, name)
        wrapper = _import_attr(wmod, wname)
        if cls is not None and wrapper is not None:
            found = (cls, wrapper, smod)
            break
    if found is None:
        return {"skipped": "no Lite/Fabric TPU/XLA precision plugin importable"}
    cls, wrapper, smod = found
    device = xm.xla_device()
    box = _Box()
    net = _make_net(torch, device, lambda: torch.nn.Linear(4, 2))
    params = list(net.parameters())
    optimizer = torch.optim.SGD(params, lr=0.1)
    xb, yb = _batch(torch, device, ordinal, 0)
    saved = _warmup(torch, xm, params, lambda: torch.nn.functional.mse_loss(net(xb), yb))

    precision = cls() if "precision" not in inspect.signature(cls.__init__).parameters else cls("32-true")
    strategy = importlib.import_module(smod).SingleDeviceStrategy(device=device, precision=precision)
    wsig = inspect.signature(wrapper.__init__).parameters
    lite_opt = wrapper(optimizer=optimizer, strategy=strategy) if "callbacks" not in wsig \
        else wrapper(optimizer=optimizer, strategy=strategy, callbacks=[])
    x1, y1 = _batch(torch, device, ordinal, 1)

    def closure() -> Any:
        _events().append("training_step")
        loss = torch.nn.functional.mse_loss(net(x1), y1)
        box.loss = loss
        _events().append("zero_grad")
        optimizer.zero_grad()
        _events().append("backward")
        strategy.backward(loss, net) if "module" in inspect.signature(strategy.backward).parameters \
            else loss.backward()
        return loss

    orig_step = _record_optimizer_steps(optimizer)
    _tls.tracing, _tls.events, _tls.traced = True, [], True
    try:
        lite_opt.step(closure)
        events = list(_events())
        res = _dump_and_neutralise(torch, xm, params, saved, box.loss)
    finally:
        _tls.tracing = False
        optimizer.step = orig_step
    res.update(events=events, impl=f"{cls.__module__}.{cls.__qualname__}",
               route=[f"{wrapper.__name__}.step(closure) -> Strategy.optimizer_step -> {cls.__name__}.optimizer_step"])
    return res


_TRACERS = {"trainer": _trace_trainer, "lite": _trace_lite}


def _replica_main(mode: str, paths: Sequence[str]) -> Dict[str, Any]:
    """Runs in every replica thread (inside run_multiprocess's worker process)."""
    import traceback

    import torch_xla.core.xla_model as xm

    _arm_stack_dump()
    _install_interceptors()
    if mode == "reference":
        _apply_reference_fix()
    ordinal = xm.get_ordinal()
    out: Dict[str, Any] = {"ordinal": ordinal, "world_size": xm.xrt_world_size(), "paths": {}}
    for path in paths:
        try:
            out["paths"][path] = _TRACERS[path](ordinal)
        except Exception as exc:  # noqa: BLE001
            _tls.tracing = False
            out["paths"][path] = {"error": f"{type(exc).__name__}: {exc}",
                                  "traceback": traceback.format_exc()[-3000:],
                                  "route": list(getattr(_tls, "route", []) or [])}
        _tls.route = None
    out["shim"] = _shim_status()
    return out


def _shim_status() -> Any:
    mod = sys.modules.get("tpu_closure_fix")
    fn = getattr(mod, "status", None)
    if fn is None:
        return None
    try:
        st = fn()
        json.dumps(st, default=str)
        return st
    except Exception as exc:  # noqa: BLE001
        return f"status() failed: {exc}"


def _merge(per_replica: Dict[int, Dict[str, Any]], paths: Sequence[str]) -> Dict[str, Any]:
    merged: Dict[str, Any] = {}
    for path in paths:
        entries = {o: r["paths"].get(path, {}) for o, r in sorted(per_replica.items())}
        first = next(iter(entries.values()), {})
        summary = {k: v for k, v in first.items() if k not in ("ir", "traceback")}
        summary["ir"] = first.get("ir", "")
        if "traceback" in first:
            summary["traceback"] = first["traceback"]
        keys = ("all_reduce_count", "hlo_all_reduce_count", "operands_from_backward",
                "update_consumes_all_reduce", "events", "error", "skipped")
        summary["per_replica"] = {o: {k: e.get(k) for k in keys if k in e} for o, e in entries.items()}
        summary["replicas_agree"] = len({json.dumps(v, sort_keys=True, default=str)
                                         for v in summary["per_replica"].values()}) == 1
        merged[path] = summary
    return merged


def _child(mode: str, paths: Sequence[str]) -> int:
    t0 = time.monotonic()
    payload: Dict[str, Any] = {"error": None}
    try:
        if mode == "shim":
            import tpu_closure_fix  # noqa: F401 - enables the shim unless TPU_CLOSURE_FIX=0
        import torch
        import torch_xla
        from torch_xla._internal import pjrt

        payload["versions"] = {"torch": torch.__version__, "torch_xla": getattr(torch_xla, "__version__", "?")}
        for dist in ("pytorch_lightning", "lightning", "lightning_lite", "lightning_fabric"):
            mod = _import_attr(dist, "__version__")
            if mod is not None:
                payload["versions"][dist] = str(mod)
        payload["paths"] = {}
        for path in paths:
            # one fresh replica process per path: a traced step leaves a pending collective (and
            # the device's all-reduce token) behind, so nothing may ever be executed after it
            per_replica = pjrt.run_multiprocess(_replica_main, mode, [path])
            payload["per_replica_ordinals"] = sorted(per_replica)
            payload["world_size"] = next(iter(per_replica.values()))["world_size"]
            payload.setdefault("shim", {})[path] = next(iter(per_replica.values())).get("shim")
            payload["paths"].update(_merge(per_replica, [path]))
        errors = [f"{p}: {v['error']}" for p, v in payload["paths"].items() if v.get("error")]
        if errors:
            payload["error"] = "; ".join(errors)
        payload["ok"] = not errors
    except BaseException as exc:  # noqa: BLE001
        import traceback

        payload.update(ok=False, error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc()[-3000:])
    payload["child_seconds"] = round(time.monotonic() - t0, 1)
    sys.stdout.write(_RESULT_MARK + json.dumps(payload, default=str) + "\n")
    sys.stdout.flush()
    # never let interpreter shutdown touch pending XLA graphs
    os._exit(0 if payload.get("ok") else 3)


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tpu_closure_fix.graphcheck", description=__doc__.split("\n")[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="shim", choices=_MODES)
    ap.add_argument("--paths", default="trainer,lite")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--python", default=None)
    ap.add_argument("--ir", action="store_true", help="print the full IR of each path")
    args = ap.parse_args(argv)
    paths = [p for p in args.paths.split(",") if p]
    if args.child:
        return _child(args.mode, paths)
    res = run_graph_check(args.timeout, python=args.python, replicas=args.replicas, mode=args.mode, paths=paths)
    for name, p in res.get("paths", {}).items():
        if not args.ir:
            p.pop("ir", None)
    print(json.dumps(res, indent=2, default=str))
    return 0 if res.get("ok") else 1


if __name__ == "__main__":
    # run through the importable module so that run_multiprocess can pickle _replica_main by
    # reference (``tpu_closure_fix.graphcheck._replica_main``, not ``__main__._replica_main``)
    from tpu_closure_fix import graphcheck as _gc

    sys.exit(_gc.main())

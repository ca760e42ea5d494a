"""Real-torch_xla graph evidence: where does the gradient all-reduce sit in one training step?

:func:`run_graph_check` starts a child interpreter (hard timeout, own process group; see
:mod:`tpu_closure_fix.verify.child`) which

1. lists the installed call sites from the table (:func:`tpu_closure_fix.verify.table.sites_to_verify`:
   for each, the row the engine matched for the loaded release) and
2. for each site, starts ``PJRT_DEVICE=CPU CPU_NUM_DEVICES=<replicas>`` replicas through
   ``torch_xla._internal.pjrt.run_multiprocess`` (a fresh replica process per site: a traced step
   leaves a pending collective behind, so nothing may ever be executed after it).  In every replica,
   the site's integration driver (``graph_step``) builds one training step through the row's class
   and method, and this harness
3. runs one warm-up forward/backward with **no collective** and executes it, so every parameter
   has a materialised ``.grad`` (the unfixed order all-reduces the *previous* gradients before the
   closure; an all-reduce of an empty list segfaults torch_xla);
4. runs the step lazily with every graph cut (``torch_xla.sync``, ``xm.mark_step``) intercepted:
   recorded, never run.  Nothing is executed: XLA collectives on the CPU hang (torch_xla 2.1) or
   abort (2.9);
5. dumps the pending graph of the parameters and analyses it (:func:`tpu_closure_fix.verify.ir.analyze_ir`);
6. drops every reference to the pending collective (parameters restored from the warm-up values,
   gradients set to None) and refuses any real graph cut afterwards.

torch_xla API differences are handled by feature detection (:mod:`tpu_closure_fix.verify.xla_api`).
The shim is in whatever state ``import tpu_closure_fix`` leaves it in the child, i.e. enabled
unless ``TPU_CLOSURE_FIX=0`` (the environment is passed through).

Nothing heavy is imported at module import time: torch, torch_xla and the frameworks are imported
inside the functions that run in the child.
"""
import gc
import json
import os
import sys
import threading
import time

from . import child as _child
from .driver import TracedStep  # noqa: F401 - what a driver's graph_step returns (see .driver)
from .ir import ALL_REDUCE_HLO, ALL_REDUCE_IR, analyze_ir, short_line

__all__ = ["graph_check_available", "run_graph_check", "analyze_ir", "TracedStep", "MODES", "site_ok"]

MODES = ("shim", "reference", "unpatched")


# --------------------------------------------------------------------------------------------
# parent side (cheap, no heavy imports)
# --------------------------------------------------------------------------------------------

def graph_check_available(python=None, timeout=60, env=None):
    """True when torch_xla is importable (in this interpreter, or in ``python`` if given, with the variables of
    ``env`` over this process's, as the graph check will start it)."""
    # compare launcher paths, not realpaths: every venv's python is a symlink to the same binary
    if python is None or os.path.abspath(python) == os.path.abspath(sys.executable):
        import importlib.util

        try:
            return importlib.util.find_spec("torch_xla") is not None
        except (ImportError, ValueError):
            return False
    code = "import importlib.util, json; print(%r + json.dumps(importlib.util.find_spec('torch_xla') is not None))" \
        % _child.RESULT_MARK
    try:
        run = _child.run_child(_child.python_code(code, python=python), timeout,
                               env=_child.safe_environment(dict(os.environ, **(env or {}))))
    except OSError:
        return False
    return run.payload is True


def child_environment(replicas, mode, timeout, env=None):
    """The graph-check child's environment: CPU PJRT with ``replicas`` devices, no TPU/GPU settings."""
    child_env = dict(os.environ)
    child_env.update(env or {})
    child_env["PJRT_DEVICE"] = "CPU"
    child_env["CPU_NUM_DEVICES"] = str(replicas)
    child_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    child_env.setdefault("OMP_NUM_THREADS", "1")
    for name in ("XRT_TPU_CONFIG", "TPU_NUM_DEVICES", "GPU_NUM_DEVICES"):
        child_env.pop(name, None)
    if mode != "shim":
        child_env["TPU_CLOSURE_FIX"] = "0"
    # stacks of a hung child land in its stderr before the kill
    child_env["TPU_CLOSURE_FIX_GRAPHCHECK_DUMP_AFTER"] = str(max(5.0, timeout - 10.0))
    return child_env


def run_graph_check(timeout=600.0, python=None, replicas=2, mode="shim", env=None, verdicts=None):
    """Trace one training step per installed call site on ``replicas`` CPU replicas of real torch_xla.

    Runs in a child interpreter (``python``, default this one), killed as a whole after
    ``timeout`` seconds.  ``mode``: ``"shim"`` (the child imports ``tpu_closure_fix``, so the shim
    is on unless ``TPU_CLOSURE_FIX=0``), ``"reference"`` (shim off; the upstream fix order written
    by hand replaces each patchable site's method: a self-test of the harness) or ``"unpatched"``
    (shim off, the framework as installed).

    Returns ``{"ok": bool, "error": str|None, "seconds", "replicas", "mode", "python",
    "versions": {...}, "world_size", "sites": {site id: {...}}}``; each site holds ``variant``,
    ``verdict`` (status in the child), ``impl`` (the class traced), ``route``, ``events`` (call
    order seen in the step), ``all_reduce_count`` (IR), ``hlo_all_reduce_count``,
    ``operands_from_backward``, ``update_consumes_all_reduce``, ``excerpt`` (IR lines),
    ``per_replica``, ``replicas_agree``, and ``error``/``traceback`` when it could not be traced.
    ``untested``: installed sites whose integration has no verification driver (not traced).
    ``verdicts``: trace only the sites whose status verdict (in the child) is one of these.
    """
    if mode not in MODES:
        raise ValueError("mode must be one of %s, got %r" % (", ".join(MODES), mode))
    if replicas < 2:
        raise ValueError("replicas must be at least 2 (the all-reduce is a no-op with fewer), got %r" % replicas)
    python = python or sys.executable
    argv = _child.python_command("tpu_closure_fix.verify.graph", "--child", "--mode", mode, python=python)
    if verdicts:
        argv += ["--verdicts", ",".join(verdicts)]
    environment = _child.safe_environment(child_environment(replicas, mode, timeout, env))
    with _child.only_this_package_on_path(environment) as (child_env, folder):
        run = _child.run_child(argv, timeout, env=child_env, cwd=folder)
    result = {"ok": False, "error": None, "mode": mode, "replicas": replicas, "python": python, "sites": {},
              "seconds": run.seconds}
    if run.payload is None:
        result.update(error="graph-check process %s" % run.error, stderr_tail=run.stderr_tail())
        return result
    result.update(run.payload)
    if result.get("error"):
        result["stderr_tail"] = run.stderr_tail()
    return result


def site_ok(info):
    """A traced site shows the fixed order: one all-reduce per step, fed by this step's backward,
    feeding the parameter update."""
    return info.get("all_reduce_count") == 1 and bool(info.get("operands_from_backward")) and \
        bool(info.get("update_consumes_all_reduce"))


# --------------------------------------------------------------------------------------------
# child side (runs inside the XLA interpreter)
# --------------------------------------------------------------------------------------------

_tls = threading.local()
_install_lock = threading.Lock()
_installed = {}


def _events():
    ev = getattr(_tls, "events", None)
    if ev is None:
        ev = _tls.events = []
    return ev


class Harness(object):
    """What a driver's ``graph_step`` builds a step with, in one replica thread."""

    def __init__(self, torch, device, ordinal):
        self.torch, self.device, self.ordinal = torch, device, ordinal
        self.loss = None  # the traced step's loss (set by the driver's training step)
        self.route = []

    def record(self, event):
        _events().append(event)

    def note(self, line):
        self.route.append(line)

    def once(self, name, action):
        """Run a process-wide preparation once (replicas are threads of one process)."""
        with _install_lock:
            if name not in _installed:
                _installed[name] = action()
            return _installed[name]

    def make_net(self, factory):
        """``factory()`` with deterministic, replica-independent weights, moved to the device."""
        net = factory()
        with self.torch.no_grad():
            # torch.manual_seed is shared across replica threads: fill the weights explicitly
            for i, p in enumerate(net.parameters()):
                p.copy_(self.torch.linspace(-0.5, 0.5, p.numel()).reshape(p.shape) * (i + 1))
        return net.to(self.device)

    def batch(self, step):
        """This replica's batch ``step`` (each replica sees different data), on the device."""
        g = self.torch.Generator().manual_seed(1000 * self.ordinal + step)
        x = self.torch.randn(8, 4, generator=g)
        y = self.torch.randn(8, 2, generator=g)
        return x.to(self.device), y.to(self.device)


def _arm_stack_dump():
    """Dump every thread's stack to stderr shortly before the parent's hard timeout."""
    with _install_lock:
        if _installed.get("faulthandler"):
            return
        after = float(os.environ.get("TPU_CLOSURE_FIX_GRAPHCHECK_DUMP_AFTER", "0") or 0)
        if after > 0:
            import faulthandler

            faulthandler.dump_traceback_later(after, exit=False)
        _installed["faulthandler"] = True


def _intercepted_barrier(label, real):
    def barrier(*args, **kwargs):
        if getattr(_tls, "tracing", False):
            _events().append("barrier %s (intercepted, not executed)" % label)
            return None
        if getattr(_tls, "traced", False):
            # this replica holds a pending collective: executing anything now would run it
            raise RuntimeError("graph check: refusing a real %s after a traced step" % label)
        return real(*args, **kwargs)

    barrier.__wrapped__ = real
    return barrier


def _install_interceptors():
    """Process-wide, thread-aware wrappers around every graph cut and ``xm.reduce_gradients``."""
    from . import xla_api

    with _install_lock:
        if _installed.get("interceptors"):
            return
        import torch_xla.core.xla_model as xm

        for owner, name in xla_api.barrier_functions():
            label = "xm.%s" % name if owner is xm else "%s.%s" % (owner.__name__, name)
            setattr(owner, name, _intercepted_barrier(label, getattr(owner, name)))
        real_reduce = xm.reduce_gradients

        def reduce_gradients(optimizer, *args, **kwargs):
            if getattr(_tls, "tracing", False):
                n = sum(1 for g in optimizer.param_groups for p in g["params"] if p.grad is not None)
                _events().append("xm.reduce_gradients (%d grads present)" % n)
                if n == 0:
                    # all_reduce of an empty list segfaults torch_xla: refuse, and say so
                    _events().append("xm.reduce_gradients skipped: no gradient (would segfault)")
                    return None
            return real_reduce(optimizer, *args, **kwargs)

        reduce_gradients.__wrapped__ = real_reduce
        xm.reduce_gradients = reduce_gradients
        _installed["interceptors"] = True


def _warmup(step):
    """One forward/backward with no collective, executed; returns host copies of the params."""
    from . import xla_api

    step.warmup_loss().backward()
    xla_api.barrier()  # real: the graph has no collective
    missing = [i for i, p in enumerate(step.params) if p.grad is None]
    if missing:
        raise RuntimeError("warm-up left parameters %s without a gradient" % missing)
    return [p.detach().cpu().clone() for p in step.params]


def _dump_and_neutralise(torch, params, saved, loss):
    import torch_xla

    text_of, hlo_of = torch_xla._XLAC._get_xla_tensors_text, torch_xla._XLAC._get_xla_tensors_hlo
    ir = text_of(list(params))
    hlo = hlo_of(list(params))
    loss_ir = text_of([loss]) if loss is not None else ""
    grads_ir = text_of([p.grad for p in params if p.grad is not None])
    analysis = analyze_ir(ir, hlo, loss_ir)
    analysis["grads_all_reduce_count"] = grads_ir.count(ALL_REDUCE_IR + "(")
    analysis["ir_chars"] = len(ir)
    analysis["ir"] = ir
    analysis["hlo_all_reduce_lines"] = [short_line(l.strip()) for l in hlo.splitlines()
                                        if ALL_REDUCE_HLO.search(l)][:4]
    # drop every reference to the pending collective: never execute it
    device = params[0].device
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.data = s.to(device)
            p.grad = None
    return analysis


def _record_optimizer_steps(optimizer):
    """Record every ``optimizer.step`` call in this replica's event log (an instance attribute);
    returns the original bound ``step`` so the caller can put it back."""
    orig_step = optimizer.step

    def traced_step(*args, **kwargs):
        _events().append("optimizer.step")
        return orig_step(*args, **kwargs)

    optimizer.step = traced_step
    return orig_step


def _trace(target, harness):
    """Warm up, trace and analyse one step of ``target`` (one replica thread)."""
    from . import table

    step = table.driver_for(target.row).graph_step(target, harness)
    # whatever the driver built but did not keep (``TracedStep.keep``) goes now, every time, rather than
    # whenever the cyclic collector happens to run during the step (a weak proxy failing at random)
    gc.collect()
    saved = _warmup(step)
    orig_step = _record_optimizer_steps(step.optimizer)
    _tls.tracing, _tls.events, _tls.traced = True, [], True
    try:
        step.run()
        events = list(_events())
        result = _dump_and_neutralise(harness.torch, step.params, saved, harness.loss)
    finally:
        _tls.tracing = False
        step.optimizer.step = orig_step
    result.update(events=events, route=harness.route + list(step.route))
    return result


def _site_state(target):
    """What is in place at the traced method now, in this replica: our wrapper or not."""
    from .. import engine

    current = vars(target.owner).get(target.attribute) if target.owner is not None else target.function
    return {"impl": "%s.%s" % (target.owner.__module__, target.owner.__qualname__) if target.owner is not None
            else "%s.%s" % (target.module.__name__, target.attribute), "wrapped_by_shim": engine.is_ours(current)}


def _replica_main(mode, variant):
    """Runs in every replica thread (inside run_multiprocess's worker process)."""
    import traceback

    import torch

    from . import table, xla_api

    _arm_stack_dump()
    _install_interceptors()
    out = {}
    try:
        out.update(ordinal=xla_api.ordinal(), world_size=xla_api.world_size())
        target = table.resolve(table.row_by_variant(variant))
        if mode == "reference":
            with _install_lock:
                if "reference" not in _installed:
                    table.driver_for(target.row).reference_fix(target)
                    _installed["reference"] = True
            target = table.resolve(target.row)
        out.update(_site_state(target))
        harness = Harness(torch, xla_api.device(), out["ordinal"])
        out.update(_trace(target, harness))
    except Exception as exc:  # noqa: BLE001 - the site could not be traced: reported, with the reason
        _tls.tracing = False
        out.update(error="%s: %s" % (type(exc).__name__, exc), traceback=traceback.format_exc()[-3000:])
    return out


_KEPT_PER_REPLICA = ("all_reduce_count", "hlo_all_reduce_count", "operands_from_backward",
                     "update_consumes_all_reduce", "events", "error")


def _merge(per_replica):
    """One summary per site: the first replica's full result plus every replica's key figures."""
    entries = [entry for _, entry in sorted(per_replica.items())]
    summary = dict(entries[0]) if entries else {"error": "no replica returned a result"}
    summary["per_replica"] = {o: {k: e.get(k) for k in _KEPT_PER_REPLICA if k in e}
                              for o, e in sorted(per_replica.items())}
    summary["replicas_agree"] = len({json.dumps(v, sort_keys=True, default=str)
                                     for v in summary["per_replica"].values()}) == 1
    errors = sorted({e["error"] for e in entries if e.get("error")})
    if errors:
        summary["error"] = "; ".join(errors)
    return summary


def _versions():
    import importlib

    versions = {}
    for name in ("torch", "torch_xla"):
        versions[name] = getattr(importlib.import_module(name), "__version__", "?")
    return versions


def child_main(mode, verdicts=None):
    t0 = time.monotonic()
    payload = {"ok": False, "error": None, "sites": {}, "untested": []}
    try:
        if mode == "shim":
            import tpu_closure_fix  # noqa: F401 - enables the shim unless TPU_CLOSURE_FIX=0
        from torch_xla._internal import pjrt

        from . import table

        payload["versions"] = _versions()
        chosen = [(record, row) for record, row in table.sites_to_verify()
                  if not verdicts or record["verdict"] in verdicts]
        payload["untested"] = table.untested(chosen)
        chosen = [(record, row) for record, row in chosen if table.missing_driver(row) is None]
        if not chosen and not payload["untested"]:
            raise LookupError("no installed call site to trace (none patched, fixed upstream, guarded or disabled)")
        for record, row in chosen:
            # a fresh replica process per site: a traced step leaves a pending collective behind
            per_replica = pjrt.run_multiprocess(_replica_main, mode, row.variant)
            site = _merge(per_replica)
            site.update(variant=row.variant, verdict=record["verdict"], release=record.get("release"))
            payload["world_size"] = site.get("world_size")
            payload["sites"][table.site_id(row)] = site
            payload["versions"][row.package] = record.get("release")
        errors = ["%s: %s" % (name, s["error"]) for name, s in payload["sites"].items() if s.get("error")]
        if errors:
            payload["error"] = "; ".join(errors)
        payload["ok"] = not errors and bool(payload["sites"])
    except BaseException as exc:  # noqa: BLE001
        import traceback

        payload.update(ok=False, error="%s: %s" % (type(exc).__name__, exc), traceback=traceback.format_exc()[-3000:])
    payload["child_seconds"] = round(time.monotonic() - t0, 1)
    _child.emit(payload)
    # never let interpreter shutdown touch pending XLA graphs
    os._exit(0)


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tpu_closure_fix.verify.graph",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="shim", choices=MODES)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--verdicts", default="", help="only sites with one of these status verdicts (comma-separated)")
    ap.add_argument("--python", default=None)
    ap.add_argument("--ir", action="store_true", help="print the full IR of each site")
    args = ap.parse_args(argv)
    verdicts = [v for v in args.verdicts.split(",") if v]
    if args.child:
        return child_main(args.mode, verdicts)
    res = run_graph_check(args.timeout, python=args.python, replicas=args.replicas, mode=args.mode, verdicts=verdicts)
    if not args.ir:
        for site in res.get("sites", {}).values():
            site.pop("ir", None)
    print(json.dumps(res, indent=2, default=str))
    return 0 if res.get("ok") else 1


if __name__ == "__main__":
    # run through the importable module so that run_multiprocess can pickle _replica_main by
    # reference (``tpu_closure_fix.verify.graph._replica_main``, not ``__main__._replica_main``)
    from tpu_closure_fix.verify import graph as _graph

    sys.exit(_graph.main())

"""The lifecycle contract's cases, run against site families in one child process.

Run as ``python -S -m support.lifecycle FAMILY OUT [FAMILY OUT ...]`` (``tests``, the repo, the
target and the base venv's site-packages on PYTHONPATH; ``-S`` keeps the .pth
auto-enable out of the picture, so only the listed operations act). torch is
imported once; then every case, and every branch of the orderings walk, runs in
a forked child, so each starts from a process where neither the framework nor
the shim is imported yet. Each writes one JSON line to OUT; the assertions are
in tests/target/lifecycle_contract.py.

Cases (``case`` field of each line):

* ``order``: one per order of {import the framework, import the shim, enable,
  disable, enable again, reload the site's module} (45 orders; enable/disable
  need the shim imported, reload needs the framework). The walk goes depth
  first and forks at every branch, so each distinct prefix runs once.
* ``enable-disable``: enable twice, disable twice, enable again; the wrapper
  depth and the identity of the original after each.
* ``switch-off``: TPU_CLOSURE_FIX=0 (the twin of every "patched" case).
* ``wrapped-on-top``: another library wraps the site on top of ours; disable()
  cannot remove ours, which must then pass calls through to the original.
* ``held-across-reload``: objects built before ``importlib.reload`` of the
  site's module keep the old class (or function) with our wrapper; after
  disable() they must run the original, after enable() the fix again.
* ``fix-unavailable``: the family's fix cannot be prepared (its ``prepare``
  raises): the original code stays in place, one warning, status says so.
"""
import importlib
import itertools
import json
import os
import sys
import warnings

from support.layers import depth, innermost


OPS = ("framework", "shim", "enable", "disable", "enable", "reload")
CASES = ("enable-disable", "switch-off", "wrapped-on-top", "held-across-reload", "fix-unavailable")

_captured = []


# --------------------------------------------------------------------------- orders
def valid(order):
    """enable/disable need the shim imported; reload needs the framework imported."""
    shim = order.index("shim")
    return all(order.index(op) > shim for op in ("enable", "disable")) and \
        order.index("reload") > order.index("framework")


def orders():
    return sorted({o for o in itertools.permutations(OPS) if valid(o)})


def expected_depth(order):
    """1 when the last of {import the shim, enable, disable} is not ``disable``, else 0."""
    last = [op for op in order if op in ("shim", "enable", "disable")][-1]
    return 0 if last == "disable" else 1


def reloaded_while_off_then_enabled(order):
    """A reload while the shim was off, followed by an enable: the classes built before the reload
    (a subclass that inherits the site) keep the unpatched original."""
    enabled, stale = False, False
    for op in order:
        if op in ("shim", "enable"):
            if stale:
                return True
            enabled = True
        elif op == "disable":
            enabled = False
        elif op == "reload" and not enabled:
            stale = True
    return False


# --------------------------------------------------------------------------- observation
def _capture_warnings():
    """Record every warning the shim issues (the user would see them on stderr)."""
    shown = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if "tpu-closure-fix" in str(message) or category.__name__ == "TPUClosureFixWarning":
            _captured.append("%s: %s" % (category.__name__, message))
        return shown(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning


def status_of(family):
    """The status() record of the family's site: {"verdict", "reason"}."""
    import tpu_closure_fix

    for record in tpu_closure_fix.status():
        if (record["module"], record["method"]) == (family.module, family.qualname):
            return {"verdict": record["verdict"], "reason": record["reason"]}
    return None


def snapshot(family, held=None):
    return {"depth": depth(family.current()), "events": family.step(held), "status": status_of(family)}


# --------------------------------------------------------------------------- cases
def case_enable_disable(family):
    import tpu_closure_fix

    family.import_framework()
    original = innermost(family.current())
    out = {}
    for stage, action in (("enable_twice", lambda: (tpu_closure_fix.enable(), tpu_closure_fix.enable())),
                          ("disable", tpu_closure_fix.disable), ("disable_twice", tpu_closure_fix.disable),
                          ("enable_again", tpu_closure_fix.enable)):
        action()
        current = family.current()
        out[stage] = {"depth": depth(current), "is_original": current is original,
                      "wraps_original": innermost(current) is original}
    out["events"] = family.step()
    return out


def case_switch_off(family):
    os.environ["TPU_CLOSURE_FIX"] = "0"
    import tpu_closure_fix

    family.import_framework()
    out = snapshot(family)
    out["enabled"] = tpu_closure_fix.is_enabled()
    return out


def case_wrapped_on_top(family):
    import wrapt

    import tpu_closure_fix
    from support import xla_standin

    family.import_framework()
    ours = family.current()
    owner, attr = family.site()

    def other_library(wrapped, instance, args, kwargs):  # e.g. a tracer, patched after us
        xla_standin.record("other-library")
        return wrapped(*args, **kwargs)

    wrapt.wrap_function_wrapper(owner, attr, other_library)
    out = {"ours_patched": depth(ours) == 1}
    tpu_closure_fix.enable()  # no layer added under or over the other library's
    out["enabled"] = snapshot(family)
    tpu_closure_fix.disable()
    out["disabled"] = snapshot(family)
    out["disabled"]["ours_still_inside"] = family.current().__wrapped__ is ours
    tpu_closure_fix.enable()
    out["enabled_again"] = snapshot(family)
    return out


def case_held_across_reload(family):
    import tpu_closure_fix

    family.import_framework()
    held = family.hold()
    before = family.current()
    out = {"held": family.step(held)}
    family.reload()
    out["replaced"] = family.current() is not before
    out["reloaded"] = {"new": snapshot(family), "held": family.step(held)}
    tpu_closure_fix.disable()
    out["disabled"] = {"new": snapshot(family), "held": family.step(held)}
    tpu_closure_fix.enable()
    out["enabled_again"] = {"new": snapshot(family), "held": family.step(held)}
    return out


def case_fix_unavailable(family):
    import importlib

    module_name, class_name = family.fix_class.split(":")
    fix_class = getattr(importlib.import_module(module_name), class_name)  # activates the shim

    def broken_prepare(self, site, original, switch):
        raise RuntimeError("injected fault in prepare()")

    fix_class.prepare = broken_prepare
    family.import_framework()
    return snapshot(family)


CASE_FUNCTIONS = {"enable-disable": case_enable_disable, "switch-off": case_switch_off,
                  "wrapped-on-top": case_wrapped_on_top, "held-across-reload": case_held_across_reload,
                  "fix-unavailable": case_fix_unavailable}


# --------------------------------------------------------------------------- orderings walk
def apply(family, op):
    if op == "framework":
        family.import_framework()
    elif op == "shim":
        import tpu_closure_fix  # noqa: F401
    elif op == "enable":
        sys.modules["tpu_closure_fix"].enable()
    elif op == "disable":
        sys.modules["tpu_closure_fix"].disable()
    elif op == "reload":
        family.reload()


def leaf(family, prefix):
    return {"case": "order", "order": prefix, "depth": depth(family.current()), "events": family.step(),
            "status": status_of(family)}


# --------------------------------------------------------------------------- process plumbing
def _write(out, record):
    record["warnings"] = list(_captured)
    with open(out, "a") as handle:
        handle.write(json.dumps(record, default=str) + "\n")


def _in_child(out, name, work, **info):
    """Run ``work()`` in a forked child that writes its record (or its error) to ``out``; wait for it."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            work()
        except BaseException as exc:
            import traceback

            _write(out, dict(info, case=name, error="%r\n%s" % (exc, traceback.format_exc())))
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    os.waitpid(pid, 0)  # one child at a time: modest CPU


def walk(family, out, todo, prefix):
    branches = [o for o in todo if o[:len(prefix)] == prefix]
    if len(branches) == 1 and len(branches[0]) == len(prefix):
        _write(out, leaf(family, prefix))
        return
    for op in sorted({o[len(prefix)] for o in branches if len(o) > len(prefix)}):
        def work(op=op):
            apply(family, op)
            walk(family, out, todo, prefix + [op])

        _in_child(out, "order", work, order=prefix + [op])


#: Top-level packages whose import is an operation of the contract (the framework's, the stand-in's, the
#: shim's): none of them may be loaded before the first fork.
NOT_PRELOADED = ("tpu_closure_fix", "torch_xla", "pytorch_lightning", "lightning", "lightning_lite",
                 "lightning_fabric", "accelerate", "wrapt")


def _warm_up_torch():
    """One optimizer step with a closure in plain torch, before the first fork: torch's first step imports
    and initialises much lazily (seconds), which every child would otherwise pay again."""
    import torch

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def closure():
        optimizer.zero_grad()
        loss = model(torch.ones(2, 2)).pow(2).mean()
        loss.backward()
        return loss

    optimizer.step(closure)


def _preload(family):
    """Import the framework's own dependencies (never the framework, the stand-in or the shim) before
    the first fork, so each child imports only what the contract is about."""
    for name in family.preloaded:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    loaded = [name for name in NOT_PRELOADED if name in sys.modules]
    if loaded:
        raise RuntimeError("preloading %s imported %s" % (family.name, ", ".join(loaded)))


def main(argv=None):
    """``FAMILY OUT [FAMILY OUT ...]``: each family's cases and walk in turn, from the same parent (torch
    imported once for all of them; each family's preloads only add dependencies, never a framework)."""
    args = list(argv or sys.argv[1:])
    if not args or len(args) % 2:
        raise SystemExit("usage: python -S -m support.lifecycle FAMILY OUT [FAMILY OUT ...]")
    from support import families

    _capture_warnings()
    _warm_up_torch()  # torch is shared by every child: imported once, before the first fork
    for name, out in zip(args[::2], args[1::2]):
        family = families.family(name)
        _preload(family)
        for case in CASES:
            _in_child(out, case, lambda case=case: _write(out, dict(CASE_FUNCTIONS[case](family), case=case)))
        walk(family, out, [list(o) for o in orders()], [])
    return 0


if __name__ == "__main__":
    sys.exit(main())

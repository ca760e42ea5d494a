"""Event-order self-test for ``tpu-closure-fix check``: needs no TPU and no torch_xla.

In a child process (the caller's process is never touched) it lists the installed call sites
from the table (:func:`tpu_closure_fix.verify.table.sites_to_verify`: the row the engine matched
for the loaded release), puts a *recording* stand-in where ``import torch_xla.core.xla_model``
finds it (child only), and lets each site's integration driver (``event_step``) run one optimizer
step through exactly that row's class and method.

The stand-in records ``reduce_gradients`` (with whether gradients existed) and ``mark_step``; the
driver records ``forward``, ``backward`` and ``step``.  A site passes when every gradient
reduction comes after the backward of the same step and before the optimizer's update: the
order of the upstream fix.

Result of :func:`run_event_check`: ``{"ok": bool, "error": str|None, "sites": [...], "untested":
[...]}``; each site is ``{"site", "variant", "verdict", "events", "ok", "error"}``, where ``error``
(the exception line) means the step could not run, so the order is unknown, not wrong.
``untested`` lists the installed sites whose integration has no verification driver (``{"site",
"variant", "verdict", "reason"}``).
"""
import os
import sys

from . import child as _child
from .driver import record_each_step  # noqa: F401 - the drivers' recorder, kept importable here

__all__ = ["run_event_check", "verdict", "record_each_step", "install_recording_xla_model", "run_event_step"]

_EVENTS = []


def _record(name, **info):
    if name == "reduce_gradients" and not info.get("grads"):
        name = "reduce_gradients(no grads)"
    _EVENTS.append(name)


def install_recording_xla_model():
    """The package's CPU simulation of torch_xla (world size 1) with an event recorder, in this child only."""
    from .. import _simulated_xla

    _simulated_xla.configure(1, 0)
    _simulated_xla.recorder = _record
    return _simulated_xla.install()


def verdict(events):
    """True when each step is: backward ... reduce_gradients ... step, never a reduction first."""
    if "reduce_gradients" not in events or "step" not in events:
        return False
    last_backward = None
    for ev in events:
        if ev == "backward":
            last_backward = ev
        elif ev.startswith("reduce_gradients"):
            if ev != "reduce_gradients" or last_backward is None:
                return False
            last_backward = None
    first_step = events.index("step")
    return max(i for i, ev in enumerate(events[:first_step + 1]) if ev.startswith("reduce")) < first_step


def _exception_line(exc):
    return "%s: %s" % (type(exc).__name__, exc)


def run_event_step(row, torch, xm):
    """One optimizer step through the live objects ``row`` names (:func:`.table.resolve`), by its
    integration's driver (``event_step``) with the recording stand-in ``xm``; returns ``(events, error)``.
    ``error`` is the exception line when the step could not run (the order is then unknown), else None."""
    from . import table

    del _EVENTS[:]
    error = None
    try:
        table.driver_for(row).event_step(table.resolve(row), torch, xm, _EVENTS)
    except Exception as exc:  # noqa: BLE001 - reported as "could not verify", with the exception line
        error = _exception_line(exc)
    return list(_EVENTS), error


def _check_site(record, row, xm, torch):
    from . import table

    events, error = run_event_step(row, torch, xm)
    return {"site": table.site_id(row), "variant": row.variant, "verdict": record["verdict"],
            "events": events, "ok": error is None and verdict(events), "error": error}


def child_main():
    import warnings

    warnings.simplefilter("ignore")
    payload = {"ok": False, "error": None, "sites": [], "untested": []}
    try:
        import torch

        from . import table

        chosen = table.sites_to_verify()
        payload["untested"] = table.untested(chosen)
        xm = install_recording_xla_model()
        payload["sites"] = [_check_site(record, row, xm, torch) for record, row in chosen
                            if table.missing_driver(row) is None]
        payload["ok"] = bool(payload["sites"]) and all(s["ok"] for s in payload["sites"])
    except Exception as exc:  # noqa: BLE001
        payload["error"] = _exception_line(exc)
    _child.emit(payload)
    return 0


def run_event_check(timeout=300, env=None, python=None):
    """Run the self-test in a child process of ``python`` (default: this interpreter), with this process's
    interpreter flags (see the module docstring)."""
    from .fresh import caller_flags

    argv = _child.python_command("tpu_closure_fix.verify.events", "--child", python=python)
    run = _child.run_child(argv[:1] + caller_flags() + argv[1:], timeout,
                           env=_child.safe_environment(dict(os.environ, **(env or {}))))
    if run.payload is None:
        return {"ok": False, "sites": [], "error": "self-test process %s" % run.error,
                "stderr_tail": run.stderr_tail(1500)}
    return run.payload


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        sys.exit(child_main())

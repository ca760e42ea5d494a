"""Threads and child processes against the real pytorch-lightning 1.8.6 (tests/target/test_concurrency.py).

Run as ``python -m support.concurrency_scenarios SCENARIO`` (``tests`` on
PYTHONPATH); prints one ``PROBE {json}`` line.

* ``threads``: N threads call the patched ``optimizer_step`` while another
  thread toggles ``enable()``/``disable()``; every call's own event log is
  classified as fully patched, fully original, or bad.
* ``children``: the wrapper depth in the parent and in a ``fork`` and a
  ``spawn`` multiprocessing child (``--methods``), and whether the shim was
  loaded in each; ``--own-sitecustomize`` also reports whether the image's own
  sitecustomize ran (OWN_SITECUSTOMIZE_RAN).
"""
import argparse
import multiprocessing as mp
import os
import sys

from support import probe as p


def threads(callers=8, calls=150):
    import threading

    sys.setswitchinterval(1e-5)  # switch threads as often as possible: maximise interleavings
    import tpu_closure_fix

    trainer, model, _ = p.train(1)
    xm = sys.modules["torch_xla.core.xla_model"]  # the module the code under test resolves (the stand-in)
    local = threading.local()

    def reduce_gradients(optimizer, groups=None, pin_layout=True):  # per-thread event log on the stand-in
        local.log.append("reduce")

    def mark_step(wait=False):
        local.log.append("mark")

    xm.reduce_gradients, xm.mark_step = reduce_gradients, mark_step

    import torch

    results = {"patched": 0, "original": 0, "guarded": 0, "bad": [], "errors": [], "toggles": 0}
    lock = threading.Lock()
    start = threading.Barrier(callers + 1)
    stop = threading.Event()

    def caller():
        local.log = []
        plugin, optimizer = trainer.strategy.precision_plugin, trainer.optimizers[0]

        def closure():
            local.log.append("closure")
            return torch.tensor(1.0)

        start.wait()
        done = 0
        while done < calls or results["toggles"] < 6:  # until both states were seen several times
            done += 1
            local.log = []
            try:
                plugin.optimizer_step(optimizer, model, 0, closure)
            except Exception as exc:
                with lock:
                    results["errors"].append(repr(exc))
                continue
            log = local.log
            with lock:
                if log == ["closure", "reduce", "mark"]:
                    results["patched"] += 1
                elif log == ["reduce", "closure"]:
                    results["original"] += 1
                elif log == ["closure", "reduce"]:
                    # the site's wrapper read "off", then the torch_xla guard under it read "on" (a toggle in
                    # between): the original site's xm.optimizer_step call went through the guard, which
                    # reduces after the closure (barrier=False, as that call passes): still a right order
                    results["guarded"] += 1
                else:
                    results["bad"].append(log)

    def toggler():
        start.wait()
        while not stop.is_set():  # (each enable() after a disable() also scans gc for a stepped Trainer)
            (tpu_closure_fix.disable if results["toggles"] % 2 else tpu_closure_fix.enable)()
            results["toggles"] += 1
            stop.wait(0.0005)

    workers = [threading.Thread(target=caller) for _ in range(callers)]
    racer = threading.Thread(target=toggler)
    for thread in workers + [racer]:
        thread.start()
    for thread in workers:
        thread.join()
    stop.set()
    racer.join()
    tpu_closure_fix.enable()
    results["depth_after"] = p.site_depth()
    results["calls"] = (results["patched"] + results["original"] + results["guarded"] + len(results["bad"])
                        + len(results["errors"]))
    p.emit(**results)


def report(queue):
    p.lightning()  # a spawn child imports Lightning itself
    queue.put((mp.current_process().name, p.site_depth(), "tpu_closure_fix" in sys.modules))


def children(methods, own_sitecustomize=False):
    p.lightning()
    out = {"parent": p.site_depth(), "children": {}}
    for method in methods:
        ctx = mp.get_context(method)
        queue = ctx.Queue()
        child = ctx.Process(target=report, args=(queue,), name=method)
        child.start()
        name, depth, loaded = queue.get(timeout=240)
        child.join(timeout=240)
        out["children"][method] = {"depth": depth, "shim_loaded": loaded, "exitcode": child.exitcode}
    if own_sitecustomize:
        out["own"] = os.environ.get("OWN_SITECUSTOMIZE_RAN")
    p.emit(**out)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=("threads", "children"))
    parser.add_argument("--methods", default="fork,spawn", help="children: multiprocessing start methods")
    parser.add_argument("--own-sitecustomize", action="store_true")
    args = parser.parse_args(argv)
    if args.scenario == "threads":
        threads()
    else:
        children(args.methods.split(","), args.own_sitecustomize)
    return 0


if __name__ == "__main__":
    sys.exit(main())

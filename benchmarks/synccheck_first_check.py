#!/usr/bin/env python
"""How long the zero-code check holds the training thread at a new optimizer's first check, against a later check
of the same optimizer, in processes holding a million live objects, measured (not a test).

The job: two processes (torch.distributed over gloo, CPU, one thread each), armed with
``TPU_CLOSURE_FIX_SYNC_CHECK=5`` (the check imported from ``--package``, default this checkout). Each first makes
``--objects`` small live objects (instances of a class of its own, each tracked by the garbage collector: what a
scan of the live objects visits) and keeps them; then, ``--optimizers`` times, builds a new MLP (256 -> 256 -> 256
-> 10, batch 64) and a new SGD optimizer over it and trains it data-parallel (gradients all-reduced) for 5 steps.
The time the training thread spends in the check is read around the hook's one entry for a check
(``hook._check``: the fingerprint, the layout and its evidence, the names, handing the check to the worker);
each optimizer gives one pair: its first check (at step 0, before its first update) and its check at step 5,
each started with the check's worker idle (its exchanges of the checks before drained), so that both measure the
training thread's own work alike.

Printed: the medians of both and the median (and IQR) of the paired differences, first minus later, against the
goal (the first check holds the training thread at most 1 ms longer than a later one); and, for scale, one scan of
the live objects as the check made one before (``gc.get_objects()`` with a type test per object), timed once.

    python benchmarks/synccheck_first_check.py                    # the figures in docs/synccheck.md (~1 minute)
    python benchmarks/synccheck_first_check.py --package /other/checkout   # the same job on another version
    python benchmarks/synccheck_first_check.py --smoke            # a few seconds: the script works
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _stats import quartiles  # noqa: E402

SYNC_CHECK_VAR = "TPU_CLOSURE_FIX_SYNC_CHECK"
EVERY = 5
#: The first check holds the training thread at most this many milliseconds longer than a later check.
GOAL_MS = 1.0
WIDTHS = (256, 256, 256, 10)
BATCH = 64


class Leaf(object):
    """One live object: an instance the garbage collector tracks, as most of a real program's objects are."""


# --------------------------------------------------------------------------- one rank
def rank_main(rank, port, objects, optimizers):
    """Hold ``objects`` live objects, train ``optimizers`` new optimizers; print one JSON line (rank 0)."""
    import gc

    import tpu_closure_fix  # noqa: F401  -- arms the check from the environment
    import torch
    import torch.distributed as dist
    from tpu_closure_fix.synccheck import hook, worker

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=2)
    live = [Leaf() for _ in range(objects)]
    held = {}  # (id(optimizer), step) -> seconds the training thread spent in the check
    original = hook._check

    def timed(optimizer, stream, step):
        start = time.perf_counter()
        try:
            return original(optimizer, stream, step)
        finally:
            held[(id(optimizer), step)] = time.perf_counter() - start

    hook._check = timed
    scan = _scan_seconds(torch.nn.Module)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(BATCH, WIDTHS[0], generator=gen)
    y = torch.randint(0, WIDTHS[-1], (BATCH,), generator=gen)
    pairs = []
    for index in range(optimizers):
        torch.manual_seed(index)  # the same model on both ranks: each check compares it
        model, optimizer = _model(torch)
        for step in range(1, EVERY + 1):
            if step in (1, EVERY):  # both measured checks start with the worker idle: only the thread's own work
                worker.drain(60)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad.mul_(0.5)
            optimizer.step()
        pairs.append((held.get((id(optimizer), 0)), held.get((id(optimizer), EVERY))))
    worker.drain(60)
    result = {"pairs": pairs, "live": len(gc.get_objects()), "objects": len(live), "scan_s": scan,
              "checks": hook.seen["checks"], "armed_every": hook.armed_every(),
              "package": os.path.dirname(os.path.dirname(os.path.abspath(tpu_closure_fix.__file__)))}
    if rank == 0:
        print(json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _model(torch):
    layers = []
    for inputs, outputs in zip(WIDTHS, WIDTHS[1:]):
        layers += [torch.nn.Linear(inputs, outputs), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _scan_seconds(module_class):
    """One scan of the live objects as the check made one before: every object's type tested."""
    import gc

    start = time.perf_counter()
    found = sum(1 for obj in gc.get_objects() if issubclass(type(obj), module_class))
    return time.perf_counter() - start if found >= 0 else None


# --------------------------------------------------------------------------- the parent
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(package, objects, optimizers):
    """Run the job once; rank 0's result."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TPU_CLOSURE_FIX="0",
               PYTHONPATH=os.pathsep.join([package, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    for name in list(env):
        if name.startswith(SYNC_CHECK_VAR):
            del env[name]
    env[SYNC_CHECK_VAR] = str(EVERY)
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(rank), str(port),
                               str(objects), str(optimizers)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True) for rank in range(2)]
    outs = [p.communicate(timeout=1200) for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("the job failed (exit codes %s):\n%s" % (
            [p.returncode for p in procs], "\n".join(err[-1500:] for _, err in outs)))
    result = json.loads(outs[0][0].strip().splitlines()[-1])
    check_result(result, optimizers)
    return result


def check_result(result, optimizers):
    """Stop when the job did not measure what it stands for: a check missing from a pair, or the check not armed."""
    if result["armed_every"] != EVERY:
        raise SystemExit("the check was not armed (every %s): is the package importable from %s?"
                         % (result["armed_every"], result["package"]))
    missing = [i for i, pair in enumerate(result["pairs"]) if None in pair]
    if len(result["pairs"]) != optimizers or missing:
        raise SystemExit("no first or later check timed for optimizer(s) %s of %d" % (missing, optimizers))


def print_results(result):
    """The paired medians and the scale; return the number of goals not met (0 or 1)."""
    firsts = [first for first, _ in result["pairs"]]
    laters = [later for _, later in result["pairs"]]
    added = [1e3 * (first - later) for first, later in result["pairs"]]
    lo, hi = quartiles(added)
    met = statistics.median(added) <= GOAL_MS
    print("%d live objects tracked per process (%d made by the job); package: %s" % (
        result["live"], result["objects"], result["package"]))
    print("first check %.3f ms | later check %.3f ms (medians of %d optimizers)" % (
        1e3 * statistics.median(firsts), 1e3 * statistics.median(laters), len(firsts)))
    print("first - later: %+.3f ms (paired median; IQR %+.3f .. %+.3f); goal <= %.1f ms: %s" % (
        statistics.median(added), lo, hi, GOAL_MS, "met" if met else "NOT met"))
    print("one scan of the live objects (what a first check made before): %.1f ms" % (1e3 * result["scan_s"]))
    return 0 if met else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--objects", type=int, default=1000000, help="live objects each process holds (1000000)")
    parser.add_argument("--optimizers", type=int, default=20, help="new optimizers, one pair each (default 20)")
    parser.add_argument("--package", default=REPO, help="the checkout whose tpu_closure_fix is measured (this one)")
    parser.add_argument("--smoke", action="store_true", help="10,000 objects, 3 optimizers: the script works")
    args = parser.parse_args(argv)
    if args.rank:
        rank, port, objects, optimizers = (int(v) for v in args.rank)
        return rank_main(rank, port, objects, optimizers)
    for name in ("objects", "optimizers"):
        if getattr(args, name) < 1:
            parser.error("--%s: %d; give 1 or more" % (name, getattr(args, name)))
    objects, optimizers = (10000, 3) if args.smoke else (args.objects, args.optimizers)
    print("%s; 2 gloo ranks, %s=%d, %d new optimizers" % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                                          SYNC_CHECK_VAR, EVERY, optimizers), flush=True)
    missed = print_results(run_job(os.path.abspath(args.package), objects, optimizers))
    print("every goal met" if not missed else "%d goal(s) not met" % missed)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What SyncCheck costs on real torch_xla, in torch_xla's own metrics: what tests/xla/test_synccheck_cost.py asserts.

Run as ``PJRT_DEVICE=CPU python -m support.synccheck_xla_cost --rank R --world 2 --port P --every 5 --steps 30
--out FILE`` (cwd tests/, one process per rank). Each process has one XLA device (torch_xla sees a world of
1) and joins the others over gloo, so a check goes through the DistributedChannel: the fingerprint vector is
built lazily on the XLA device and copied to the host, where it is all-reduced.

The replicas train the same small MLP on the same data (a local step each: what the check costs is the
point, not the training), ``mark_step`` after every optimizer step so the training graph stays apart, and
``tpu_closure_fix.check_sync(model, step, every=E)`` after it (``--no-check``: never). Written (JSON): the
CompileTime and ExecuteTime counts and every counter's change around each check, over the training steps
alone, and over the whole run, with each check's outcome.
"""
import argparse
import json
import os
import sys

WIDTH = 32


def snapshot():
    """(compilations, executions, {counter: value}) so far, from torch_xla.debug.metrics."""
    import torch_xla.debug.metrics as met

    def count(name):
        data = met.metric_data(name)
        return 0 if data is None else int(data[0])

    counters = {name: int(met.counter_value(name) or 0) for name in met.counter_names()}
    return count("CompileTime"), count("ExecuteTime"), counters


def delta(before, after):
    """The compilations, executions and counters (those that changed) between two snapshots."""
    changed = {name: value - before[2].get(name, 0) for name, value in after[2].items()
               if value != before[2].get(name, 0)}
    return {"compiles": after[0] - before[0], "executes": after[1] - before[1], "counters": changed}


def make_model(device):
    import torch

    torch.manual_seed(0)  # the same model on every rank: the checks compare equal replicas
    model = torch.nn.Sequential(torch.nn.Linear(16, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, 4))
    return model.to(device)


def batches(steps):
    """The same data on every rank (CPU tensors, copied to the device per step as a loader would)."""
    import torch

    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)) for _ in range(steps)]


def sync():
    """Cut the lazy graph here (``torch_xla.sync`` from 2.5 on; ``xm.mark_step`` before, deprecated after) and
    wait for its execution: it runs asynchronously, and its ExecuteTime sample would otherwise land in the
    check's window."""
    import torch_xla
    import torch_xla.core.xla_model as xm

    fn = getattr(torch_xla, "sync", None)
    if callable(fn):
        fn()
    else:
        xm.mark_step()
    xm.wait_device_ops()


def device():
    import torch_xla

    fn = getattr(torch_xla, "device", None)
    if callable(fn):
        return fn()
    import torch_xla.core.xla_model as xm

    return xm.xla_device()


def train(args):
    """Train ``args.steps`` steps, checking after each; the measurements."""
    import torch

    import tpu_closure_fix

    dev = device()
    model = make_model(dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = batches(args.steps)
    start = snapshot()
    training, checks = {"compiles": 0, "executes": 0}, []
    for step, (x, y) in enumerate(data, 1):
        before = snapshot()
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x.to(dev)), y.to(dev))
        loss.backward()
        optimizer.step()
        sync()  # the training step's graph, apart from the check's
        after = snapshot()
        for field in training:
            training[field] += delta(before, after)[field]
        if args.no_check:
            continue
        report = tpu_closure_fix.check_sync(model, step, every=args.every)
        if report is not None:
            measured = delta(after, snapshot())
            measured.update(step=step, outcome=report.outcome, reason=report.as_dict().get("reason"))
            checks.append(measured)
    return {"rank": args.rank, "steps": args.steps, "every": args.every, "checked": not args.no_check,
            "training": training, "checks": checks, "whole_run": delta(start, snapshot())}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port, rank=args.rank,
                            world_size=args.world)
    result = train(args)
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=1)
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter teardown with gloo threads and the PJRT client alive


if __name__ == "__main__":
    sys.exit(main())

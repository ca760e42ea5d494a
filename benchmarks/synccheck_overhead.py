#!/usr/bin/env python
"""SyncCheck overhead at its default frequency, measured (not a test).

Two replica processes (torch.distributed over gloo, CPU, one thread each) train a model (``--model``:
the demo's, an MLP, or one of >= 100 M parameters) data-parallel:
forward, backward, gradient all-reduce (mean), SGD step -- the step SyncCheck runs beside. Two
measurements, both on rank 0, both with the replicas in lock-step:

1. Paired blocks: ``--reps`` pairs of blocks of ``every`` steps (default: SyncCheck's DEFAULT_EVERY),
   one block plain, one calling ``check_sync(model, step, every)`` after every step with the steps
   ``every + 1 .. 2 * every`` (past the checks at steps 0 and 1 of a run, so the block holds exactly one
   check); the order alternates (ABBA) to cancel drift. Overhead = median over pairs of
   ``t_check / t_plain - 1``.
2. Components: median time of one step and of one comparison (``compare_replicas``: fingerprints, one
   collective, host copy), each over many repetitions; overhead = check / (every * step).

The machine is shared and noisy: (2) is the precise figure, (1) the end-to-end confirmation (its noise,
reported as the interquartile range, is larger than the effect). The large model measures (2) only:
a block of 100 of its steps takes minutes.

    python benchmarks/synccheck_overhead.py --model demo   # the figures in docs/synccheck.md
    python benchmarks/synccheck_overhead.py --model mlp
    python benchmarks/synccheck_overhead.py --model large  # two processes of about 0.9 GB each
    python benchmarks/synccheck_overhead.py --smoke    # a few seconds: the script works
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _stats import quartiles  # noqa: E402


#: The models measured: the demo's (tpu-closure-fix demo: 64 -> 64 -> 10), an MLP (784 -> width -> width ->
#: 10) and a large one of >= 100 M parameters (4096 wide, 7 layers: 100.7 M).
MODELS = {"demo": {"inputs": 64, "widths": [64], "batch": 32},
          "mlp": {"inputs": 784, "widths": [512, 512], "batch": 64},
          "large": {"inputs": 4096, "widths": [4096] * 6, "batch": 64}}


def build_model(cfg):
    import torch

    layers, inputs = [], cfg["inputs"]
    for width in cfg["widths"]:
        layers += [torch.nn.Linear(inputs, width), torch.nn.ReLU()]
        inputs = width
    return torch.nn.Sequential(*layers, torch.nn.Linear(inputs, 10))


def worker(rank, world, port, cfg):
    import torch
    import torch.distributed as dist

    sys.path.insert(0, REPO)
    from tpu_closure_fix import synccheck

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
    torch.manual_seed(0)
    model = build_model(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(cfg["batch"], cfg["inputs"], generator=gen)
    y = torch.randint(0, 10, (cfg["batch"],), generator=gen)
    every = cfg["every"]

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        for p in model.parameters():  # data parallel: mean all-reduce of the gradients
            dist.all_reduce(p.grad)
            p.grad.mul_(1.0 / world)
        opt.step()

    def block(check):
        dist.barrier()
        start = time.perf_counter()
        for i in range(1, every + 1):
            step()
            if check:  # steps every+1 .. 2*every: exactly one check, at 2*every
                synccheck.check_sync(model, every + i, every=every)
        return time.perf_counter() - start

    for _ in range(cfg["warmup"]):
        step()
    ratios, plain_times, check_times = [], [], []
    for rep in range(cfg["reps"]):
        order = (False, True) if rep % 2 == 0 else (True, False)
        times = {c: block(c) for c in order}
        plain_times.append(times[False])
        check_times.append(times[True])
        ratios.append(times[True] / times[False] - 1.0)

    step_times, compare_times = [], []
    for _ in range(cfg["component_reps"]):
        dist.barrier()
        start = time.perf_counter()
        step()
        step_times.append(time.perf_counter() - start)
        dist.barrier()
        start = time.perf_counter()
        report = synccheck.compare_replicas(model, 0)
        compare_times.append(time.perf_counter() - start)
        assert report is not None and not report.diverged, report

    result = {
        "params": sum(p.numel() for p in model.parameters()),
        "tensors": len(list(model.parameters())),
        "model": cfg["model"], "every": every, "reps": cfg["reps"], "batch": cfg["batch"], "world": world,
        "component_reps": cfg["component_reps"],
        "paired_overhead_median": statistics.median(ratios) if ratios else None,
        "paired_overhead_iqr": quartiles(ratios) if ratios else None,
        "block_plain_median_s": statistics.median(plain_times) if plain_times else None,
        "block_check_median_s": statistics.median(check_times) if check_times else None,
        "step_median_s": statistics.median(step_times),
        "check_median_s": statistics.median(compare_times),
    }
    result["component_overhead"] = result["check_median_s"] / (every * result["step_median_s"])
    if rank == 0:
        print(json.dumps(result))
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a few seconds: check the script runs")
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp", help="model measured (default mlp)")
    parser.add_argument("--reps", type=int, default=None,
                        help="paired block repetitions (default 40; 0 for the large model: its blocks take minutes)")
    parser.add_argument("--component-reps", type=int, default=None,
                        help="repetitions of one step and one check (default 300; 7 for the large model)")
    parser.add_argument("--every", type=int, default=None, help="steps per check (default DEFAULT_EVERY)")
    parser.add_argument("--batch", type=int, default=None, help="per-replica batch (default: the model's)")
    parser.add_argument("--json", help="also write the result here")
    parser.add_argument("--worker", nargs=3, metavar=("RANK", "PORT", "CFG"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        rank, port, cfg = args.worker
        cfg = json.loads(cfg)
        return worker(int(rank), cfg["world"], int(port), cfg)

    sys.path.insert(0, REPO)
    from tpu_closure_fix.synccheck import DEFAULT_EVERY

    every = args.every or DEFAULT_EVERY
    large = args.model == "large"
    cfg = dict(MODELS[args.model], model=args.model, world=2, every=every)
    cfg.update(reps=(0 if large else 40) if args.reps is None else args.reps,
               component_reps=(7 if large else 300) if args.component_reps is None else args.component_reps,
               warmup=2 if large else 50)
    if args.batch:
        cfg["batch"] = args.batch
    if args.smoke:
        cfg.update(every=min(every, 10), reps=2, component_reps=10, warmup=5, inputs=64, widths=[64])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", TPU_CLOSURE_FIX="0")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", str(r), str(port),
                               json.dumps(cfg)], env=env, stdout=subprocess.PIPE, universal_newlines=True)
             for r in range(cfg["world"])]
    outs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        print("a replica failed: exit codes %s" % [p.returncode for p in procs], file=sys.stderr)
        return 1
    result = json.loads(outs[0].strip().splitlines()[-1])
    print("SyncCheck overhead: %d replicas (gloo, CPU, 1 thread each), model %r: %d params in %d tensors, "
          "batch %d, check every %d steps" % (result["world"], result["model"], result["params"], result["tensors"],
                                              result["batch"], result["every"]))
    print("  step (median of %d)            %10.3f ms" % (cfg["component_reps"], 1e3 * result["step_median_s"]))
    print("  one check (median of %d)       %10.3f ms" % (cfg["component_reps"], 1e3 * result["check_median_s"]))
    print("  component overhead             %10.4f %% check / (every x step)" % (100 * result["component_overhead"]))
    if result["paired_overhead_median"] is not None:
        lo, hi = result["paired_overhead_iqr"]
        print("  paired blocks (median of %d)    %+8.3f %%   interquartile range [%+.3f %%, %+.3f %%]"
              % (result["reps"], 100 * result["paired_overhead_median"], 100 * lo, 100 * hi))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

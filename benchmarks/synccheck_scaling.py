#!/usr/bin/env python
"""How one SyncCheck comparison's cost grows with the replicas, measured (not a test).

For each world size (``--worlds``, default 2, 4, 8, 16) that many processes (torch.distributed over
gloo, CPU, one thread each) hold the demo's model (``--model``, as benchmarks/synccheck_overhead.py) and
run ``--reps`` comparisons (``compare_replicas``: fingerprint, then the exchange: up to ``comm.GATHER_RANKS``
ranks the store agreement with the vectors riding on it, above that the agreement and one MAX all-reduce of the
fixed-length vector on the check's own gloo group), each after a barrier so that every rank starts it together.
Rank 0 prints the median time of one comparison and of its parts, each timed alone: the fingerprint (local,
independent of the world) and the exchange (``channel.meet``: what grows with the world), and the bytes of one
vector as a rank sends it through the store (its present fields).

On this project's 2-core machine, worlds above 2 oversubscribe the cores, so the figures there include
waiting for a core: an upper bound of what the exchange costs, used in docs/synccheck.md to bound a pod.

With ``--single-process`` it measures instead what the zero-code hook costs a process that has no process
group (a one-device run with ``TPU_CLOSURE_FIX_SYNC_CHECK=1``: it only counts): paired blocks of steps of the
demo's model with the hook armed and disarmed, alternating, median per step of the difference.

With ``--xla-python PATH`` (the interpreter of a torch_xla venv, e.g. ``.cache/xla-venv-2.9/bin/python``
from ``bash scripts/xla_env.sh 2.9``) it prints instead the XLA graph counts, from torch_xla's own metrics
(``CompileTime``, ``ExecuteTime``): 2 processes, one CPU PJRT device each, joined by gloo, train a small MLP
``--xla-steps`` steps with ``check_sync`` every ``--xla-every`` steps and without, as
tests/xla/test_synccheck_cost.py (which bounds these counts) runs tests/support/synccheck_xla_cost.py.

    python benchmarks/synccheck_scaling.py                 # the figures in docs/synccheck.md
    python benchmarks/synccheck_scaling.py --single-process
    python benchmarks/synccheck_scaling.py --xla-python .cache/xla-venv-2.9/bin/python
    python benchmarks/synccheck_scaling.py --smoke         # a few seconds: the script works
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
from synccheck_overhead import MODELS, build_model  # noqa: E402


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port, model, reps):
    import torch
    import torch.distributed as dist

    sys.path.insert(0, REPO)
    from tpu_closure_fix.synccheck import comm, compare, fingerprint, groups

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
    torch.manual_seed(0)
    net = build_model(MODELS[model])
    totals, prints, exchanges = [], [], []
    channel = comm.channel()
    for i in range(reps + 1):
        dist.barrier()
        start = time.perf_counter()
        layout = groups.Layout(list(net.named_parameters()), rank)
        vector = fingerprint.local_vector(layout.entries, layout.structures, step=i, lanes=layout.lanes)
        middle = time.perf_counter()
        dist.barrier()
        met = time.perf_counter()
        assert channel.meet("bench/%d" % i, vector) is not None
        met_end = time.perf_counter()
        dist.barrier()
        begin = time.perf_counter()
        report = compare.compare_replicas(net, step=i)
        end = time.perf_counter()
        assert report.outcome == "identical", report.message()
        if i:  # the first includes making the check's own group
            prints.append(middle - start)
            exchanges.append(met_end - met)
            totals.append(end - begin)
    dist.barrier()
    if rank == 0:
        fp, total = statistics.median(prints), statistics.median(totals)
        print(json.dumps({"world": world, "check_ms": total * 1e3, "fingerprint_ms": fp * 1e3,
                          "exchange_ms": statistics.median(exchanges) * 1e3,
                          "vector_bytes": len(comm._bytes_of(vector)), "reps": reps}), flush=True)
    dist.destroy_process_group()


def measure(world, model, reps):
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", TPU_CLOSURE_FIX="0", PYTHONPATH=REPO)
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", str(rank), str(world), str(port),
                               model, str(reps)], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              universal_newlines=True) for rank in range(world)]
    out = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("world %d: a worker failed (%s)" % (world, [p.returncode for p in procs]))
    return json.loads(out[0].strip().splitlines()[-1])


def xla_run(python, steps, every, checked):
    """Both ranks' measurements of tests/support/synccheck_xla_cost.py under ``python`` (a torch_xla venv)."""
    import tempfile

    tests = os.path.join(REPO, "tests")
    drop = ("PJRT_DEVICE", "CPU_NUM_DEVICES", "PYTHONPATH", "TPU_CLOSURE_FIX_SYNC_CHECK",
            "TPU_CLOSURE_FIX_SYNC_CHECK_ON_DIVERGENCE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(PJRT_DEVICE="CPU", TPU_CLOSURE_FIX="0", PYTHONWARNINGS="ignore", PYTHONPATH=os.pathsep.join([REPO, tests]))
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="synccheck-xla-") as tmp:
        outs = [os.path.join(tmp, "rank%d.json" % rank) for rank in range(2)]
        procs = [subprocess.Popen([python, "-m", "support.synccheck_xla_cost", "--rank", str(rank), "--world", "2",
                                   "--port", str(port), "--every", str(every), "--steps", str(steps), "--out", out]
                                  + ([] if checked else ["--no-check"]), env=env, cwd=tests,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, universal_newlines=True)
                 for rank, out in enumerate(outs)]
        errors = [p.communicate(timeout=1800)[1] for p in procs]
        if any(p.returncode for p in procs):
            raise SystemExit("torch_xla run failed (%s):\n%s" % ([p.returncode for p in procs], errors[0][-2000:]))
        results = []
        for out in outs:
            with open(out) as handle:
                results.append(json.load(handle))
    return results


def xla_counts(python, steps, every):
    """Print the graph counts of a check on real torch_xla (rank 0's; the test asserts both ranks')."""
    checked = xla_run(python, steps, every, True)[0]
    unchecked = xla_run(python, steps, every, False)[0]
    checks = checked["checks"]
    print("torch_xla graph counts (%s; 2 processes, CPU PJRT, gloo), a %d-step MLP checked at step 1 and every %d "
          "(%d checks):" % (python, steps, every, len(checks)))
    print("%-34s %13s %17s" % ("", "compilations", "graph executions"))
    print("%-34s %13d %17d" % ("first check", checks[0]["compiles"], checks[0]["executes"]))
    later = checks[1:]
    print("%-34s %13s %17s" % ("later checks (each, max)", max(c["compiles"] for c in later),
                               max(c["executes"] for c in later)))
    print("%-34s %13s %17s" % ("whole run, with checks / without",
                               "%d / %d" % (checked["whole_run"]["compiles"], unchecked["whole_run"]["compiles"]),
                               "%d / %d" % (checked["whole_run"]["executes"], unchecked["whole_run"]["executes"])))
    print("outcomes: %s" % ", ".join(sorted(set(c["outcome"] for c in checks))))


def single_process(blocks, steps):
    """Per-step cost of the armed hook (every=1) in a process without a process group: (armed, off) medians."""
    import torch

    sys.path.insert(0, REPO)
    from tpu_closure_fix.synccheck import hook

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = build_model(MODELS["demo"])
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def block():
        start = time.perf_counter()
        for _ in range(steps):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            optimizer.step()
        return (time.perf_counter() - start) / steps

    block()
    armed, off = [], []
    for i in range(blocks):
        for arm in ((True, False) if i % 2 == 0 else (False, True)):  # ABBA
            if arm:
                hook.arm(1)
            (armed if arm else off).append(block())
            hook.disarm()
    assert hook.seen["checks"] == 0  # it only counted
    return statistics.median(armed), statistics.median(off), [a - o for a, o in zip(armed, off)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--worlds", default="2,4,8,16")
    parser.add_argument("--model", default="demo", choices=sorted(MODELS))
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--single-process", action="store_true")
    parser.add_argument("--xla-python", metavar="PATH", help="a torch_xla venv's python: print the XLA graph counts")
    parser.add_argument("--xla-steps", type=int, default=30)
    parser.add_argument("--xla-every", type=int, default=5)
    args = parser.parse_args()
    if args.xla_python:
        if not os.path.isfile(args.xla_python):
            parser.error("--xla-python: no such interpreter: %s" % args.xla_python)
        if args.xla_every < 1 or args.xla_steps <= args.xla_every:
            parser.error("--xla-every must be >= 1 and below --xla-steps (got %d, %d)" % (args.xla_every,
                                                                                         args.xla_steps))
        return xla_counts(os.path.abspath(args.xla_python), args.xla_steps, args.xla_every)
    if args.worker:
        rank, world, port, model, reps = args.worker
        return worker(int(rank), int(world), int(port), model, int(reps))
    if args.single_process or args.smoke:
        blocks, steps = (2, 20) if args.smoke else (20, 500)
        armed, off, diffs = single_process(blocks, steps)
        print("one process, no process group, TPU_CLOSURE_FIX_SYNC_CHECK=1 (demo model, %d x %d steps, ABBA):" %
              (blocks, steps))
        print("  step %.1f us armed, %.1f us off; paired difference median %+.2f us per step"
              % (armed * 1e6, off * 1e6, statistics.median(diffs) * 1e6))
        if args.single_process:
            return
    worlds = [2] if args.smoke else [int(w) for w in args.worlds.split(",")]
    reps = 3 if args.smoke else args.reps
    print("one SyncCheck comparison (%s model), median of %d, gloo on %d cores" % (args.model, reps, os.cpu_count()))
    print("%6s %10s %15s %12s %11s" % ("world", "check ms", "fingerprint ms", "exchange ms", "vector KiB"))
    for world in worlds:
        r = measure(world, args.model, reps)
        print("%6d %10.2f %15.2f %12.2f %11.1f" % (r["world"], r["check_ms"], r["fingerprint_ms"], r["exchange_ms"],
                                                  r["vector_bytes"] / 1024.0), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""The wall time of a job whose rank 0 alone also steps a probe optimizer, with the zero-code check armed and
off, measured (not a test).

The job: two processes (torch.distributed over gloo, ``init_process_group(..., timeout=10 s)``, CPU, one thread
each) train the same MLP (784 -> 512 -> 512 -> 10, 669,706 parameters, batch 64 per rank, different data per
rank) data-parallel for ``--steps`` steps: forward, backward, mean all-reduce of every gradient, SGD step, and a
``dist.barrier()`` every ``--barrier-every`` steps. Rank 0 alone also trains a small probe (``Linear(10, 1)`` on
the model's detached output) with an optimizer of its own at every step. Both arms import ``tpu_closure_fix``
(the check is armed from the environment by that import); they differ only in the environment:

* ``armed``: ``TPU_CLOSURE_FIX_SYNC_CHECK=5`` (the model's optimizer is checked at its first step, after step 1
  and every 5 steps; so is the probe's on rank 0, whose first check no other rank reaches) and
  ``TPU_CLOSURE_FIX_SYNC_CHECK_TIMEOUT=2``: the probe's stream stands down after that agreement timeout (the
  default, 300 s, is longer than the whole job; the wait is on the check's worker thread either way);
* ``off``: neither variable.

Runs alternate in ABBA order (``--pairs`` pairs). Per run: the *job* (the parent's wall time from starting both
processes until both exited: interpreter and torch start-up, joining the group, the loop, destroying the
process group and the interpreter's exit, which stops the check's worker) and the *loop* (the slowest rank's
training loop, first step to the last barrier). Printed: the medians of each arm, the median of the paired
ratios armed / off, and whether the goal (the job within 1.2x of the same job with the check off) is met.
Every armed run must have run checks on rank 0 and stood the probe's stream down (one warning), else the run
stops. On this shared 2-core machine the two ranks, the check's worker threads and gloo share the cores: the
figures are upper bounds of what a check costs a job on a machine with a core per rank.

    python benchmarks/synccheck_probe_wall.py             # the figures in docs/synccheck.md (about 3-5 minutes)
    python benchmarks/synccheck_probe_wall.py --pairs 5 --steps 300
    python benchmarks/synccheck_probe_wall.py --smoke     # a few seconds: the script works
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
TIMEOUT_VAR = SYNC_CHECK_VAR + "_TIMEOUT"
#: The armed arm's variables: a check every 5 steps, the agreement's timeout 2 s.
ARMED = {SYNC_CHECK_VAR: "5", TIMEOUT_VAR: "2"}
ARMS = ("armed", "off")
#: The job's wall time armed is at most GOAL times the same job's with the check off.
GOAL = 1.2
#: The process group's timeout (seconds): a rank held by another this long fails the job.
GROUP_TIMEOUT = 10
WIDTHS = (784, 512, 512, 10)
BATCH = 64


# --------------------------------------------------------------------------- one rank
def rank_main(rank, port, steps, barrier_every):
    """Train the job as one rank; print one JSON line: the loop's seconds and what the check did."""
    import datetime
    import warnings

    import tpu_closure_fix  # noqa: F401  -- arms the check from the environment (armed arm only)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=GROUP_TIMEOUT))
    torch.manual_seed(0)
    layers = []
    for inputs, outputs in zip(WIDTHS, WIDTHS[1:]):
        layers += [torch.nn.Linear(inputs, outputs), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = torch.nn.Linear(WIDTHS[-1], 1)
    probe_optimizer = torch.optim.SGD(probe.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(BATCH, WIDTHS[0], generator=gen)
    y = torch.randint(0, WIDTHS[-1], (BATCH,), generator=gen)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.barrier()
        start = time.perf_counter()
        for step in range(1, steps + 1):
            optimizer.zero_grad()
            out = model(x)
            torch.nn.functional.cross_entropy(out, y).backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad.mul_(0.5)
            optimizer.step()
            if rank == 0:  # the probe: an optimizer only this rank steps
                probe_optimizer.zero_grad()
                probe(out.detach()).pow(2).mean().backward()
                probe_optimizer.step()
            if step % barrier_every == 0:
                dist.barrier()
        dist.barrier()
        loop = time.perf_counter() - start
    from tpu_closure_fix.synccheck import hook

    stood_down = [str(w.message) for w in caught if "stands down" in str(w.message)]
    report = hook.seen["last_report"]
    print(json.dumps({"loop_s": loop, "checks": hook.seen["checks"], "armed_every": hook.armed_every(),
                      "stood_down": stood_down, "last_outcome": getattr(report, "outcome", None)}), flush=True)
    dist.destroy_process_group()
    return 0


# --------------------------------------------------------------------------- the parent
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(arm, steps, barrier_every):
    """Run the job once in ``arm``; (job seconds, loop seconds, rank 0's result)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TPU_CLOSURE_FIX="0",
               PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    for name in list(env):
        if name.startswith(SYNC_CHECK_VAR):
            del env[name]
    if arm == "armed":
        env.update(ARMED)
    port = _free_port()
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(rank), str(port),
                               str(steps), str(barrier_every)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True) for rank in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    job = time.perf_counter() - start
    if any(p.returncode for p in procs):
        raise SystemExit("the %s job failed (exit codes %s):\n%s" % (
            arm, [p.returncode for p in procs], "\n".join(err[-1500:] for _, err in outs)))
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    _check_arm(arm, results[0])
    return job, max(r["loop_s"] for r in results), results[0]


def _check_arm(arm, rank0):
    """Stop the run when an arm did not do what it stands for (armed: checks ran, the probe stood down)."""
    if arm == "off" and (rank0["armed_every"] or rank0["checks"]):
        raise SystemExit("the 'off' job ran the check (armed every %s, %s checks): is %s set by something else?"
                         % (rank0["armed_every"], rank0["checks"], SYNC_CHECK_VAR))
    if arm == "armed" and (rank0["armed_every"] != int(ARMED[SYNC_CHECK_VAR]) or not rank0["checks"]):
        raise SystemExit("the 'armed' job ran no check on rank 0 (armed every %s, %s checks): is the package "
                         "importable from %s?" % (rank0["armed_every"], rank0["checks"], REPO))


def measure(pairs, steps, barrier_every):
    """ABBA pairs: {arm: [(job s, loop s)]} and rank 0's results of the armed runs."""
    runs = {arm: [] for arm in ARMS}
    armed_results = []
    for pair in range(pairs):
        order = ARMS if pair % 2 == 0 else ARMS[::-1]
        for arm in order:
            job, loop, rank0 = run_job(arm, steps, barrier_every)
            runs[arm].append((job, loop))
            if arm == "armed":
                armed_results.append(rank0)
        print("pair %d of %d: job armed %.2f s, off %.2f s" % (pair + 1, pairs, runs["armed"][-1][0],
                                                               runs["off"][-1][0]), flush=True)
    return runs, armed_results


def summary(runs, which):
    """(median armed, median off, median of the paired ratios, its quartiles) of column ``which``."""
    armed = [r[which] for r in runs["armed"]]
    off = [r[which] for r in runs["off"]]
    ratios = [a / o for a, o in zip(armed, off)]
    return statistics.median(armed), statistics.median(off), statistics.median(ratios), quartiles(ratios)


def print_results(runs, armed_results, steps):
    """Print one row per arm and the ratios; return the number of goals not met (0 or 1)."""
    print("%-6s %12s %12s   (medians of %d runs; job: start to exit of both processes; loop: %d steps)"
          % ("arm", "job s", "loop s", len(runs["armed"]), steps))
    job = summary(runs, 0)
    loop = summary(runs, 1)
    print("%-6s %12.3f %12.3f" % ("armed", job[0], loop[0]))
    print("%-6s %12.3f %12.3f" % ("off", job[1], loop[1]))
    checks = statistics.median(r["checks"] for r in armed_results)
    stood = sum(1 for r in armed_results if r["stood_down"])
    print("armed: %g checks delivered on rank 0 (median); the probe's stream stood down in %d of %d runs"
          % (checks, stood, len(armed_results)))
    print("loop: armed / off = %.3fx (paired median; IQR %.3f .. %.3f)" % (loop[2], loop[3][0], loop[3][1]))
    met = job[2] <= GOAL
    print("job:  armed / off = %.3fx (paired median; IQR %.3f .. %.3f); goal <= %.1fx: %s"
          % (job[2], job[3][0], job[3][1], GOAL, "met" if met else "NOT met"))
    return 0 if met else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--pairs", type=int, default=10, help="ABBA pairs of runs (default 10)")
    parser.add_argument("--steps", type=int, default=400, help="training steps per run (default 400)")
    parser.add_argument("--barrier-every", type=int, default=10, help="steps between barriers (default 10)")
    parser.add_argument("--smoke", action="store_true", help="1 pair of 20 steps: the script works")
    args = parser.parse_args()
    if args.rank:
        rank, port, steps, barrier_every = (int(v) for v in args.rank)
        return rank_main(rank, port, steps, barrier_every)
    for name in ("pairs", "steps", "barrier_every"):
        if getattr(args, name) < 1:
            parser.error("--%s: %d; give 1 or more" % (name.replace("_", "-"), getattr(args, name)))
    pairs, steps = (1, 20) if args.smoke else (args.pairs, args.steps)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print("%s; 2 gloo ranks (process-group timeout %d s); armed: %s=%s, _TIMEOUT=%s" % (
        started, GROUP_TIMEOUT, SYNC_CHECK_VAR, ARMED[SYNC_CHECK_VAR], ARMED[TIMEOUT_VAR]), flush=True)
    runs, armed_results = measure(pairs, steps, args.barrier_every)
    missed = print_results(runs, armed_results, steps)
    print("every goal met" if not missed else "%d goal(s) not met" % missed)
    return 0


if __name__ == "__main__":
    sys.exit(main())

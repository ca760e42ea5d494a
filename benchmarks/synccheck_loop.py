#!/usr/bin/env python
"""What the zero-code check costs a training loop: the training thread's time armed against off, paired runs
(not a test).

Two processes (torch.distributed over gloo, CPU, one thread each, each pinned to its own core) train a model
data-parallel: forward, backward, the gradients' mean all-reduced in one flat buffer (as DDP's bucket does), SGD
step. Both arms import ``tpu_closure_fix``; they differ only in the environment: *armed* sets
``TPU_CLOSURE_FIX_SYNC_CHECK=<every>`` (checks before the optimizer's first update, after it, then every
``every`` steps: the training thread fingerprints, the check's worker thread agrees and exchanges), *off* leaves
it unset. Loops (``--loops``):

* ``small``: an MLP of 26,122 parameters (64 -> 128 -> 128 -> 10, batch 32), a check every 5 steps, 300 steps (a
  step, the gradients' all-reduce over gloo included, took 2.4-2.8 ms here); each rank's check worker thread
  runs on its training thread's core: every CPU second the check takes is charged to that rank;
* ``small-spare``: the same loop with rank 0's check worker (and the threads it starts) on the other core, as on
  a host with idle cores, where the worker takes only the interpreter lock from the training thread;
* ``100m``: 100.7 M parameters (4096-wide square layers), a check every 100 steps, 250 steps (two processes of
  about 2.5 GB each);
* ``100m-first``: the same model, 3 steps a run and 16 pairs: its first step (two checks) against the same
  step off, where a step's own time varies by tens of ms from run to run.

Runs alternate in ABBA order (``--pairs`` pairs). Per rank and run: its *own time*, the loop's wall time less
the time it waited for the other rank (in the gradients' all-reduce and the closing barrier), for the first
step (its two checks) and the other steps; the loop's wall time; the CPU time of its training thread in the loop
and of its check worker thread; the checks delivered; the fingerprint (``fingerprint.local_vector`` of the
model, median of 15, after the loop). Judged: the own time of the rank that lost the most (``small-spare``: rank
0's), the median of the paired differences (armed - off) per later check and for the first step, against the
goal: the training thread loses at most the fingerprint plus 1 ms per check. Pinned, the ranks never trade
cores: the own time's paired differences spread about +-0.5 ms per check here, the wall time's a few ms. Judged
too, within each armed run: a later check's 3 steps against the other steps of its period (:func:`within_run`),
which resolves a check where whole runs differ by more than their checks cost (``100m``); the same figure of the
off runs, at the same steps, is printed beside it as its control. And where the check holds the training
thread: each run times torch's step hooks (the check's, from ``optimizer.step()`` to the optimizer's own
pre-hook and from its own post-hook to the return) and the CPU time of the fingerprints inside them
(``fingerprint.local_vector`` on the training thread, timed by a wrapper the loop puts in): a check's time *beyond
its fingerprint* needs no run without the check and resolves to tenths of a ms at any model size (the off runs'
hooks, the control). It leaves out what the check's worker takes from the training thread between checks.

    python benchmarks/synccheck_loop.py                  # the figures in docs/synccheck.md (about 45 min)
    python benchmarks/synccheck_loop.py --loops small,small-spare --pairs 10
    python benchmarks/synccheck_loop.py --smoke          # seconds: the script works (the small loops only)
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
ARMS = ("armed", "off")
#: The loops measured: layer widths, batch per rank, steps between checks, steps per run.
LOOPS = {"small": {"widths": [64, 128, 128, 10], "batch": 32, "every": 5, "steps": 300},
         "small-spare": {"widths": [64, 128, 128, 10], "batch": 32, "every": 5, "steps": 300, "spare": True},
         "100m": {"widths": [4096] * 7, "batch": 4, "every": 100, "steps": 250},
         "100m-first": {"widths": [4096] * 7, "batch": 4, "every": 100, "steps": 3}}
#: Pairs of runs per loop by default.
PAIRS = {"small": 10, "small-spare": 10, "100m": 3, "100m-first": 16}
#: Goal: per check, the loop loses at most the fingerprint's time plus this many seconds.
ROOM = 0.001
FINGERPRINT_REPS = 15


# --------------------------------------------------------------------------- one rank
def _worker_threads():
    """This process's running check worker threads."""
    import threading

    from tpu_closure_fix.synccheck import comm

    return [t for t in threading.enumerate() if t.name == comm.WORKER_THREAD and t.ident is not None]


def _worker_cpu():
    """CPU seconds of this process's check worker threads so far (0.0: none ran)."""
    total = 0.0
    for thread in _worker_threads():
        try:
            total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (AttributeError, OSError):  # not on this platform: counted as none
            pass
    return total


def _worker_on_core(core):
    """Run this process's check worker thread (and the threads it starts) on ``core``: the spare core a host
    with more cores than ranks gives it (here: the other rank's)."""
    from tpu_closure_fix.synccheck import worker

    run = worker._WorkerThread.run

    def run_on_core(thread):
        os.sched_setaffinity(0, {core})  # 0: the calling thread
        run(thread)
    worker._WorkerThread.run = run_on_core


def _worker_cores():
    """The cores this process's check worker thread may run on (None: no worker, or not readable here)."""
    for thread in _worker_threads():
        try:
            return sorted(os.sched_getaffinity(thread.native_id))
        except (AttributeError, OSError, TypeError):  # no native_id (Python < 3.8) or not on this platform
            return None
    return None


def _fingerprint_ms(model, rank):
    """Median milliseconds of one fingerprint of ``model`` as the zero-code check takes it (each tensor's own
    fields kept for naming a difference: ``details``), layout included."""
    import torch

    from tpu_closure_fix.synccheck import fingerprint, groups

    times = []
    with torch.no_grad():
        for _ in range(FINGERPRINT_REPS):
            start = time.perf_counter()
            layout = groups.Layout(list(model.named_parameters()), rank)
            fingerprint.local_vector(layout.entries, layout.structures, step=1, lanes=layout.lanes, details={})
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


class _HookClock(object):
    """Where the training thread's time goes in each optimizer step: in torch's global step hooks (the check's:
    before the optimizer's own pre-hook and after its own post-hook, which run innermost) and, meanwhile, in
    ``fingerprint.local_vector`` (the fingerprint's CPU time on this thread, timed by a wrapper put in for the
    loop: time this thread waited meanwhile, for the interpreter lock or a core, is the check's, not the
    fingerprint's)."""

    def __init__(self, optimizer):
        self.hooks_s, self.fingerprint_s = [], []  # per optimizer step, step 1 first
        self._marks, self._in_fingerprint = {}, [0.0]
        optimizer.register_step_pre_hook(lambda *args: self._mark("pre"))
        optimizer.register_step_post_hook(lambda *args: self._mark("post"))

    def _mark(self, name):
        self._marks[name] = time.perf_counter()

    def wrap_fingerprint(self):
        """Time ``fingerprint.local_vector`` on the training thread from now until :meth:`unwrap`."""
        import threading

        from tpu_closure_fix.synccheck import fingerprint

        original = self._original = fingerprint.local_vector
        spent = self._in_fingerprint

        def timed_local_vector(*args, **kwargs):
            began = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                if threading.current_thread() is threading.main_thread():
                    spent[0] += time.thread_time() - began
        fingerprint.local_vector = timed_local_vector

    def unwrap(self):
        from tpu_closure_fix.synccheck import fingerprint

        fingerprint.local_vector = self._original

    def step(self, optimizer):
        """``optimizer.step()``, its hooks' and fingerprints' seconds noted."""
        spent_before = self._in_fingerprint[0]
        called = time.perf_counter()
        optimizer.step()
        returned = time.perf_counter()
        self.hooks_s.append((self._marks["pre"] - called) + (returned - self._marks["post"]))
        self.fingerprint_s.append(self._in_fingerprint[0] - spent_before)


def rank_main(rank, port, cfg):
    """Train the loop as one rank; print one JSON line of what it measured."""
    import tpu_closure_fix  # noqa: F401  -- arms the check from the environment (armed arm only)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) >= 2:
        os.sched_setaffinity(0, {cores[rank]})  # see the module docstring
        if cfg.get("spare") and rank == 0:
            _worker_on_core(cores[1])
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=2)
    torch.manual_seed(0)
    widths = cfg["widths"]
    layers = []
    for inputs, outputs in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(inputs, outputs), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    clock = _HookClock(optimizer)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(cfg["batch"], widths[0], generator=gen)
    y = torch.randint(0, widths[-1], (cfg["batch"],), generator=gen)

    waited = [0.0]  # seconds in the gradients' all-reduce and the barriers: waiting for the other rank

    def wait_for_peer(collective, *args):
        began = time.perf_counter()
        collective(*args)
        waited[0] += time.perf_counter() - began

    def step():
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])  # one bucket, one all-reduce
        wait_for_peer(dist.all_reduce, flat)
        flat.mul_(0.5)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        clock.step(optimizer)

    dist.barrier()
    clock.wrap_fingerprint()
    start = time.perf_counter()
    step()  # the first: its checks before and after the update make the check's layout, group and worker
    first = time.perf_counter() - start
    first_own = first - waited[0]
    dist.barrier()
    cpu = time.thread_time()
    waited[0] = 0.0
    start = time.perf_counter()
    step_own = []  # each later step's own time, optimizer step 2 first
    for _ in range(cfg["steps"] - 1):
        began, waited_before = time.perf_counter(), waited[0]
        step()
        step_own.append(time.perf_counter() - began - (waited[0] - waited_before))
    wait_for_peer(dist.barrier)
    loop = time.perf_counter() - start
    cpu = time.thread_time() - cpu
    own = loop - waited[0]
    clock.unwrap()
    from tpu_closure_fix.synccheck import hook, worker

    worker.drain(60.0)  # the last checks answered: every check the loop handed over is counted
    result = {"loop_s": loop, "first_s": first, "own_s": own, "first_own_s": first_own, "step_own_s": step_own,
              "hooks_s": clock.hooks_s, "in_fingerprint_s": clock.fingerprint_s, "train_cpu_s": cpu,
              "worker_cpu_s": _worker_cpu(), "worker_cores": _worker_cores(), "cores": cores,
              "checks": hook.seen["checks"],
              "armed_every": hook.armed_every(), "fingerprint_ms": _fingerprint_ms(model, rank),
              "params": sum(p.numel() for p in model.parameters()),
              "outcome": getattr(hook.seen["last_report"], "outcome", None)}
    print(json.dumps(result), flush=True)
    dist.destroy_process_group()
    return 0


# --------------------------------------------------------------------------- the parent
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(arm, cfg):
    """One run of the loop in ``arm``: (the slowest rank's first step, the slowest rank's other steps (seconds),
    rank 0's result)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TPU_CLOSURE_FIX="0",
               PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    for name in list(env):
        if name.startswith(SYNC_CHECK_VAR):
            del env[name]
    if arm == "armed":
        env[SYNC_CHECK_VAR] = str(cfg["every"])
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(rank), str(port),
                               json.dumps(cfg)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True) for rank in range(2)]
    outs = [p.communicate(timeout=3600) for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("the %s run failed (exit codes %s):\n%s" % (
            arm, [p.returncode for p in procs], "\n".join(err[-1500:] for _, err in outs)))
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    check_arm(arm, cfg, results[0])
    results[0].update(judged(cfg, results))
    return max(r["first_s"] for r in results), max(r["loop_s"] for r in results), results[0]


def judged(cfg, results):
    """The own times a run is judged by: rank 0's where its check worker had the spare core, else the rank
    whose training thread lost the most (``results``: the ranks' results, by rank); ``judged_within_s``: that
    rank's :func:`within_run` figures (the rank whose median is the larger, where ranks are compared)."""
    pick = (lambda name: results[0][name]) if cfg.get("spare") else (lambda name: max(r[name] for r in results))
    found = {"judged_" + name: pick(name) for name in ("own_s", "first_own_s")}
    within = [within_run(r.get("step_own_s", []), cfg["every"]) for r in results]
    found["judged_within_s"] = within[0] if cfg.get("spare") else max(
        within, key=lambda each: statistics.median(each) if each else float("-inf"))
    held = [held_in_checks(r, cfg["every"]) for r in results]
    if cfg.get("spare"):
        found["judged_held_first"], found["judged_held"] = held[0]
    else:  # the rank whose checks held it longest beyond their fingerprints
        firsts = [first for first, _ in held if first is not None]
        found["judged_held_first"] = max(firsts, key=lambda pair: pair[0] - pair[1]) if firsts else None
        found["judged_held"] = max((later for _, later in held), key=lambda each: statistics.median(
            [h - f for h, f in each]) if each else float("-inf"))
    return found


def held_in_checks(result, every):
    """Where a rank's checks held its training thread: (the first step's, [each later check's]) pairs of
    (seconds in torch's step hooks, of them in the fingerprint) (``result``: a rank's, its ``hooks_s`` and
    ``in_fingerprint_s`` per optimizer step, step 1 first; none timed: (None, []))."""
    steps = list(zip(result.get("hooks_s", []), result.get("in_fingerprint_s", [])))
    if not steps:
        return None, []
    return steps[0], [steps[number - 1] for number in range(every, len(steps) + 1, every) if number >= 2]


#: Steps from a check's own on that the within-run figure charges to it: its fingerprint lands in the first, its
#: worker's exchange in the next ones.
WINDOW = 3


def within_run(step_own, every, window=WINDOW):
    """Seconds each later check added inside one run: the own time of its ``window`` steps (the check's step
    and the next) less ``window`` times the median of the other steps of its period, before the next check
    (``step_own``: each later step's own time, optimizer step 2 first). Checks whose period holds no step after
    the window (``every`` at most ``window``, or the run's last check) are left out. Paired within a run, it
    needs no run without the check: where whole runs differ by more than their checks cost (100 M parameters),
    it still resolves them; applied to a run without the check, at the same steps, it shows what the step
    numbers alone give (about 0)."""
    own = {number: seconds for number, seconds in enumerate(step_own, start=2)}
    added = []
    for check in range(every, len(step_own) + 2, every):
        if check < 2:
            continue
        others = [own[number] for number in range(check + window, check + every) if number in own]
        if others:  # the run holds steps after the window: the whole window too
            added.append(sum(own[check + k] for k in range(window)) - window * statistics.median(others))
    return added


def expected_checks(steps, every):
    """Checks of one optimizer over ``steps`` steps: before its first update, after it, then every ``every``."""
    return 1 + sum(1 for step in range(1, steps + 1) if step == 1 or step % every == 0)


def check_arm(arm, cfg, rank0):
    """Stop the run when an arm did not do what it stands for (armed: every check delivered, identical)."""
    if arm == "off" and (rank0["armed_every"] or rank0["checks"]):
        raise SystemExit("the 'off' run ran the check (armed every %s, %s checks): is %s set by something else?"
                         % (rank0["armed_every"], rank0["checks"], SYNC_CHECK_VAR))
    spare = rank0["cores"][1:2] if cfg.get("spare") else []  # where rank 0's worker must run (none: not pinned)
    if arm == "armed" and spare and rank0["worker_cores"] != spare:
        raise SystemExit("the 'armed' run's check worker ran on cores %s, not on the spare core %d"
                         % (rank0["worker_cores"], rank0["cores"][1]))
    want = expected_checks(cfg["steps"], cfg["every"])
    if arm == "armed" and (rank0["checks"] != want or rank0["outcome"] != "identical"):
        raise SystemExit("the 'armed' run delivered %s checks (want %d), the last %s: is the package importable "
                         "from %s?" % (rank0["checks"], want, rank0["outcome"], REPO))


def measure(name, cfg, pairs):
    """ABBA pairs of runs of one loop: {arm: [(first step s, other steps s, rank 0's result)]}."""
    runs = {arm: [] for arm in ARMS}
    for pair in range(pairs):
        for arm in (ARMS if pair % 2 == 0 else ARMS[::-1]):
            runs[arm].append(run_once(arm, cfg))
        print("  %s pair %d of %d: loop armed %.3f s, off %.3f s" % (
            name, pair + 1, pairs, sum(runs["armed"][-1][:2]), sum(runs["off"][-1][:2])), flush=True)
    return runs


def paired(runs, measure):
    """(median armed, median off, median of the paired differences, their quartiles) of ``measure(run)``."""
    armed = [measure(run) for run in runs["armed"]]
    off = [measure(run) for run in runs["off"]]
    diffs = [a - o for a, o in zip(armed, off)]
    return statistics.median(armed), statistics.median(off), statistics.median(diffs), quartiles(diffs)


def print_loop(name, cfg, runs):
    """Print one loop's figures; return 1 when its goal is not met, else 0."""
    checks = expected_checks(cfg["steps"], cfg["every"])
    later = checks - 2  # the first step holds two: before and after its update
    whole = paired(runs, lambda run: run[0] + run[1])
    first = paired(runs, lambda run: run[0])
    own = paired(runs, lambda run: run[2]["judged_own_s"])
    first_own = paired(runs, lambda run: run[2]["judged_first_own_s"])
    fingerprint = statistics.median(r["fingerprint_ms"] for _, _, r in runs["armed"] + runs["off"])
    worker_cpu = statistics.median(r["worker_cpu_s"] for _, _, r in runs["armed"]) / checks
    train = paired(runs, lambda run: run[2]["train_cpu_s"])[2] / max(later, 1)
    goal = fingerprint + 1e3 * ROOM
    per_later = 1e3 * own[2] / max(later, 1)
    met = per_later <= goal if later > 0 else None  # a run of the first step alone judges only that
    first_met = 1e3 * first_own[2] <= 2 * goal  # the first step holds two checks, the process's first among them
    print("%s: %s params, batch %d, %d steps, a check every %d (%d checks), %d pairs" % (
        name, format(runs["armed"][0][2]["params"], ","), cfg["batch"], cfg["steps"], cfg["every"], checks,
        len(runs["armed"])))
    print("  loop (medians)    armed %9.3f s   off %9.3f s   a step off %8.3f ms   fingerprint %7.2f ms" % (
        whole[0], whole[1], 1e3 * whole[1] / cfg["steps"], fingerprint))
    print("  the training thread's own time (outside the gradients' all-reduce: not waiting for the other rank),")
    print("  %s:" % ("rank 0's, its check worker on the other core" if cfg.get("spare") else
                     "the rank that lost most, each check worker on its training thread's core"))
    if later > 0:
        print("    each later check  added %+8.2f ms (paired median; IQR %+.2f .. %+.2f)" % (
            per_later, 1e3 * own[3][0] / later, 1e3 * own[3][1] / later))
    print("    first step        added %+8.2f ms (IQR %+.2f .. %+.2f; its 2 checks, the process's first)" % (
        1e3 * first_own[2], 1e3 * first_own[3][0], 1e3 * first_own[3][1]))
    print("  the loop's wall time (both ranks' checks, every wait)")
    print("    per check         added %+8.2f ms (IQR %+.2f .. %+.2f)" % (
        1e3 * whole[2] / checks, 1e3 * whole[3][0] / checks, 1e3 * whole[3][1] / checks))
    print("    first step        added %+8.2f ms (IQR %+.2f .. %+.2f)" % (
        1e3 * first[2], 1e3 * first[3][0], 1e3 * first[3][1]))
    within = {arm: [seconds for _, _, r in runs[arm] for seconds in r.get("judged_within_s", [])] for arm in ARMS}
    within_met = None
    if within["armed"]:
        inside = 1e3 * statistics.median(within["armed"])
        low, high = quartiles([1e3 * seconds for seconds in within["armed"]])
        control = 1e3 * statistics.median(within["off"]) if within["off"] else float("nan")
        within_met = inside <= goal
        print("  within each run (a later check's %d steps against its period's other steps), the same rank:"
              % WINDOW)
        print("    each later check  added %+8.2f ms (median of %d checks; IQR %+.2f .. %+.2f); off, same steps %+.2f"
              % (inside, len(within["armed"]), low, high, control))
    held_met = _print_held(runs)
    print("  CPU per check     %scheck's worker thread %6.2f ms" % (
        "training thread %+7.2f ms (later checks)   " % (1e3 * train) if later > 0 else "", 1e3 * worker_cpu))
    if met is not None:
        print("  goal: the training thread loses <= fingerprint + %.0f ms = %.2f ms a later check: %s" % (
            1e3 * ROOM, goal, "met" if met else "NOT met"))
    print("  goal: and <= 2 x (fingerprint + %.0f ms) = %.2f ms in the first step: %s" % (
        1e3 * ROOM, 2 * goal, "met" if first_met else "NOT met"))
    if within_met is not None:
        print("  goal (within runs): <= fingerprint + %.0f ms = %.2f ms a later check: %s" % (
            1e3 * ROOM, goal, "met" if within_met else "NOT met"))
    return sum(not ok for ok in (met, first_met, within_met) + held_met if ok is not None)


def _print_held(runs):
    """Print where the checks held the training thread beyond their fingerprints; return (later met, first step
    met), None where not measured."""
    later = {arm: [pair for _, _, r in runs[arm] for pair in r.get("judged_held", [])] for arm in ARMS}
    first = {arm: [r["judged_held_first"] for _, _, r in runs[arm] if r.get("judged_held_first")] for arm in ARMS}
    if not first["armed"]:
        return None, None
    print("  held: the same rank's time in torch's step hooks (the check's) beyond the fingerprints inside them:")
    verdicts = []
    for what, pairs, checks in (("each later check", later, 1), ("first step", first, 2)):
        if not pairs["armed"]:
            verdicts.append(None)
            continue
        beyond = [1e3 * (held - inside) for held, inside in pairs["armed"]]
        low, high = quartiles(beyond)
        control = statistics.median(1e3 * held for held, _ in pairs["off"]) if pairs["off"] else float("nan")
        print("    %-17s %+8.2f ms (median of %d; IQR %+.2f .. %+.2f); its fingerprint%s %.2f ms; off %+.2f" % (
            what, statistics.median(beyond), len(beyond), low, high, "s" if checks > 1 else "",
            1e3 * statistics.median(inside for _, inside in pairs["armed"]), control))
        verdicts.append(statistics.median(beyond) <= checks * 1e3 * ROOM)
    print("  goal (held): <= the fingerprint + %.0f ms a check: %s a later check, %s in the first step" % (
        1e3 * ROOM, *("met" if ok else "NOT met" if ok is not None else "none" for ok in verdicts)))
    return tuple(verdicts)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--loops", default=",".join(LOOPS), help="comma-separated, of: %s" % ", ".join(LOOPS))
    parser.add_argument("--pairs", type=int, default=None, help="ABBA pairs of runs per loop (default: %s)"
                        % ", ".join("%s %d" % item for item in PAIRS.items()))
    parser.add_argument("--smoke", action="store_true",
                        help="1 pair of 30 steps of the small loops (100m runs as small): the script works")
    args = parser.parse_args()
    if args.rank:
        rank, port, cfg = args.rank
        return rank_main(int(rank), int(port), json.loads(cfg))
    names = [n.strip() for n in args.loops.split(",") if n.strip()]
    if not names or any(n not in LOOPS for n in names):
        parser.error("--loops: %s; give some of %s" % (args.loops, ", ".join(LOOPS)))
    if args.pairs is not None and args.pairs < 1:
        parser.error("--pairs: %d; give 1 or more" % args.pairs)
    pinned = len(os.sched_getaffinity(0)) >= 2 if hasattr(os, "sched_getaffinity") else False  # as rank_main
    print("%s; 2 gloo ranks, 1 thread each, %s; load average %s" % (
        time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "each pinned to a core" if pinned else "NOT pinned (fewer than 2 cores here): no spare core either",
        " ".join("%.1f" % v for v in os.getloadavg())), flush=True)
    missed = 0
    measured = {}
    for name in names:
        cfg = dict(LOOPS[name])
        pairs = args.pairs or PAIRS[name]
        if args.smoke:  # seconds, not minutes: every loop is a small one (its worker's core kept), 30 steps, once
            cfg = dict(LOOPS["small"], steps=30, spare=bool(cfg.get("spare")))
            pairs = 1
        key = json.dumps([cfg, pairs], sort_keys=True)
        if key not in measured:  # loops of the same configuration share their runs (each run starts 2 torch)
            measured[key] = measure(name, cfg, pairs)
        missed += print_loop(name, cfg, measured[key])
    print("load average at the end %s" % " ".join("%.1f" % v for v in os.getloadavg()))
    print("every goal met" if not missed else "%d goal(s) not met" % missed)
    return 0


if __name__ == "__main__":
    sys.exit(main())

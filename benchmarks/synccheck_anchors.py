#!/usr/bin/env python
"""One SyncCheck comparison against the methods users already have, side by side in one run (not a test).

For each model size (``--sizes``, million parameters: 0.26, 4, 17 and 100 by default) two processes
(torch.distributed over gloo, CPU, one thread each) hold the same float32 model (square ``Linear`` layers)
and run, in rotating order, ``--reps`` times each:

* ``zero-code check``: the check as ``TPU_CLOSURE_FIX_SYNC_CHECK`` runs it: the real optimizer step hook
  armed at every step (``hook.arm(1)``, what ``TPU_CLOSURE_FIX_SYNC_CHECK=1`` does), an SGD step over the
  model's parameters (no gradients: the step changes nothing, its post-hook checks). The training thread
  fingerprints (``compare.prepare``) and hands the check to the worker thread, which agrees, exchanges and
  decides; *held* is the optimizer step's wall time, the rest is measured until the worker delivered the
  verdict (``worker.drain``);
* ``compare_replicas``: ``compare_replicas(model, step)``: the same check with the agreement and the
  exchange on the calling thread (its pass leaves out the sums of |values|: computed only on a difference);
* ``its fingerprint``: ``fingerprint.local_vector`` alone, the part of a check that is local;
* ``compare_replicas, elementwise``: ``compare_replicas`` with ``xxhash`` made unavailable: the hash of a CPU
  without it (and the CPU's before XXH3), paired with XXH3 in the same run;
* ``Megatron-core``: ``check_param_hashes_across_dp_replicas``'s method: a SHA-1 (hashlib) of each
  parameter's bytes on the host, the stacked 20-byte digests all-gathered over the gloo group, compared
  with rank 0's (read in place, as its ``.numpy()`` buffer is: no copy of a float32 parameter);
* ``all-gather + torch.equal``: each parameter all-gathered, every copy compared with ``torch.equal``;
* ``per-tensor sums``: each parameter's sum, one MAX all-reduce of ``[sums, -sums]`` (sees no permutation
  and no sum-preserving change: a speed anchor only);
* ``one t.sum() pass``: ``p.sum()`` of every parameter, no collective: the floor (one read of the bytes).

Each run of a method starts after a barrier. Per method, rank 0's medians of: the time the calling (training)
thread is held, the work (CPU time of the whole process, the check's worker and gloo's threads included, until
the verdict is known), the bytes the process sends (``wchar`` of /proc/self/io: gloo's and the store's socket
writes) and the peak extra memory (VmHWM after the call minus VmRSS before, VmHWM reset through
/proc/self/clear_refs; Linux). Every method must find the replicas equal, or the run stops.

The goals, each judged on the measure it names: (a) the training thread is held by the zero-code check no
longer than by the fingerprint itself (held time); (b) at 100 M parameters one zero-code check is at most 3x one
``t.sum()`` pass over the same bytes (work: the whole check, worker included); (c) at every size the zero-code
check holds the training thread less than each anchor does (held time). The work of each anchor against the
zero-code check's is printed too, with whether the check is faster there. The machine is shared: held times
include waiting for a core, work does not.

    python benchmarks/synccheck_anchors.py                 # the table in docs/synccheck.md (about 3-6 minutes)
    python benchmarks/synccheck_anchors.py --sizes 0.26,4 --reps 21
    python benchmarks/synccheck_anchors.py --smoke         # a few seconds: the script works
"""
import argparse
import ctypes
import gc
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

#: million parameters -> (width, layers) of square Linear layers with biases: 263,168 / 4,198,400 /
#: 16,785,408 / 100,687,872 parameters.
SIZES = {"0.26": (256, 4), "4": (1024, 4), "17": (2048, 4), "100": (4096, 6)}
#: Repetitions per size (medians): fewer where one repetition of every method takes seconds.
REPS = {"0.26": 41, "4": 21, "17": 11, "100": 7}
ZERO, THIS, FINGERPRINT = "zero-code check", "compare_replicas", "its fingerprint"
MEGATRON, GATHER, SUMS, FLOOR = ("Megatron-core (SHA-1)", "all-gather + torch.equal", "per-tensor sums",
                                 "one t.sum() pass")
ELEMENTWISE = "compare_replicas, elementwise"
METHODS = (ZERO, THIS, FINGERPRINT, ELEMENTWISE, MEGATRON, GATHER, SUMS, FLOOR)
ANCHORS = (MEGATRON, GATHER, SUMS)
#: At FLOOR_SIZE million parameters, one check takes at most FLOOR_GOAL t.sum() passes over the same bytes.
FLOOR_SIZE, FLOOR_GOAL = "100", 3.0
#: Goal (a): held no longer than the fingerprint, read with this much room for the timer's noise (5 %).
HELD_ROOM = 1.05
#: Seconds the zero-code check's verdict may take before the run stops (a correct run takes milliseconds).
VERDICT_WAIT = 120.0


# --------------------------------------------------------------------------- the methods (in a rank)
def _memory(tensor):
    """The bytes of a contiguous CPU tensor in place (what hashlib reads of Megatron's numpy buffer)."""
    return (ctypes.c_ubyte * (tensor.numel() * tensor.element_size())).from_address(tensor.data_ptr())


def megatron(params, dist):
    """Megatron-core's check_param_hashes_across_dp_replicas, its steps on a CPU float32 model."""
    import torch

    digests = [torch.tensor(list(hashlib.sha1(_memory(p.data.to("cpu").float())).digest()), dtype=torch.uint8)
               for p in params]
    local = torch.stack(digests)
    gathered = [torch.zeros_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return torch.equal(local, gathered[0])


def gather_equal(params, dist):
    """Each parameter all-gathered and compared, copy by copy, with torch.equal."""
    import torch

    same = True
    for p in params:
        copies = [torch.empty_like(p) for _ in range(dist.get_world_size())]
        dist.all_gather(copies, p.detach())
        same = all(torch.equal(c, p) for c in copies) and same
    return same


def sums(params, dist):
    """Per-tensor float32 sums, one MAX all-reduce of [s, -s]: equal where max == -max(-s)."""
    import torch

    s = torch.stack([p.detach().sum() for p in params])
    both = torch.cat([s, -s])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return torch.equal(both[:len(params)], -both[len(params):])


def floor(params):
    for p in params:
        p.detach().sum()
    return True


# --------------------------------------------------------------------------- measuring (in a rank)
def _proc_field(path, name):
    with open(path) as handle:
        for line in handle:
            if line.startswith(name):
                return int(line.split()[1])
    return 0


def _reset_peak():
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def measured(call):
    """(held s, thread CPU s, work s, bytes sent, peak extra bytes or None) of one call, which must return True,
    or ``(True, held s, thread CPU s)`` when the calling thread was held for less than the call (the zero-code
    check: the call waits for the worker's verdict after the training thread went on). Thread CPU: the CPU time
    of the calling thread while held (what waiting for a core or for a peer does not add to)."""
    gc.collect()
    rss = _proc_field("/proc/self/status", "VmRSS:")
    peak_known = _reset_peak()
    sent = _proc_field("/proc/self/io", "wchar:")
    work = time.process_time()
    thread = time.thread_time()
    start = time.perf_counter()
    verdict = call()
    held = time.perf_counter() - start
    thread = time.thread_time() - thread
    if isinstance(verdict, tuple):
        verdict, held, thread = verdict
    work = time.process_time() - work
    sent = _proc_field("/proc/self/io", "wchar:") - sent
    # pages freed since the RSS was read can put the high-water mark below it: no extra memory then
    peak = max(0, _proc_field("/proc/self/status", "VmHWM:") - rss) * 1024 if peak_known else None
    if verdict is not True:  # a message: what went wrong
        raise SystemExit("a method did not find the replicas (the same model) equal: %s" % (verdict,))
    return held, thread, work, sent, peak


def _model(size):
    import torch

    width, layers = SIZES[size]
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def worker(rank, port, size, reps):
    import torch
    import torch.distributed as dist

    sys.path.insert(0, REPO)
    from tpu_closure_fix.synccheck import compare, fingerprint, groups, hook
    from tpu_closure_fix.synccheck import worker as check_worker

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=2)
    net = _model(size)
    params = [p for p in net.parameters()]
    step = [0]

    def this_check():
        step[0] += 1
        report = compare.compare_replicas(net, step=step[0])
        return report.outcome == "identical" or report.message()

    def elementwise_check():
        saved = [fingerprint.xxhash_module()]
        fingerprint._xxhash[:] = [None]  # as on a machine without xxhash (both ranks: the same format)
        try:
            return this_check()
        finally:
            fingerprint._xxhash[:] = saved

    hook.arm(1)  # what TPU_CLOSURE_FIX_SYNC_CHECK=1 arms: a check at every optimizer step
    # no parameter has a gradient: SGD's step changes nothing, and torch runs the check's hooks around it
    probe = torch.optim.SGD(params, lr=0.0)

    def zero_code_check():
        before = hook.seen["checks"]
        thread = time.thread_time()
        start = time.perf_counter()
        probe.step()
        held = time.perf_counter() - start  # what the training thread gives the check
        thread = time.thread_time() - thread
        if not check_worker.drain(VERDICT_WAIT):
            return "no verdict from the check's worker within %.0f s" % VERDICT_WAIT
        report = hook.seen["last_report"]
        if hook.seen["checks"] == before or report is None:
            return "the zero-code check delivered no report (is the hook armed?)"
        return (report.outcome == "identical" or report.message()), held, thread

    def its_fingerprint():
        layout = groups.Layout(list(net.named_parameters()), rank)
        fingerprint.local_vector(layout.entries, layout.structures, step=step[0], lanes=layout.lanes)
        return True

    calls = {ZERO: zero_code_check, THIS: this_check, FINGERPRINT: its_fingerprint, ELEMENTWISE: elementwise_check,
             MEGATRON: lambda: megatron(params, dist),
             GATHER: lambda: gather_equal(params, dist), SUMS: lambda: sums(params, dist),
             FLOOR: lambda: floor(params)}
    samples = {name: [] for name in METHODS}
    with torch.no_grad():
        for rep in range(reps + 1):
            shift = rep % len(METHODS)  # rotating order: no method always runs first or after another
            for name in METHODS[shift:] + METHODS[:shift]:
                dist.barrier()
                result = measured(calls[name])
                if rep:  # the first repetition warms up (the check makes its own gloo group and worker there)
                    samples[name].append(result)
    dist.barrier()
    if rank == 0:
        out = {"size": size, "parameters": sum(p.numel() for p in params), "tensors": len(params), "reps": reps,
               "xxh3": fingerprint.uses_xxh3(), "torch": torch.__version__, "methods": {}}
        for name, rows in samples.items():
            held, thread, work, sent, peak = zip(*rows)
            out["methods"][name] = {"held_ms": statistics.median(held) * 1e3, "work_ms": statistics.median(work) * 1e3,
                                    "thread_ms": statistics.median(thread) * 1e3,
                                    "sent_bytes": statistics.median(sent),
                                    "peak_bytes": None if None in peak else statistics.median(peak)}
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()


# --------------------------------------------------------------------------- the run (parent)
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(size, reps):
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", TPU_CLOSURE_FIX="0", PYTHONPATH=REPO)
    env.pop("TPU_CLOSURE_FIX_SYNC_CHECK", None)
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", str(rank), str(port), size,
                               str(reps)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True) for rank in range(2)]
    outs = [p.communicate(timeout=3600) for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("size %s M: a rank failed (exit codes %s):\n%s" % (
            size, [p.returncode for p in procs], "\n".join(err[-1500:] for _, err in outs)))
    return json.loads(outs[0][0].strip().splitlines()[-1])


def _size_text(n):
    return "%.2f M" % (n / 1e6) if n < 1e6 else "%.1f M" % (n / 1e6)


def _bytes_text(n):
    if n is None:
        return "n/a"
    return "%.0f B" % n if n < 1024 else "%.1f KiB" % (n / 1024) if n < 1 << 20 else "%.1f MiB" % (n / (1 << 20))


def print_table(results):
    print("%-9s %-30s %10s %10s %10s %12s %12s" % ("params", "method", "held ms", "thread ms", "work ms", "sent/rank",
                                                    "peak extra"))
    for r in results:
        for name in METHODS:
            m = r["methods"][name]
            print("%-9s %-30s %10.2f %10.2f %10.2f %12s %12s" % (
                _size_text(r["parameters"]), name, m["held_ms"], m["thread_ms"], m["work_ms"],
                _bytes_text(m["sent_bytes"]), _bytes_text(m["peak_bytes"])))


def _verdict(ok):
    return "met" if ok else "NOT met"


def goals(results):
    """Print the three goals with their ratios, each judged on the measure it names, and whether each is met;
    return the number of goals not met. (a) held: the zero-code check holds the training thread no longer than
    its fingerprint takes; (b) work, at FLOOR_SIZE M only: one zero-code check (worker included) at most
    FLOOR_GOAL t.sum() passes; (c) held: the zero-code check holds the training thread less than each anchor."""
    missed = 0
    for r in results:
        held = {name: m["held_ms"] for name, m in r["methods"].items()}
        work = {name: m["work_ms"] for name, m in r["methods"].items()}
        size = _size_text(r["parameters"])
        ok = held[ZERO] <= HELD_ROOM * held[FINGERPRINT]
        missed += not ok
        print("%-9s (a) held: zero-code check %8.2f ms / its fingerprint %8.2f ms = %5.2fx; goal <= 1x: %s"
              % (size, held[ZERO], held[FINGERPRINT], held[ZERO] / held[FINGERPRINT], _verdict(ok)))
        thread = {name: m.get("thread_ms") for name, m in r["methods"].items()}
        if thread[ZERO] and thread[FINGERPRINT]:
            print("%-9s     the training thread's CPU time: %8.2f ms / %8.2f ms = %5.2fx (waiting for a core not in it)"
                  % (size, thread[ZERO], thread[FINGERPRINT], thread[ZERO] / thread[FINGERPRINT]))
        if r["size"] == FLOOR_SIZE:
            ratio = work[ZERO] / work[FLOOR]
            ok = ratio <= FLOOR_GOAL
            missed += not ok
            print("%-9s (b) work: zero-code check %8.2f ms / one t.sum() pass %8.2f ms = %5.2fx; goal <= %.0fx: %s"
                  % (size, work[ZERO], work[FLOOR], ratio, FLOOR_GOAL, _verdict(ok)))
        for anchor in ANCHORS:
            ok = held[ZERO] < held[anchor]
            missed += not ok
            print("%-9s (c) held: %-24s %8.2f ms / zero-code check %8.2f ms = %6.2fx; goal > 1x: %s"
                  % (size, anchor, held[anchor], held[ZERO], held[anchor] / held[ZERO], _verdict(ok)))
    if not any(r["size"] == FLOOR_SIZE for r in results):
        print("goal (b) <= %.0fx one t.sum() pass: not measured (it is set at %s M parameters: --sizes %s)"
              % (FLOOR_GOAL, FLOOR_SIZE, FLOOR_SIZE))
    return missed


def work_ratios(results):
    """Print the work (CPU time until the verdict) of each anchor against the zero-code check's, whether the
    check is faster there, and what the worker and XXH3 change; return how many anchors do less work."""
    slower = 0
    for r in results:
        held = {name: m["held_ms"] for name, m in r["methods"].items()}
        work = {name: m["work_ms"] for name, m in r["methods"].items()}
        size = _size_text(r["parameters"])
        for anchor in ANCHORS:
            faster = work[ZERO] < work[anchor]
            slower += not faster
            print("%-9s work: %-24s %8.2f ms / zero-code check %8.2f ms = %6.2fx; check faster: %s"
                  % (size, anchor, work[anchor], work[ZERO], work[anchor] / work[ZERO], "yes" if faster else "NO"))
        print("%-9s held: compare_replicas %8.2f ms / zero-code check %8.2f ms = %6.2fx (the worker's gain)"
              % (size, held[THIS], held[ZERO], held[THIS] / held[ZERO]))
        print("%-9s work: elementwise hash %8.2f ms / compare_replicas %8.2f ms = %6.2fx (XXH3's gain)"
              % (size, work[ELEMENTWISE], work[THIS], work[ELEMENTWISE] / work[THIS]))
        if r["size"] == FLOOR_SIZE:
            print("%-9s held: zero-code check %8.2f ms / one t.sum() pass %8.2f ms = %5.2fx (goal (b) is on work)"
                  % (size, held[ZERO], held[FLOOR], held[ZERO] / held[FLOOR]))
    return slower


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default=",".join(SIZES), help="million parameters, comma-separated, of: %s"
                        % ", ".join(SIZES))
    parser.add_argument("--reps", type=int, default=None, help="repetitions per size (default: %s)"
                        % ", ".join("%s M: %d" % item for item in REPS.items()))
    parser.add_argument("--json", metavar="PATH", help="also write the measurements there")
    parser.add_argument("--smoke", action="store_true", help="0.26 M parameters, 1 repetition: the script works")
    args = parser.parse_args()
    if args.worker:
        rank, port, size, reps = args.worker
        worker(int(rank), int(port), size, int(reps))
        return 0
    sizes = ["0.26"] if args.smoke else [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown or not sizes:
        parser.error("--sizes: %s is not one of %s" % (", ".join(unknown) or "nothing", ", ".join(SIZES)))
    if args.reps is not None and args.reps < 1:
        parser.error("--reps: %d; give 1 or more" % args.reps)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results = []
    for size in sizes:
        reps = 1 if args.smoke else args.reps or REPS[size]
        print("measuring %s M parameters (%d repetitions of each method, 2 gloo ranks) ..." % (size, reps), flush=True)
        results.append(measure(size, reps))
    print("%s; torch %s; CPU hash: %s" % (started, results[0]["torch"], "XXH3 (xxhash)" if results[0]["xxh3"]
                                           else "elementwise (no xxhash)"))
    print("medians of rank 0; held: the caller's wall time")
    print_table(results)
    print("goals: (a), (c) on the time the training thread is held; (b) on the work of the whole check:")
    missed = goals(results)
    print("work (CPU time of the process until the verdict, worker and gloo threads included) against each anchor:")
    slower = work_ratios(results)
    print("in work, %d anchor row(s) cheaper than the zero-code check" % slower if slower
          else "in work, the zero-code check is cheaper than every anchor")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"started": started, "results": results}, handle, indent=1)
    print("%d goal(s) not met" % missed if missed else "every goal met")
    return 0


if __name__ == "__main__":
    sys.exit(main())

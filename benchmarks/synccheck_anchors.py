#!/usr/bin/env python
"""One SyncCheck comparison against the methods users already have, side by side in one run (not a test).

For each model size (``--sizes``, million parameters: 0.26, 4, 17 and 100 by default) two processes
(torch.distributed over gloo, CPU, one thread each) hold the same float32 model (square ``Linear`` layers)
and run, in rotating order, ``--reps`` times each:

* ``this check``: ``compare_replicas(model, step)`` (fingerprint, agreement through the store, one MAX
  all-reduce of the fixed-length vector on the check's own gloo group, verdict);
* ``its fingerprint``: ``fingerprint.local_vector`` alone, the part of a check that is local;
* ``this check, elementwise hash``: the same check with ``xxhash`` made unavailable: the hash of a CPU without it
  (and the CPU's before XXH3), paired with XXH3 in the same run;
* ``Megatron-core``: ``check_param_hashes_across_dp_replicas``'s method: a SHA-1 (hashlib) of each
  parameter's bytes on the host, the stacked 20-byte digests all-gathered over the gloo group, compared
  with rank 0's (read in place, as its ``.numpy()`` buffer is: no copy of a float32 parameter);
* ``all-gather + torch.equal``: each parameter all-gathered, every copy compared with ``torch.equal``;
* ``per-tensor sums``: each parameter's sum, one MAX all-reduce of ``[sums, -sums]`` (sees no permutation
  and no sum-preserving change: a speed anchor only);
* ``one t.sum() pass``: ``p.sum()`` of every parameter, no collective: the floor (one read of the bytes).

Each run of a method starts after a barrier. Per method, rank 0's medians of: the time the calling (training)
thread is held, the work (CPU time of the whole process, gloo's threads included), the bytes the process
sends (``wchar`` of /proc/self/io: gloo's and the store's socket writes) and the peak extra memory (VmHWM
after the call minus VmRSS before, VmHWM reset through /proc/self/clear_refs; Linux). Every method must find
the replicas equal, or the run stops.

Goals printed with their ratios: this check is faster than each anchor at every size; at 100 M parameters
it takes at most 3x one ``t.sum()`` pass over the same bytes; the training thread is held
no longer than the fingerprint (in this version the exchange runs on the training thread: reported as is).

    python benchmarks/synccheck_anchors.py                 # the table in docs/synccheck.md (about 3 minutes)
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
THIS, FINGERPRINT, MEGATRON, GATHER, SUMS, FLOOR = ("this check", "its fingerprint", "Megatron-core (SHA-1)",
                                                    "all-gather + torch.equal", "per-tensor sums", "one t.sum() pass")
ELEMENTWISE = "this check, elementwise hash"
METHODS = (THIS, FINGERPRINT, ELEMENTWISE, MEGATRON, GATHER, SUMS, FLOOR)
ANCHORS = (MEGATRON, GATHER, SUMS)
#: At FLOOR_SIZE million parameters, one check takes at most FLOOR_GOAL t.sum() passes over the same bytes.
FLOOR_SIZE, FLOOR_GOAL = "100", 3.0


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
    """(held s, work s, bytes sent, peak extra bytes or None) of one call, which must return True."""
    gc.collect()
    rss = _proc_field("/proc/self/status", "VmRSS:")
    peak_known = _reset_peak()
    sent = _proc_field("/proc/self/io", "wchar:")
    work = time.process_time()
    start = time.perf_counter()
    verdict = call()
    held = time.perf_counter() - start
    work = time.process_time() - work
    sent = _proc_field("/proc/self/io", "wchar:") - sent
    # pages freed since the RSS was read can put the high-water mark below it: no extra memory then
    peak = max(0, _proc_field("/proc/self/status", "VmHWM:") - rss) * 1024 if peak_known else None
    if verdict is not True:
        raise SystemExit("a method found replicas that hold the same model different: %r" % (verdict,))
    return held, work, sent, peak


def _model(size):
    import torch

    width, layers = SIZES[size]
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def worker(rank, port, size, reps):
    import torch
    import torch.distributed as dist

    sys.path.insert(0, REPO)
    from tpu_closure_fix.synccheck import compare, fingerprint, groups

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

    def its_fingerprint():
        layout = groups.Layout(list(net.named_parameters()), rank)
        fingerprint.local_vector(layout.entries, layout.structures, step=step[0], lanes=layout.lanes)
        return True

    calls = {THIS: this_check, FINGERPRINT: its_fingerprint, ELEMENTWISE: elementwise_check,
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
                if rep:  # the first repetition warms up (the check makes its own gloo group there)
                    samples[name].append(result)
    dist.barrier()
    if rank == 0:
        out = {"size": size, "parameters": sum(p.numel() for p in params), "tensors": len(params), "reps": reps,
               "xxh3": fingerprint.uses_xxh3(), "torch": torch.__version__, "methods": {}}
        for name, rows in samples.items():
            held, work, sent, peak = zip(*rows)
            out["methods"][name] = {"held_ms": statistics.median(held) * 1e3, "work_ms": statistics.median(work) * 1e3,
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
    print("%-9s %-28s %10s %10s %12s %12s" % ("params", "method", "held ms", "work ms", "sent/rank", "peak extra"))
    for r in results:
        for name in METHODS:
            m = r["methods"][name]
            print("%-9s %-28s %10.2f %10.2f %12s %12s" % (_size_text(r["parameters"]), name, m["held_ms"], m["work_ms"],
                                                           _bytes_text(m["sent_bytes"]), _bytes_text(m["peak_bytes"])))


def goals(results, measure="held_ms"):
    """Print every ratio of ``measure`` (``held_ms``: the time the calling thread is held; ``work_ms``: the
    CPU time of the process) and whether its goal is met; return the number of goals not met."""
    missed = 0
    word = "held" if measure == "held_ms" else "work"
    for r in results:
        value = {name: m[measure] for name, m in r["methods"].items()}
        size = _size_text(r["parameters"])
        for anchor in ANCHORS:
            ok = value[THIS] < value[anchor]
            missed += not ok
            print("%-9s %s %-26s %8.2f ms / this check %8.2f ms = %5.2fx; goal > 1x: %s"
                  % (size, word, anchor, value[anchor], value[THIS], value[anchor] / value[THIS],
                     "met" if ok else "NOT met"))
        print("%-9s %s %-26s %8.2f ms / this check %8.2f ms = %5.2fx (XXH3's gain)"
              % (size, word, "elementwise hash", value[ELEMENTWISE], value[THIS], value[ELEMENTWISE] / value[THIS]))
        if measure == "held_ms":
            ok = value[THIS] <= 1.05 * value[FINGERPRINT]
            missed += not ok
            print("%-9s held by the check %8.2f ms / its fingerprint %8.2f ms = %5.2fx; goal <= 1x: %s"
                  % (size, value[THIS], value[FINGERPRINT], value[THIS] / value[FINGERPRINT],
                     "met" if ok else "NOT met (exchange held)"))
        if r["size"] == FLOOR_SIZE:
            ratio = value[THIS] / value[FLOOR]
            ok = ratio <= FLOOR_GOAL
            missed += not ok
            print("%-9s %s this check %8.2f ms / one t.sum() pass %8.2f ms = %5.2fx; goal <= %.0fx: %s"
                  % (size, word, value[THIS], value[FLOOR], ratio, FLOOR_GOAL, "met" if ok else "NOT met"))
    if not any(r["size"] == FLOOR_SIZE for r in results):
        print("goal <= %.0fx one t.sum() pass: not measured (it is set at %s M parameters: --sizes %s)"
              % (FLOOR_GOAL, FLOOR_SIZE, FLOOR_SIZE))
    return missed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default=",".join(SIZES), help="million parameters, comma-separated, of: %s"
                        % ", ".join(SIZES))
    parser.add_argument("--reps", type=int, default=None, help="repetitions per size (default: %s)"
                        % ", ".join("%s M: %d" % item for item in REPS.items()))
    parser.add_argument("--json", metavar="PATH", help="also write the measurements there")
    parser.add_argument("--smoke", action="store_true", help="0.26 M parameters, 3 repetitions: the script works")
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
        reps = 3 if args.smoke else args.reps or REPS[size]
        print("measuring %s M parameters (%d repetitions of each method, 2 gloo ranks) ..." % (size, reps), flush=True)
        results.append(measure(size, reps))
    print("%s; torch %s; CPU hash: %s; medians of rank 0; held: wall time of the call"
          % (started, results[0]["torch"], "XXH3 (xxhash)" if results[0]["xxh3"] else "elementwise (no xxhash)"))
    print_table(results)
    print("goals on the time the calling (training) thread is held:")
    missed = goals(results)
    print("the same goals on the work (CPU time of the process: what a loaded machine does not distort):")
    missed += goals(results, "work_ms")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"started": started, "results": results}, handle, indent=1)
    print("%d goal(s) not met" % missed if missed else "every goal met")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""What the fingerprint costs a model of many small tensors: the one-piece pass against the streamed one,
paired (not a test).

A model of ``--layers`` times ``Linear(64, 64)`` and ``LayerNorm(64)`` (800 tensors and 0.86 M parameters by
default) is laid out and fingerprinted as the zero-code check does it (``groups.Layout``, then
``fingerprint.local_vector`` keeping each tensor's hash and sums), in one process on one thread. Runs alternate
in ABBA order between the fingerprint as it is (a tensor that fits one piece is hashed in one call and summed
with no running total: ``fingerprint._one_piece``) and every tensor streamed piece by piece
(``fingerprint._streamed``, the pass every tensor took before); each run is the median of ``--reps``
fingerprints. Printed: both medians, the median of the pairs' differences with its interquartile range, and the
time per tensor. Both passes give the same fields bit for bit (tests/unit/test_fingerprint_xxh3.py).

    python benchmarks/synccheck_tensors.py            # the figures in docs/synccheck.md (about 30 s)
    python benchmarks/synccheck_tensors.py --smoke    # a second or two: the script works
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from _stats import quartiles  # noqa: E402

ARMS = ("one-piece", "streamed")


def model_tensors(layers):
    """``[(name, tensor)]`` of ``layers`` times ``Linear(64, 64)`` and ``LayerNorm(64)``."""
    import torch

    modules = []
    for _ in range(layers):
        modules += [torch.nn.Linear(64, 64), torch.nn.LayerNorm(64)]
    return list(torch.nn.Sequential(*modules).named_parameters())


def fingerprint_once(named):
    """Seconds of one fingerprint of ``named``, its layout included (the training thread's part of a check)."""
    from tpu_closure_fix.synccheck import fingerprint, groups

    start = time.perf_counter()
    layout = groups.Layout(named, 0)
    fingerprint.local_vector(layout.entries, layout.structures, step=1, lanes=layout.lanes, details={})
    return time.perf_counter() - start


def run(named, arm, reps):
    """The median seconds of ``reps`` fingerprints with the pass of ``arm``."""
    from tpu_closure_fix.synccheck import fingerprint

    one_piece = fingerprint._one_piece
    if arm == "streamed":  # the pass every tensor took before: piece by piece, with running totals
        fingerprint._one_piece = lambda raw, position, summed, scale: fingerprint._streamed(
            [raw], position, summed, scale)
    try:
        return statistics.median(fingerprint_once(named) for _ in range(reps))
    finally:
        fingerprint._one_piece = one_piece


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=200, help="Linear + LayerNorm pairs (default 200)")
    parser.add_argument("--reps", type=int, default=30, help="fingerprints a run (default 30)")
    parser.add_argument("--pairs", type=int, default=10, help="ABBA pairs of runs (default 10)")
    parser.add_argument("--smoke", action="store_true", help="10 layers, 3 fingerprints a run, 1 pair")
    args = parser.parse_args()
    for name in ("layers", "reps", "pairs"):
        if getattr(args, name) < 1:
            parser.error("--%s: %d; give 1 or more" % (name, getattr(args, name)))
    if args.smoke:
        args.layers, args.reps, args.pairs = 10, 3, 1
    import torch

    torch.set_num_threads(1)
    named = model_tensors(args.layers)
    with torch.no_grad():
        for arm in ARMS:  # each pass's first calls paid outside the runs
            run(named, arm, 2)
        runs = {arm: [] for arm in ARMS}
        for pair in range(args.pairs):
            for arm in (ARMS if pair % 2 == 0 else ARMS[::-1]):
                runs[arm].append(run(named, arm, args.reps))
    diffs = [1e3 * (one - streamed) for one, streamed in zip(runs["one-piece"], runs["streamed"])]
    low, high = quartiles(diffs)
    print("%s; %d tensors, %s parameters; %d pairs of %d fingerprints; load average %s" % (
        time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), len(named), format(sum(t.numel() for _, t in named), ","),
        args.pairs, args.reps, " ".join("%.1f" % v for v in os.getloadavg())))
    for arm in ARMS:
        median = statistics.median(runs[arm])
        print("  %-9s  a fingerprint %8.3f ms   a tensor %6.1f us" % (arm, 1e3 * median, 1e6 * median / len(named)))
    print("  one-piece - streamed, paired median %+.3f ms (IQR %+.3f .. %+.3f)" % (statistics.median(diffs), low, high))
    return 0


if __name__ == "__main__":
    sys.exit(main())

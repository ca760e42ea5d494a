"""Shared helpers of the benchmarks: paired-run statistics, printed as one table line per measure."""
import statistics


def quartiles(values):
    values = sorted(values)
    if len(values) < 4:
        return values[0], values[-1]
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def summary(name, base, treated, unit, scale=1.0, goal=None, relative=False):
    """Print medians of both arms and the median (IQR) of the paired differences; return the added cost."""
    diffs = [(t - b) * scale for b, t in zip(base, treated)]
    added = statistics.median(diffs)
    lo, hi = quartiles(diffs)
    line = "%-34s n=%-3d base %9.3f %s | with %9.3f %s | added (paired median) %+8.3f %s [IQR %+.3f .. %+.3f]" % (
        name, len(diffs), statistics.median(base) * scale, unit, statistics.median(treated) * scale, unit,
        added, unit, lo, hi)
    if relative:
        pct = 100.0 * added / (statistics.median(base) * scale)
        line += " = %+.2f%%" % pct
        added = pct
    if goal is not None:
        line += "  goal <= %s: %s" % (goal, "met" if added <= goal else "NOT met")
    print(line, flush=True)
    return added

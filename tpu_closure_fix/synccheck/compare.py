"""One check: list the tensors, lay them out over their replica groups, fingerprint, agree, reduce once,
decide, and -- only on a difference -- name the tensors and ranks exactly.

A check's exchanges: the MAX of the fingerprint vectors (always), and one all-gather of a few numbers per
rank when the reduced vector shows a difference or ranks out of step (every rank reads the same reduced
vector, so every rank decides alike whether to enter it). Before the first, the ranks agree that all of them
reached this check (:mod:`.comm`); a check on the calling thread (:func:`run`) of up to ``comm.GATHER_RANKS``
ranks takes its MAX in that same meeting, the vectors riding with the agreement through the store
(``channel.meet``): no collective unless the replicas differ.
"""
import weakref

from . import comm, decisions, evidence, fingerprint, groups
from .report import SyncReport, act

DEFAULT_EVERY = 100
DEFAULT_TOLERANCE = 1e-6
ON_DIVERGENCE = ("warn", "raise")
#: Tensors whose per-rank hashes one all-gather carries at most (6 floats each per rank): more differing
#: tensors take more all-gathers (the same number on every rank), so the count stays exact.
MAX_NAMED = 16384
#: Fields per tensor in that all-gather: lane, hash halves, non-finite count, value sum, sum of |values|.
_GATHERED = 6


class Stream(object):
    """One sequence of checks and what it has seen: an optimizer's (the zero-code hook), a callback's, or a
    model's given to ``check_sync`` / ``compare_replicas``. ``key`` names it to the other ranks, ``label``
    to the user (the hook: the optimizer's class and its parameters' module paths); ``replicas``: the
    user's declaration of the replica groups (:data:`groups.ACCEPTED`); ``first_look``: the tensors no layout
    places are decided per tensor at their first look (:mod:`.decisions`: the zero-code check, which arms on
    jobs that declared nothing); False: the caller's ``"auto"`` compares them over the world (the explicit
    calls are the user's declaration)."""

    def __init__(self, key, replicas=groups.WORLD, label=None, first_look=False):
        self.key = key
        self.label = label
        self.replicas = replicas
        self.first_look = first_look
        self.checks = 0
        self.issued = 0  # checks fingerprinted so far (some may still be exchanging)
        self.identical_at = None
        self.different_since = None
        self.stood_down = None
        #: the ranks agreed once whether any of them raises on this stream's divergence (each rank's action is
        #: read once, so one raise-step all-reduce per stream answers it for every later divergence)
        self.raise_settled = False
        #: the latest optimizer step the training thread went past without raising (the zero-code hook's
        #: :func:`.hook._raise_if_due`): a raise step agreed at or before it was learnt too late
        self.passed = 0
        #: what the stream's latest full divergence report said, for :func:`.report.repeat_of`
        self.said = None
        #: ({listed name: module path}, {holding modules' classes}) of the zero-code check's optimizer, or None
        self.module_paths = None
        self._ddp = None  # (ids of the listed tensors, their DDP groups): read once per list of tensors

    def layout(self, named, channel):
        """The :class:`groups.Layout` of ``named`` for a check over ``channel``, from every piece of
        evidence: the tensors' own layouts, the DDP modules holding them, the declaration."""
        declared = groups.declaration(self.replicas, channel.rank)
        if declared == groups.AUTO:  # xm.optimizer_step's replicas: the data-parallel layout, when on XLA
            declared = groups.step_replicas_declaration(declared, channel.kind, channel.size,
                                                        comm.xla_world_size())
        if declared == groups.AUTO and not self.first_look:
            declared = groups.WORLD  # an explicit call: the user chose to compare these tensors
        ddp = {}
        if channel.kind == "torch.distributed":
            ids = tuple(id(t) for _, t in named)
            if self._ddp is None or self._ddp[0] != ids:
                self._ddp = (ids, groups.ddp_groups(named))
            ddp = self._ddp[1]
        return groups.Layout(named, channel.rank, declared=declared, ddp=ddp, world=channel.size)

    def history(self, step):
        """What a report at ``step`` reads from this history (first check, last identical step, different
        since): fields of its :class:`SyncReport`, none for an object with no history."""
        if self.checks < 0:
            return {}
        return {"first_check": self.checks == 0, "identical_at": self.identical_at,
                "different_since": step if self.different_since is None else self.different_since}

    def record(self, report):
        """Add ``report`` (read against this history when it was built) to the history."""
        self.checks += 1
        if report.outcome == "identical":
            self.identical_at, self.different_since = report.step, None
        elif report.diverged and self.different_since is None:
            self.different_since = report.step

    def naming(self, outcome, names, not_compared, set_aside):
        """``(names, not_compared, set_aside, label)`` as a report of ``outcome`` says them: by module path
        (``encoder.layers.3.weight``) where :attr:`module_paths` knows them and the report names tensors (a
        difference, or tensors left out); a path two tensors share keeps the tensor's position too."""
        by_old = self.module_paths[0] if self.module_paths else None
        if not by_old or (outcome == "identical" and not not_compared):
            return names, not_compared, set_aside, self.label
        paths = [by_old.get(n, n) for n in names]
        taken = {}
        for path in paths:
            taken[path] = taken.get(path, 0) + 1
        # parameters of separate modules with no model around them ("weight" twice) keep their position too
        renamed = dict((n, p if taken[p] == 1 else "%s (%s)" % (p, n)) for p, n in zip(paths, names))
        return ([renamed[n] for n in names], [(renamed.get(n, by_old.get(n, n)), why) for n, why in not_compared],
                [renamed.get(n, by_old.get(n, n)) for n in set_aside], self.label)


# --------------------------------------------------------------------------- listing
class Unlisted(Exception):
    """The argument's tensors could not be listed."""


def listed(obj):
    """``[(name, tensor)]`` of what to compare: a module's ``named_parameters()``, an optimizer's param
    groups, a dict name -> tensor, one tensor, or an iterable of tensors / ``(name, tensor)`` pairs.
    Raises :class:`Unlisted` with the reason when none of these applies or listing fails."""
    import torch

    try:
        if hasattr(obj, "named_parameters"):
            return list(obj.named_parameters())
        if hasattr(obj, "param_groups"):
            return [("param_groups[%d][%d]" % (g, i), p) for g, group in enumerate(obj.param_groups)
                    for i, p in enumerate(group["params"])]
        if isinstance(obj, torch.Tensor):
            return [("tensor", obj)]
        if isinstance(obj, dict):
            items = list(obj.items())
        else:
            items = [item if isinstance(item, tuple) and len(item) == 2 else ("param%d" % i, item)
                     for i, item in enumerate(obj)]
    except Exception as exc:
        raise Unlisted("listing the parameters of %s failed (%s: %s)" % (type(obj).__name__, type(exc).__name__, exc))
    for name, tensor in items:
        if not isinstance(tensor, torch.Tensor):
            raise Unlisted("%s holds %r, not a tensor, under %r" % (type(obj).__name__, type(tensor).__name__, name))
    return items


# --------------------------------------------------------------------------- one check
class Pending(object):
    """A check fingerprinted on the training thread and not yet exchanged: everything the exchange and the
    verdict need, and nothing that changes when training goes on (the vector and each tensor's own hash
    and sums are computed now; the tensors themselves are read no more)."""

    __slots__ = ("channel", "stream", "step", "barrier", "layout", "vector", "error")

    def __init__(self, channel, stream, step, barrier, layout, vector, error):
        self.channel, self.stream, self.step, self.barrier = channel, stream, step, barrier
        self.layout, self.vector, self.error = layout, vector, error


def prepare(obj, step, stream, barrier=None, channel=None, kept=True):
    """The training thread's part of a check: list ``obj``'s tensors, lay them out and fingerprint them
    (one pass); a :class:`Pending`, or None on one device. Never waits for another rank.

    ``kept``: each tensor's own hash and sums are kept for naming a difference (the zero-code check, whose
    worker names it after training went on). A caller that waits for the verdict (``kept=False``: :func:`run`)
    leaves out the sums of |values| of CPU tensors hashed with XXH3, the verdict never reads them: on a difference
    :func:`_gathered_rows` computes each named tensor's fields again, from the same unchanged tensors."""
    import torch

    channel = channel or comm.channel()
    if channel is None:
        return None
    stream.issued += 1
    barrier = barrier or "%s/%d" % (stream.key, stream.issued - 1)
    evidence.note(obj)  # a DDP / FSDP module given to the check is evidence of its layout, whenever it was made
    error, layout = None, None
    with torch.no_grad():
        try:
            layout = stream.layout(listed(obj), channel)
            device = channel.device([t for _, _, t in layout.entries])
            details = {}
            vector = fingerprint.local_vector(layout.entries, layout.structures, device, step=step,
                                              lanes=layout.lanes, details=details,
                                              scale=kept or device.type != "cpu")
            if vector.device.type != "cpu":
                # the one device-to-host copy, now, on the training thread: nothing lazy is kept for later
                # (XLA would add it to the training step's next graph), and nothing later reads a device
                # tensor (an XLA tensor read from the worker thread fails inside PJRT)
                vector, details = _to_host(vector, details)
            layout.details = details  # each tensor's own hash and sums, for naming a difference exactly
        except Exception as exc:  # this replica still joins the check, flagged "could not fingerprint"
            error, vector = exc, fingerprint.failed_vector(step=step)
    return Pending(channel, stream, step, barrier, layout, vector, error)


def _to_host(vector, details):
    """(vector, details) on the host, in ONE device-to-host transfer: the vector, each tensor's bit hash (as
    its two exact 16-bit halves in float32) and its sums are concatenated on the device, copied once, and
    split on the host (the hashes come back as unsigned 32-bit values in int64)."""
    import torch

    hashes, stats = details.get("hashes"), details.get("stats")
    if hashes is None or stats is None:
        return vector.to("cpu"), {}
    count, length = hashes.numel(), vector.numel()
    hi = torch.bitwise_right_shift(hashes, 16).bitwise_and(0xFFFF).to(torch.float32)
    lo = hashes.bitwise_and(0xFFFF).to(torch.float32)
    host = torch.cat([vector, hi, lo, stats.to(torch.float32).reshape(-1)]).to("cpu")
    halves = host[length:length + 2 * count].to(torch.int64)
    return host[:length], {"hashes": halves[:count] * 65536 + halves[count:],
                           "stats": host[length + 2 * count:].reshape(count, -1)}


def exchange(pending, tolerance=DEFAULT_TOLERANCE, reduced=None):
    """The part of a check every rank enters once all agreed to: the all-reduce (unless ``reduced``, the
    MAX already taken, is given), the verdict (and, on a difference, its all-gather), the stream's history.
    The SyncReport."""
    import torch

    channel = pending.channel
    with torch.no_grad():
        if reduced is None:
            reduced = channel.all_reduce_max(pending.vector)
        report = decide(fingerprint.decode(reduced), pending.layout, pending.error, channel, pending.step, tolerance,
                        pending.stream)
    if pending.stream.checks >= 0:
        pending.stream.record(report)
    return report


def run(obj, step, stream, barrier=None, tolerance=DEFAULT_TOLERANCE, channel=None):
    """Compare ``obj``'s tensors across the replicas now; the SyncReport, or None on one device.

    ``stream`` keeps the history the report is read against (first check, last identical step);
    ``barrier`` names this check to the other ranks (default: the stream's key and check count). Raises
    :class:`comm.StoodDown` when not every rank reached the check or its collective failed. Waits for the
    other ranks: the zero-code hook uses :func:`prepare` and the worker (:mod:`.worker`) instead."""
    pending = prepare(obj, step, stream, barrier, channel, kept=False)
    if pending is None:
        return None
    channel = pending.channel
    reduced = channel.meet(pending.barrier, pending.vector)  # the agreement and the MAX, one meeting
    if reduced is None:
        # the barrier's name is for the ranks; the caller names the stream as the user knows it
        raise comm.StoodDown("not every rank reached this check (%s) within %ss: an optimizer stepped on "
                             "some ranks only, ranks out of step, or a rank gone"
                             % (_check_number(stream), getattr(channel, "timeout", "?")))
    report = exchange(pending, tolerance, reduced)
    previous = (channel.rank, stream.key)  # per rank: replicas may be threads of this process
    channel.forget(_previous.pop(previous, None))
    _previous[previous] = pending.barrier
    return report


def _check_number(stream):
    """Which check of its stream this is, as the user can count it (``check #0``: the stream's first)."""
    return "check #%d" % stream.checks if stream.checks >= 0 else "a check of an object with no history"


_previous = {}  # (rank, stream key) -> the barrier of its last check (its store keys are deleted at the next)


def decide(decoded, layout, error, channel, step, tolerance, stream=None):
    """The verdict of a MAX-reduced vector, read top to bottom; every rank reads the same vector (and the same
    gathered hashes, and holds the same first-look decisions), so every rank reaches the same verdict and
    enters the same further collective, if any. The report is built complete: read against ``stream``'s
    history and named as its user knows the tensors (:meth:`Stream.naming`)."""
    names = layout.names if layout is not None else []
    not_compared = layout.not_compared if layout is not None else []
    looks = _FirstLooks(layout)

    def built(outcome, left_out, set_aside=(), **fields):
        if stream is not None:
            fields.update(stream.history(step))
            listed, left_out, set_aside, fields["stream"] = stream.naming(outcome, names, left_out, set_aside)
        else:
            listed = names
        return SyncReport(step, channel.size, channel.kind, listed, tolerance=tolerance, outcome=outcome,
                          not_compared=left_out, set_aside=set_aside, **fields)

    def early(outcome, **fields):
        """A verdict reached before any tensor was looked at (rules 1-5): no first-look fact in it."""
        return built(outcome, not_compared, **fields)

    def report(outcome, **fields):
        """A verdict after the first looks: the tensors set aside are listed and named."""
        return built(outcome, not_compared + looks.not_compared(), looks.set_aside_names(), rule=looks.rule(),
                     **fields)

    high, low = decoded["format"]
    # 1. Another format of the vector: nothing else in it can be read.
    if high != low:
        return early("unverified", reason="the replicas run different SyncCheck formats")
    # 2. A replica could not list or fingerprint its tensors.
    if decoded["failed"][0] > 0:
        reason = ("%s: %s" % (type(error).__name__, error) if isinstance(error, Exception) and not
                  isinstance(error, Unlisted) else str(error) if error is not None
                  else "another replica could not list or fingerprint its parameters")
        return early("unverified", reason=reason, local_error=error is not None)
    # 3. Ranks at different steps: name them, compare nothing.
    if decoded["step"][0] != decoded["step"][1]:
        return early("out_of_step", reason=_out_of_step(channel, step))
    # 4. Nothing to compare on some replica: never "identical" without having looked.
    if decoded["count"][1] == 0:
        return early("unverified", reason="no parameter tensors to compare on %s replica"
                     % ("every" if decoded["count"][0] == 0 else "some"))
    # 5. Different models: tensor count, lanes, shapes or dtypes.
    structure = _structure_mismatch(decoded, layout)
    if structure is not None:
        return early("structure", structure=structure)
    # 6. Bits differ somewhere: name the tensors and the ranks exactly (one all-gather). A tensor no layout
    #    places is judged by its own first look: different there, it alone is set aside; set aside before, its
    #    difference is no news; a replica (seen equal once) that differs now has diverged.
    bad = fingerprint.slots_differing(decoded, "bits_hi", "bits_lo", "nonfinite").nonzero().flatten().tolist()
    differing, versions, spread, divergence, nonfinite, group = [], [], None, None, [], []
    if bad:
        differing, versions, spread, divergence, nonfinite, group = _named_exactly(channel, layout, bad)
    looks.look(differing)
    differing = [k for k in differing if k not in looks.apart]
    nonfinite = [k for k in nonfinite if k not in looks.apart]
    if differing:
        return report("differ", differing=differing, versions=versions, spread=spread, divergence=divergence,
                      nonfinite=nonfinite, group=group, seen_equal=any(k in looks.replicas for k in differing))
    # 7. Nothing left to compare: every tensor set aside by its first look (now or before).
    if looks.apart and len(looks.apart) >= len(names):
        return report("unverified", reason=None if looks.now else _all_apart_reason(len(names)))
    # 8. Non-finite values, bitwise the same everywhere: the replicas agree.
    compared = decoded["compared"]
    nonfinite_slots = set(((decoded["nonfinite"][0] > 0) & compared).nonzero().flatten().tolist())
    if nonfinite_slots:
        nonfinite = sorted(k for s in nonfinite_slots for k in layout.positions_in(s) if k not in looks.apart)
        if nonfinite:
            return report("nonfinite", nonfinite=nonfinite)
    # 9. Every compared tensor bitwise equal over its replica group.
    return report("identical")


class _FirstLooks(object):
    """The first-check rule of one check (:mod:`.decisions`): for the tensors no layout places (the layout's
    ``undecided`` positions), what was decided before this check, and what this check decides and keeps."""

    def __init__(self, layout):
        self.layout = layout
        undecided = sorted(layout.undecided) if layout is not None else []
        known = dict((k, decisions.of(layout.tensors[k])) for k in undecided)
        #: set aside by an earlier check (their difference is no news), and by this one
        self.before = set(k for k in undecided if known[k] == decisions.APART)
        self.now = []
        #: looked at for the first time by this check; seen equal by an earlier check (another optimizer's, maybe)
        self.first = [k for k in undecided if known[k] is None]
        self.replicas = set(k for k in undecided if known[k] == decisions.REPLICA)
        self.apart = set(self.before)

    def look(self, differing):
        """Decide the tensors at their first look from the exact list of ``differing`` positions, and keep it."""
        different = set(differing)
        for k in self.first:
            decision = decisions.APART if k in different else decisions.REPLICA
            decisions.record(self.layout.tensors[k], decision)
            if decision == decisions.APART:
                self.now.append(k)
        self.apart.update(self.now)

    def not_compared(self):
        names = self.layout.names if self.layout is not None else []
        return [(names[k], groups.APART) for k in sorted(self.apart)]

    def rule(self):
        """``"apart"``: this check set some tensor aside; ``"world"``: it found every first-looked tensor equal."""
        if self.now:
            return groups.RULE_APART
        return groups.RULE_WORLD if self.first else None

    def set_aside_names(self):
        return [self.layout.names[k] for k in self.now]


def nothing_left(report):
    """Whether every tensor of ``report`` is set aside by the first-check rule: no later check of its stream
    would compare any (the hook and the callback stop checking it, silently)."""
    apart = {name for name, reason in report.not_compared if reason == groups.APART}
    return bool(report.names) and set(report.names) <= apart


def _all_apart_reason(count):
    return ("all %d parameter tensors were set aside at their first check (they differed there, with no "
            "data-parallel layout declared): nothing left to compare" % count)


def _out_of_step(channel, step):
    """Which rank is at which step (one all-gather of two numbers per rank)."""
    import torch

    here = torch.tensor(fingerprint._halves(0 if step is None else int(step)), dtype=torch.float32)
    rows = channel.all_gather(here)
    by_step = {}
    for rank, row in enumerate(rows):
        by_step.setdefault(int(row[0]) << 16 | int(row[1]), []).append(rank)
    from .report import rank_ranges

    return "; ".join("rank%s %s at step %d" % ("s" if len(r) > 1 else "", rank_ranges(r), s)
                     for s, r in sorted(by_step.items(), key=lambda item: item[1][0]))


def _structure_mismatch(decoded, layout):
    """A sentence naming how the replicas' models differ, or None when they agree."""
    parts = []
    high, low = decoded["count"]
    here = len(layout.names) if layout is not None else 0
    if high != low:
        parts.append("the number of parameter tensors differs (%d on some replicas, %d on others; %d here)"
                     % (low, high, here))
    if decoded["lanes"][0] != decoded["lanes"][1]:
        parts.append("the replica groups differ (%d lanes on some replicas, %d on others)"
                     % (decoded["lanes"][1], decoded["lanes"][0]))
    shape = fingerprint.slots_differing(decoded, "shape_hi", "shape_lo")
    dtype = fingerprint.slots_differing(decoded, "dtype_hi", "dtype_lo")
    bad = (shape | dtype).nonzero().flatten().tolist()
    if bad and layout is not None and not parts:
        s = bad[0]
        what = " and ".join(w for w, mask in (("shape", shape), ("dtype", dtype)) if bool(mask[s]))
        mine = [(k, t) for k, slot, t in layout.entries if slot == s]
        if len(mine) == 1:
            k, t = mine[0]
            here_shape, here_dtype = fingerprint.describe(t)
            parts.append("parameter tensor #%d %r has another %s on some replica (here: shape %s, %s)"
                         % (k, layout.names[k], what, here_shape, here_dtype))
        elif mine:
            # More tensors than slots: the slot's sums cannot say which of its tensors differs.
            parts.append("one of the %d parameter tensors compared together (%s) has another %s on some replica"
                         % (len(mine), _some_names(layout, [k for k, _ in mine]), what))
        else:
            parts.append("a parameter tensor differs in %s between replicas" % what)
    if not parts and decoded["digest"][0] != decoded["digest"][1]:
        parts.append("the order of shapes/dtypes of the parameter tensors differs")
    return "; ".join(parts) or None


def _some_names(layout, positions, shown=3):
    """``#k 'name'`` of the first ``shown`` positions, then how many more."""
    named = ", ".join("#%d %r" % (k, layout.names[k]) for k in positions[:shown])
    return named + (", and %d more" % (len(positions) - shown) if len(positions) > shown else "")


def _per_tensor(layout):
    """position -> (bit hash, (non-finite count, sum, sum of |values|)) as the check's fingerprint computed
    them (empty when it kept none)."""
    details = getattr(layout, "details", None) or {}
    hashes, stats = details.get("hashes"), details.get("stats")
    if hashes is None or stats is None:
        return {}
    hashes, stats = hashes.detach().cpu().tolist(), stats.detach().cpu().tolist()
    return dict((k, (int(h), tuple(float(v) for v in st))) for (k, _, _), h, st in zip(layout.entries, hashes, stats))


def _named_exactly(channel, layout, bad_slots):
    """(differing, versions, spread, divergence, nonfinite, group) from all-gathers of every rank's per-tensor
    hash and sums of the tensors in the differing slots (``MAX_NAMED`` tensors per all-gather): exact whatever
    the number of tensors. ``group``: the ranks of the replica group in which the first difference was seen."""
    pairs = [(s, k) for s in bad_slots for k in layout.positions_in(s)]
    rows = None
    for start in range(0, len(pairs), MAX_NAMED):  # the same pairs, hence the same all-gathers, on every rank
        part = _gathered_rows(channel, layout, pairs[start:start + MAX_NAMED])
        rows = part if rows is None else [mine + theirs for mine, theirs in zip(rows, part)]
    rows = rows or []
    n = len(layout.names)
    spread, divergence = [0.0] * n, [0.0] * n
    differing, nonfinite, versions = [], [], []
    for j, (s, k) in enumerate(pairs):
        lanes = {}
        for rank, values in enumerate(rows):
            lane, hi, lo, bad, total, scale = values[j * _GATHERED:(j + 1) * _GATHERED]
            if lane >= 0:
                lanes.setdefault(lane, {}).setdefault((hi, lo, bad), []).append((rank, total, scale))
        for held_versions in lanes.values():
            if len(held_versions) < 2:
                continue
            if k not in differing:
                differing.append(k)
            sums = [total for group in held_versions.values() for _, total, _ in group]
            scale = max(sc for group in held_versions.values() for _, _, sc in group)
            spread[k] = max(spread[k], max(sums) - min(sums))
            divergence[k] = spread[k] / scale if scale > 0 else (0.0 if spread[k] == 0 else float("inf"))
            if len(set(bad > 0 for (_, _, bad) in held_versions)) > 1:
                spread[k] = divergence[k] = float("inf")
                nonfinite.append(k)
            if not versions:
                versions = sorted(([r for r, _, _ in group] for group in held_versions.values()),
                                  key=lambda ranks: (-len(ranks), ranks[0]))
    group = sorted(r for ranks in versions for r in ranks)
    return sorted(differing), versions, spread, divergence, sorted(set(nonfinite)), group


def _gathered_rows(channel, layout, pairs):
    """Every rank's row for ``pairs`` (one all-gather): per pair its lane (-1: not held here), hash halves,
    non-finite count, value sum and sum of |values|."""
    import torch

    held = dict((k, (slot, t)) for k, slot, t in layout.entries)
    known = _per_tensor(layout)
    row = []
    for s, k in pairs:
        slot, tensor = held.get(k, (None, None))
        if slot != s:
            row += [-1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
            continue
        if k in known:  # computed with the check's vector, before training went on
            bits, (nonfinite, total, scale) = known[k]
        else:
            bits = int(fingerprint.tensor_hash(tensor, k))
            nonfinite, total, scale = (float(v) for v in fingerprint.value_sums(tensor))
        hi, lo = fingerprint._halves(bits)
        row += [float(layout.lane_of[k]), hi, lo, nonfinite, total, scale]
    return [r.tolist() for r in channel.all_gather(torch.tensor(row, dtype=torch.float32))]


# --------------------------------------------------------------------------- the functions of the API
_streams = {}


def _stream_of(obj, replicas=groups.AUTO):
    """The history of checks of one object, kept while the object lives; an object that cannot be weakly
    referenced (a list, a dict) gets none: its reports claim no first check and no earlier identical step."""
    key = id(obj)
    stream = _streams.get(key)
    if stream is None:
        stream = Stream("api", replicas)
        try:
            weakref.finalize(obj, _streams.pop, key, None).atexit = False
        except TypeError:
            stream.checks = -1  # never "first", never counted: nothing to remember it by
            return stream
        _streams[key] = stream
    stream.replicas = replicas
    return stream


_api_checks = {}  # rank -> compare_replicas calls so far (the check's name to the other ranks)


def compare_replicas(model, step=None, tolerance=DEFAULT_TOLERANCE, replicas=groups.AUTO):
    """Run one comparison now (collective: every replica must call it, with or without parameters).

    ``replicas``: over which ranks the tensors must be equal. ``"auto"`` (the default): as the job's layout
    places them (DTensor, FSDP, DDP process groups, neuronx-distributed, the replicas of ``xm.optimizer_step``
    on XLA), and every tensor no layout places over the whole world -- calling this is the declaration that
    they are replicas, so any difference, at the first check too, is a divergence; ``"world"``: every tensor
    over the whole world; a process group or a list of rank lists: over those groups. Returns a
    :class:`SyncReport` (``report.in_sync`` is true only when every compared tensor matched), or None on a
    single device (nothing to compare). A comparison that cannot complete (not every rank called, a peer gone)
    returns an ``unverified`` report."""
    groups.check_replicas(replicas)
    channel = comm.channel()
    if channel is None:
        return None
    stream = _stream_of(model, replicas)
    # counted per rank: replicas that are threads of one process each count their own calls
    _api_checks[channel.rank] = _api_checks.get(channel.rank, 0) + 1
    try:
        report = run(model, step, stream, "api/%d" % _api_checks[channel.rank], tolerance, channel)
    except comm.StoodDown as exc:
        return SyncReport(step, channel.size, channel.kind, [], tolerance=tolerance, outcome="unverified",
                          reason=str(exc))
    return report


def check_options(every, tolerance, on_divergence):
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise ValueError("every must be a positive int (optimizer steps); got %r" % (every,))
    if not tolerance >= 0:
        raise ValueError("tolerance must be >= 0; got %r" % (tolerance,))
    if on_divergence not in ON_DIVERGENCE and not callable(on_divergence):
        raise ValueError("on_divergence must be 'warn', 'raise' or a callable(report); got %r" % (on_divergence,))


def due(step, every, last=None):
    """The schedule of every check that counts steps -- the first step, then every ``every`` -- written once:
    whether a check runs at step ``step``. ``last``: the step of the schedule's previous check, for a caller
    that sees steps with gaps (then the first step at or past the next multiple of ``every`` is due); default
    the step before (only a multiple is due). Step 0, before any update, is due when the caller asks."""
    last = step - 1 if last is None else last
    return step == 1 or step // every > last // every  # step 0 is a multiple of every


def check_sync(model, step, every=DEFAULT_EVERY, tolerance=DEFAULT_TOLERANCE, on_divergence="warn",
               replicas=groups.AUTO):
    """For Lite / Fabric / plain loops: call after each optimizer step with the 1-based step count (and, to
    tell "started different" from "diverged", once with step 0 before the first optimizer step).

    Checks at steps 0 and 1 and then whenever ``step % every == 0`` (one collective, so every replica must make the
    same calls); on divergence rank 0 says it on the ``tpu_closure_fix.synccheck`` logger (the same divergence
    again: one short line every 10th check), or every rank raises ReplicaDivergenceError with
    ``on_divergence="raise"``, or ``on_divergence(report)`` is called. ``replicas``: as for
    :func:`compare_replicas` (the default compares every tensor no layout places over the world). Returns the
    SyncReport of a check (``report.in_sync``: every compared tensor matched), or None when no check ran
    (other steps, single device).
    """
    check_options(every, tolerance, on_divergence)
    groups.check_replicas(replicas)
    if not due(step, every):
        return None
    report = compare_replicas(model, step, tolerance, replicas)
    channel = comm.channel()
    act(report, on_divergence, rank=channel.rank if channel else 0, stream=_streams.get(id(model)))
    return report

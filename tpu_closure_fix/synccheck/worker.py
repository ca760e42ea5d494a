"""The check's worker: agreement, exchange and verdict of the zero-code check off the training thread.

At a check the training thread fingerprints its parameters (:func:`.compare.prepare`: one pass, no
communication, the result on the host) and hands the result to its worker thread; it never waits for another
rank. The worker (one daemon thread per rank in this process: one per process with a process group, started
when the job makes that group (:func:`ready`; it makes the check's gloo group then and waits for the first
check), one per replica thread where
torch_xla's replicas are threads of one process, started at its first check; it yields a core it shares with
training while it keeps up: :func:`yields`) alone uses the check's store (the process group's, or the check's
own without one: :class:`.comm.HostChannel`) and the check's own gloo group:

1. **Arrive.** It counts the check in under the check's key (the stream and its check number), in one store
   round trip that also says which ranks arrived (:func:`arrival`).
2. **Agree.** The rank whose count completes a check votes it "go" as it arrives; the others read the next
   exchange's slot first (a check proposed there is one every rank reached), then the pending checks' counts,
   each stream's oldest first, pausing longer after each round that moved nothing. One still incomplete after
   ``TPU_CLOSURE_FIX_SYNC_CHECK_TIMEOUT`` seconds is voted "abort" (compare-and-set: the first vote written is
   every rank's answer). Between rounds the worker sleeps while a watcher thread blocks in one store ``wait``
   for the next exchange's slot on a second connection (:meth:`Worker._watch`: the training thread's next
   check wakes the worker, not that wait), so a check waiting for a late rank costs a few wake-ups, not a poll
   every few milliseconds; it polls where it cannot block so. An aborted check is said once, naming the
   optimizer and the ranks that reached it and those that did not, and its stream stands down; the other pending
   checks go on meanwhile -- an optimizer stepped on rank 0 alone holds up neither training nor the other
   checks.
3. **Order.** Checks agreed "go" are exchanged one at a time in an order every rank reads from the store:
   exchange number ``n`` is the first "go" check some rank proposes for it (compare-and-set again), so the
   ranks enter the check's collectives in the same order whatever order they fingerprinted them in.
4. **Exchange and verdict** (:func:`.compare.exchange`); the report is given as soon as it is known, naming the
   check's step, its warning pointing at the user's line that stepped (captured on the training thread).
   After a divergence every rank, whatever its own action, enters one more small all-reduce (a rank that
   only warns proposes :data:`NOT_RAISING`): the raising ranks agree there on the optimizer step at which
   every one of them raises (:func:`raise_proposal`): each raising rank's training thread raises there.

Bounds: at most :data:`MAX_PENDING` checks wait in all (a vector of about 80 kB each), and at most
:data:`MAX_PENDING_PER_STREAM` of a stream whose oldest check some rank is known to have skipped (:func:`passed_by`);
a check beyond that is not taken and its own stream stands down with one message saying why (:func:`refusal`: its
checks not reached by every rank, or too frequent to exchange); the other ranks' checks of that stream then stand
down in turn. At interpreter exit and when the job destroys its process group the worker first answers the checks
already handed over (:func:`finish`: at most :func:`drain_bound` seconds), then stops (with the check's gloo group
at destroy); it is absent from a forked child. A failure inside the worker is warned once; the zero-code check then
stays off and training goes on.
"""
import atexit
import collections
import math
import os
import sys
import threading
import time

from . import comm

#: Checks fingerprinted and not yet exchanged, at most (each holds one vector of about 80 kB: 20 MB in all): the
#: memory bound. A rank whose worker lags (a loaded host) holds its checks here meanwhile: 256 is 1.3 s of a 5 ms
#: step checked at every step.
MAX_PENDING = 256
#: Checks of one stream (one optimizer) not yet answered while its oldest still waits for ranks, at most, once some
#: rank is known to have skipped that check (:func:`passed_by`): a stream whose checks some rank never reaches (a
#: probe optimizer stepped on rank 0 only) fills its own quota, never the others' room. However long a check waits,
#: that alone never cuts its stream: a rank whose worker lags (a loaded host), or ranks with no collective between
#: their steps, run checks apart.
MAX_PENDING_PER_STREAM = 8
#: Why a stream's check is not taken: its oldest unanswered check still waits for ranks that have not reached it,
#: or its checks come faster than the ranks exchange them.
UNREACHED = "unreached"
BEHIND = "behind"
#: Seconds a check waits for its ranks before the worker reads which ranks reached it (for the words of a
#: refusal): a check answered sooner costs no such read.
STUCK = 0.05
#: Up to this many ranks a rank counts itself in to a check by adding its own bit, ``1 << rank``, to the check's
#: count: the sum read back is the set of ranks that arrived (a store's counter holds 63 bits and a sign). Above
#: it a rank adds 1 and appends its number to a list of the check's, read only when the check waits long.
MASK_RANKS = 62
#: Seconds the process waits, at exit or when the process group is destroyed, for the worker to finish the
#: checks already handed over (never longer than the agreement's timeout): the job's last checks are answered.
EXIT_DRAIN = 10.0
#: Seconds without any check moving (a rank counted in, a vote, an exchange) after which that end gives up on
#: checks still waiting for ranks: at the job's end every rank has handed its checks over, so one not reached
#: by then (a rank-0 probe's) never will be.
EXIT_QUIET = 2.0
#: Seconds the process then waits for the worker thread to end (a check still being exchanged).
EXIT_WAIT = 2.0
#: Seconds of training, at each rank's own pace, between the ranks' agreement on where to raise and that step:
#: long enough for every rank to learn the agreed step before it gets there.
RAISE_LEAD = 0.2
#: Steps between the agreement and the step where the ranks raise, at least: a rank whose training waited since
#: the check (in a collective, for a rank held up on a loaded host) shows no pace, yet goes on at once; a rank past
#: the agreed step when it learns it raises one step later than ranks that meet it in a collective every step.
RAISE_LEAD_STEPS = 16
#: Checks the worker holds (handed over, not yet answered) from which it takes its share of a shared core at once
#: (:func:`yields`), and at or under which it yields the core to training again.
CATCH_UP = 8
KEPT_UP = 2
#: First and longest pause between two polls of the store while checks are pending and no watcher blocks for
#: them (:meth:`Worker._watch`): each poll takes the interpreter lock from the training thread.
FIRST_POLL = 0.002
MAX_POLL = 0.05

#: ``failed``: why a worker failed (None: none did); ``ending``: this process is exiting or destroying its
#: process group (a peer closing its connection then is the job ending, not a peer lost).
_state = {"failed": None, "ending": False}
#: The worker of each rank in this process (``channel.worker_scope``): "process" with a process group, one per
#: replica thread without.
_workers = {}
_lock = threading.Lock()


class Job(object):
    """One check on its way: the fingerprinted check (:class:`.compare.Pending`) and what to do with the
    verdict. ``deliver(report)`` runs on the worker once the verdict is known; ``stand_down(reason)`` when
    the check cannot complete; ``current_step()`` reads the training thread's step count (raise agreement);
    ``raising``: the verdict of a divergence is raised, at an agreed step."""

    def __init__(self, pending, deliver, stand_down, current_step=None, raising=False, tolerance=None, group=None):
        self.pending = pending
        self.group = group
        self.deliver = deliver
        self.stand_down = stand_down
        self.current_step = current_step
        self.raising = raising
        self.tolerance = tolerance
        self.key = comm.KEY_PREFIX + pending.barrier
        self.stream_key = getattr(pending.stream, "key", None)
        self.done = False  # answered or stood down: it no longer counts against its stream's quota
        self.arrived = 0  # ranks counted in under its key at the worker's latest poll
        self.reached = None  # those ranks, once read (a check waiting longer than STUCK)
        self.polled_at = None  # when the worker last began reading its count and found it incomplete
        #: why submit() did not take it: (UNREACHED or BEHIND, the stream's oldest check, how many checks wait)
        self.refused = None
        self.step_then = current_step() if current_step is not None else 0
        self.time_then = time.monotonic()
        self.deadline = None
        self.decision = None


# --------------------------------------------------------------------------- decision lines
def vote(arrived, size, now, deadline):
    """The vote of a rank polling a check: "go" once every rank arrived, "abort" once the deadline passed
    without that, else None (keep polling)."""
    if arrived >= size:
        return "go"
    if now >= deadline:
        return "abort"
    return None


def refusal(waiting, total, quota=None, bound=None, skipped=False):
    """Why a stream's next check is not taken, or None (taken). ``waiting``: that stream's checks not yet
    answered, oldest first; ``total``: every stream's checks waiting in the worker; ``skipped``: some rank is known
    to have gone past the oldest of them without it (:func:`passed_by`).

    A stream whose oldest check arrived and still waits for ranks (:data:`UNREACHED`: a probe optimizer
    stepped on some ranks only) is refused at its own ``quota`` when some rank skipped that check; a stream whose
    oldest check only waits (a rank whose worker lags, ranks with no collective between their steps running checks
    apart) is held by the memory ``bound`` alone, as is a stream whose checks are all reached (:data:`BEHIND`:
    checks come faster than the ranks exchange them): a backlog while the ranks' workers still make the check's
    gloo group must not stand it down."""
    quota = MAX_PENDING_PER_STREAM if quota is None else quota
    bound = MAX_PENDING if bound is None else bound
    oldest = waiting[0] if waiting else None
    unreached = oldest is not None and oldest.deadline is not None and oldest.decision is None
    if len(waiting) >= quota and unreached and skipped:
        return UNREACHED
    if total >= bound:
        return UNREACHED if unreached else BEHIND
    return None


def refusal_reason(job, every, variable):
    """The words of a refusal (``job.refused``) after "stands down for <optimizer> at step N: "."""
    cause, oldest, count = job.refused or (BEHIND, None, MAX_PENDING)
    if cause == UNREACHED and oldest is not None:
        size = oldest.pending.channel.size
        if oldest.reached:
            who = "rank%s %s only" % ("s" if len(oldest.reached) > 1 else "", _ranks(oldest.reached))
        else:
            who = "%d of %d ranks" % (max(oldest.arrived, 1), size)
        return ("its earlier checks were not reached by every rank (the oldest, at step %d, by %s so far, "
                "%.1f s ago): an optimizer stepped on some ranks only, ranks out of step, or a rank gone"
                % (oldest.pending.step, who, time.monotonic() - oldest.time_then))
    return ("%d checks are still being exchanged (every %d steps is more often than the ranks can exchange "
            "them); set %s higher" % (count, every, variable))


def passed_by(oldest, agreed):
    """Whether some rank went past check ``oldest`` without it: a check of another stream, handed over here after
    ``oldest``, that every rank reached, known here before ``oldest`` was last read still incomplete. Each rank
    hands its checks over in the order it fingerprinted them, and its worker counts them in in that order; a rank
    that reached the later check had counted ``oldest`` in before, unless it never stepped that optimizer.
    ``agreed``: stream key -> (when the latest check of that stream every rank reached was handed over here, when
    this worker learnt it), by :func:`time.monotonic`."""
    polled = oldest.polled_at
    if polled is None:
        return False
    return any(stream != oldest.stream_key and then > oldest.time_then and known <= polled
               for stream, (then, known) in list(agreed.items()))


def stalled(jobs, moved, now, quiet):
    """Whether checks held at the job's end can be given up: every one still waits for ranks (arrived,
    undecided: none agreed "go" and waiting for its exchange) and no check moved for ``quiet`` seconds."""
    if any(job.deadline is None or job.decision is not None for job in jobs):
        return False
    return now - moved >= quiet


def proposal(jobs):
    """The check this rank proposes for the next exchange: its first pending check agreed "go" that is the oldest
    pending check of its stream (None: none). A stream's checks are exchanged in the order every rank handed
    them over: the last rank in votes "go" as it arrives, so here a stream's later check may be agreed before
    its earlier one is polled, and exchanged first it would read the stream's history as if it were the first."""
    open_streams = set()
    for job in jobs:
        stream = getattr(job, "stream_key", None)
        if stream is not None and stream in open_streams:
            continue  # an older check of its stream is still pending: that one goes first
        if job.decision == "go":
            return job.key
        if stream is not None:
            open_streams.add(stream)
    return None


def raise_proposal(step_then, time_then, step_now, time_now, lead=RAISE_LEAD, least=RAISE_LEAD_STEPS):
    """The step this rank proposes to raise at: its step now, plus the steps it trains in ``lead`` seconds at
    the pace it kept since the check (``step_then`` at ``time_then``), at least ``least``, plus one. Every rank
    raises at the largest proposal, so at a step none of them has reached when they agree on it."""
    elapsed = max(time_now - time_then, 1e-6)
    pace = max(step_now - step_then, 0) / elapsed
    return int(step_now) + max(int(math.ceil(pace * lead)), least) + 1


#: A rank that does not raise proposes this step: below any real proposal, so the largest is a raising rank's.
NOT_RAISING = 0


def raise_round(report, settled):
    """Whether the ranks run the raise-step all-reduce after this verdict: when it diverged and the stream's
    ranks have not yet agreed whether any of them raises (``settled``), on every rank (the verdict and the
    stream's history are the same on every rank; each rank's own action is not: ranks may be told differently).
    One round per stream answers it for good: each rank's action is read once, and the first divergence to
    raise stands, so a stream that keeps diverging costs no collective more than a stream that agrees."""
    return bool(report.diverged) and not settled


def raise_vote(raising, step_then, time_then, step_now, time_now):
    """What this rank puts into the raise-step all-reduce: its :func:`raise_proposal` when it raises, else
    :data:`NOT_RAISING`."""
    if not raising:
        return NOT_RAISING
    return raise_proposal(step_then, time_then, step_now, time_now)


def raise_step(raising, agreed):
    """The step this rank raises at, from the all-reduce's result: None when it does not raise."""
    if raising and agreed > NOT_RAISING:
        return agreed
    return None


def due_to_raise(step, raise_at):
    """Whether the training thread raises the pending divergence at optimizer step ``step``."""
    return raise_at is not None and step >= raise_at


def yields(held, yielding):
    """Whether the worker's threads yield a core they share with training (:func:`schedule`) while the worker holds
    ``held`` checks (``yielding``: whether they yield now). Read top to bottom:

    1. Not while it holds :data:`CATCH_UP` checks or more: it is falling behind, and a worker that only ever
       yields falls behind for good on a busy core (then its stream stands down).
    2. Yes once it holds :data:`KEPT_UP` or fewer: it keeps up; each store reply or peer's vector that wakes it
       would otherwise preempt training.
    3. Else as they do (between the two bounds they do not switch back and forth)."""
    if held >= CATCH_UP:
        return False
    if held <= KEPT_UP:
        return True
    return yielding


#: The names torch gives the threads of a gloo process group (its transport's loop, its work runners): the
#: threads the check's own group starts, rescheduled with the worker.
GLOO_THREADS = ("gloo_tcp_loop", "pt_gloo_runloop")


def schedulable():
    """Whether a worker started by the calling thread may switch its scheduling: Linux (where a thread's id names
    that thread alone) and the calling thread at the default policy (``SCHED_OTHER``), which the worker inherits:
    a training process the user scheduled otherwise (``chrt``) keeps what it has."""
    if not sys.platform.startswith("linux") or not hasattr(os, "SCHED_BATCH") or not hasattr(
            threading, "get_native_id"):
        return False
    try:
        return os.sched_getscheduler(0) == os.SCHED_OTHER
    except OSError:
        return False


def schedule(yielding, tids=()):
    """Schedule the calling thread and the threads ``tids`` as Linux's ``SCHED_BATCH`` (``yielding``: at the same
    priority, but a thread that wakes waits for the running thread's time slice to end instead of preempting it)
    or back as ``SCHED_OTHER``; threads started later inherit it. A thread that has ended meanwhile is passed
    over. Whether it was done; refused (a sandbox), every one of them is put back as ``SCHED_OTHER`` as far as
    the system lets it (a worker that yields for good falls behind on a busy core)."""
    try:
        _set_policy([0] + list(tids), os.SCHED_BATCH if yielding else os.SCHED_OTHER)
    except (AttributeError, OSError):
        try:
            _set_policy([0] + list(tids), os.SCHED_OTHER, strict=False)
        except (AttributeError, OSError):
            pass
        return False
    return True


def _set_policy(tids, policy, strict=True):
    for tid in tids:
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
        except ProcessLookupError:  # ended meanwhile
            pass
        except OSError:
            if strict:
                raise


def task_ids():
    """The ids of this process's threads now (Linux's ``/proc``; elsewhere none)."""
    try:
        return set(os.listdir("/proc/self/task"))
    except OSError:
        return set()


def gloo_threads_since(before, policy):
    """The ids of the gloo threads (:data:`GLOO_THREADS`) started since ``before`` (:func:`task_ids`) that run
    under ``policy``: while the worker yields, those of the gloo group it made (they inherit its ``SCHED_BATCH``,
    threads that one of them started later too); a gloo group some other thread made has that thread's policy,
    and is not the worker's to switch."""
    found = []
    for tid in task_ids() - before:
        try:
            with open("/proc/self/task/%s/comm" % tid) as name:
                if name.read().strip() in GLOO_THREADS and os.sched_getscheduler(int(tid)) == policy:
                    found.append(int(tid))
        except (OSError, ValueError):  # ended meanwhile
            pass
    return found


def arrival(rank, size, bound=None):
    """What rank ``rank`` of ``size`` adds to a check's count to count itself in: its own bit (every rank's sum
    then names the ranks that arrived) up to ``bound`` (default :data:`MASK_RANKS`) ranks, else 1."""
    return 1 << rank if size <= (MASK_RANKS if bound is None else bound) else 1


def arrivals(value, size, bound=None):
    """``(how many ranks arrived, which ranks, or None where the count does not say)`` from a check's count
    ``value``, summed from every arrived rank's :func:`arrival`."""
    if size > (MASK_RANKS if bound is None else bound):
        return value, None
    ranks = [rank for rank in range(size) if value >> rank & 1]
    return len(ranks), ranks


def ranks_named(reached, size):
    """``(reached, missing)`` rank lists from the ranks noted under a check's key."""
    reached = sorted(set(r for r in reached if 0 <= r < size))
    return reached, [r for r in range(size) if r not in reached]


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


# --------------------------------------------------------------------------- the thread
class Worker(object):
    """One process's worker thread and its queue of checks (see the module docstring)."""

    def __init__(self, group=None, may_yield=True):
        self.group = group  # the identity of the process group whose store and ranks it uses
        self.queue = collections.deque()
        self.pending = collections.OrderedDict()  # key -> Job, in the order this rank fingerprinted them
        self.streams = {}  # stream key -> its checks handed over, oldest first (the answered ones pruned at submit)
        self.exchanges = 0  # exchanges done: the number of the next one, the same on every rank
        self.busy = False
        self.moved = time.monotonic()  # when a check last moved: a rank counted in, a vote, an exchange
        self.stopping = False
        self.wake = threading.Condition(threading.Lock())
        self.thread = _WorkerThread(self)
        self.pid = os.getpid()
        self.watcher = None  # the thread blocked on the next exchange's slot (:meth:`_watch`)
        self.second = None  # (the store, its second connection) the watcher waits on
        self.signalled = False  # the watcher returned: the worker runs a round
        self.unwatched = None  # the exchange whose slot is polled, not watched (a watch of it found nothing)
        self.agreed = {}  # stream key -> (time_then, when learnt) of its latest check every rank reached
        self.yielding = False  # whether its threads yield a shared core to training now (:func:`yields`)
        # whether it switches its scheduling (:func:`schedulable`; read on the thread that starts it, whose policy
        # its thread inherits); False once refused. ``may_yield`` False: one of several workers of this process
        # (replicas that are threads), which could not tell their gloo groups' threads apart: none switches
        self.schedulable = may_yield and schedulable()
        self.born = task_ids() if self.schedulable else set()  # the process's threads before it: none its own
        self.gloo = set()  # the ids of its gloo group's threads noted so far (:meth:`group_threads`)

    def start(self):
        self.thread.start()
        return self

    def submit(self, job):
        """Queue ``job``; False when it is not taken (``job.refused`` says why: :func:`refusal`; None: the worker
        is stopping)."""
        with self.wake:
            if self.stopping:
                return False
            waiting = [each for each in self.streams.get(job.stream_key, ()) if not each.done]
            cause = refusal(waiting, len(self.queue) + len(self.pending),
                            skipped=bool(waiting) and passed_by(waiting[0], self.agreed))
            if cause is not None:
                held = len(self.queue) + len(self.pending) if cause == BEHIND else len(waiting)
                job.refused = (cause, waiting[0] if waiting else None, held)
                self.streams[job.stream_key] = waiting
                return False
            waiting.append(job)
            self.streams[job.stream_key] = waiting
            self.queue.append(job)
            self.wake.notify()
        return True

    def idle(self):
        with self.wake:
            return not self.queue and not self.pending and not self.busy

    def stuck(self, quiet, now=None):
        """Whether all this worker holds are checks still waiting for ranks and none moved for ``quiet`` s."""
        now = time.monotonic() if now is None else now
        with self.wake:
            if self.queue or self.busy:
                return False
            try:
                jobs = list(self.pending.values())
            except RuntimeError:  # changed while read: something moved
                return False
        return stalled(jobs, self.moved, now, quiet)

    def stop(self, wait=EXIT_WAIT):
        """Stop taking checks and end the thread, waiting at most ``wait`` seconds for it."""
        with self.wake:
            self.stopping = True
            self.wake.notify()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(wait)

    # ------------------------------------------------------------------ the loop
    def _main(self):
        try:
            self._prepare()
            delay = FIRST_POLL
            while True:
                with self.wake:
                    while not self.stopping and not self.queue and not self.pending:
                        self.wake.wait()
                    if self.stopping:
                        return
                    new = list(self.queue)
                    self.queue.clear()
                    self.busy = True
                self._reschedule(len(self.pending) + len(new))
                try:
                    for job in new:
                        self._arrive(job)
                    progressed = self._step()
                finally:
                    self.busy = False
                if progressed or new:
                    self.moved = time.monotonic()
                    delay = FIRST_POLL
                else:
                    self._pause(delay)
                    delay = min(delay * 2, MAX_POLL)
        except Exception as exc:  # never break training: say it once, the check stays off
            _worker_failed(exc)
        finally:
            self._unwatch()
            if self.yielding:  # the group's threads outlive this worker: left as they were found
                schedule(False, self.group_threads())

    def _prepare(self):
        """Before any check, for a worker serving the job's process group: take an idle worker's scheduling (the
        threads it starts inherit it: :meth:`group_threads`) and make the check's gloo group on a thread of its own
        (:class:`_GroupMaker`). Every rank's worker starts as the job makes its process group, so the ranks meet in
        that rendezvous at once; the first check's exchange then neither makes the group on a core training may
        share (about 1 ms of CPU, and its threads' start) nor waits for it. The worker goes on meanwhile: a rank
        whose peers never start one (not armed) holds that thread in the rendezvous, never the worker."""
        if self.group is None:
            return
        self._reschedule(0)
        try:
            channel = comm.channel()
            if isinstance(channel, comm.DistributedChannel) and comm.default_group_id() == self.group:
                _GroupMaker(self, channel).start()
        except Exception:  # the first exchange makes the group, and says why it could not
            pass

    def _reschedule(self, held):
        """Yield a shared core to training, or take a share of it, as :func:`yields` says for ``held`` checks: the
        worker's thread, its watcher's and its gloo group's."""
        wanted = yields(held, self.yielding)
        if wanted != self.yielding and self.schedulable:
            watcher = self.watcher
            tids = sorted(self.group_threads()) + (
                [watcher.native_id] if watcher is not None and watcher.is_alive() else [])
            if schedule(wanted, tids):
                self.yielding = wanted
            else:
                self.schedulable = False

    def group_threads(self):
        """The ids of the threads of the check's gloo group: those noted before, and, while the worker yields, the
        gloo threads started since it was made that share its ``SCHED_BATCH`` (:func:`gloo_threads_since`):
        noted then, they are switched back with it. A group an earlier worker of this process made, or one made
        while this worker did not yield: its threads are never noted, and keep the policy they have."""
        if self.yielding:
            self.gloo.update(gloo_threads_since(self.born, os.SCHED_BATCH))
        return set(self.gloo)

    def _pause(self, delay):
        """Wait for the next thing to do after a round that moved nothing. Where a watcher blocks on the next
        exchange's slot (:meth:`_watch`), the worker sleeps until it returns, a check is handed over, or the
        next deadline comes: a handful of wake-ups per check however long it waits. Else it sleeps ``delay``
        (a poll)."""
        timeout = self._next_timer() if self._watch() else delay
        with self.wake:
            if not self.stopping and not self.queue and not self.signalled:
                self.wake.wait(timeout)
            if self.signalled:
                self.signalled = False
                self.unwatched = self.exchanges  # a round that then moves nothing polls this slot instead

    def _next_timer(self):
        """Seconds until the next time a waiting check needs the worker without any rank moving: a deadline
        (it votes "abort"), or :data:`STUCK` after a check arrived (it reads which ranks reached it)."""
        now, times = time.monotonic(), []
        for job in self.pending.values():
            if job.decision is None and job.deadline is not None:
                times.append(job.deadline)
                if job.reached is None and job.time_then + STUCK > now:  # past it, the ranks are read or unreadable
                    times.append(job.time_then + STUCK)
        return max(min(times) - now, 0.0) + 0.001 if times else MAX_POLL

    def _watch(self):
        """Whether a watcher thread blocks in one store ``wait`` (GIL released, on a second connection: the
        worker's own serves one call at a time) for the next exchange's slot, started now if needed. The slot
        is written when some rank proposes a check every rank reached, and at a rank's stop (:meth:`_unwatch`),
        so the wait ends without timing out (a timed-out wait prints to stderr). False where a timed-out wait
        breaks the store (:func:`.comm.blocking_wait_safe`), the store cannot be cloned, or a watch of this slot
        already ended with nothing to exchange (a rank stopping): the worker polls."""
        slot = "%sexchange/%d" % (comm.KEY_PREFIX, self.exchanges)
        watcher = self.watcher
        if watcher is not None and watcher.is_alive():
            return watcher.slot == slot
        if not self.pending or self.unwatched == self.exchanges or not comm.blocking_wait_safe():
            return False
        second = self._second(next(iter(self.pending.values())))
        if second is None:
            return False
        self.watcher = _Watcher(self, second, slot)
        self.watcher.start()
        return True

    def _second(self, job):
        """A second connection to ``job``'s store (made once: the worker serves one store), or None."""
        if self.second is None:
            store = self._store(job)
            try:
                self.second = (store, store.clone()) if hasattr(store, "check") else (store, None)
            except Exception:
                self.second = (store, None)
        return self.second[1]

    def _unwatch(self):
        """End the watcher: write its slot empty (what reading the slot does on a torch without ``check``: a
        later proposal still takes it) and wait for it, within :data:`EXIT_WAIT`."""
        watcher = self.watcher
        if watcher is None or not watcher.is_alive():
            return
        try:
            self.second[0].compare_set(watcher.slot, "", "")
        except Exception:  # the store failed: the watcher's wait fails too
            pass
        watcher.join(EXIT_WAIT)

    def _step(self):
        """One round over the pending checks; True when some check moved. The next exchange's slot is read
        first: a check some rank proposed there is one every rank reached, so it is exchanged without reading
        its count or its vote (the last rank in votes as it arrives: :meth:`_arrive`)."""
        if self._exchange_next():
            return True
        if self._agree():
            self._exchange_next()
            return True
        return False

    def _store(self, job):
        return job.pending.channel._store()

    def _failed(self, job, exc):
        """The StoodDown of a store that failed (one the channel already said stands as it is)."""
        return exc if isinstance(exc, comm.StoodDown) else job.pending.channel._failed_store(exc)

    def _listed(self, store, size):
        """Whether the ranks of a world of ``size`` also list their numbers for a check (the count cannot say
        which ranks arrived there, :func:`arrival`), on a store that can append."""
        return size > MASK_RANKS and hasattr(store, "append")

    def _arrive(self, job):
        channel = job.pending.channel
        try:
            store = self._store(job)
            if self._listed(store, channel.size):
                store.append(job.key + "/ranks", "%d," % channel.rank)
            arrived = arrivals(store.add(job.key + "/arrived", arrival(channel.rank, channel.size)),
                               channel.size)[0]
        except Exception as exc:
            self._give_up(job, self._failed(job, exc))
            return
        job.deadline = time.monotonic() + channel.timeout
        self.pending[job.key] = job
        if arrived >= channel.size:  # the last rank in votes now: no rank polls for the count after it
            job.arrived = arrived
            self._vote(job, store, "go")

    def _vote(self, job, store, wanted):
        """Vote ``wanted`` for ``job`` (compare-and-set: the first vote written is every rank's answer)."""
        try:
            job.decision = _text(store.compare_set(job.key + "/decision", "", wanted))
        except Exception as exc:
            self._give_up(job, self._failed(job, exc))
            return
        if job.decision != "go":
            self._give_up(job, self._not_reached(job))

    def _agree(self):
        """Poll the pending checks not yet agreed, each stream's oldest first; True when some check got its
        answer. A stream's polling stops at its first check still open: every rank hands a stream's checks over
        in order (a rank that skips one stands that stream down), so a later one is complete only after it,
        and its deadline is later -- stuck checks cost one store round trip per stream, not one each."""
        progressed = False
        open_streams = set()
        for job in [j for j in self.pending.values() if j.decision is None]:
            if job.stream_key in open_streams:
                continue
            channel = job.pending.channel
            try:
                store = self._store(job)
                polled = time.monotonic()
                arrived = self._note_arrivals(job, store, store.add(job.key + "/arrived", 0), channel.size)
                wanted = vote(arrived, channel.size, time.monotonic(), job.deadline)
            except Exception as exc:
                self._give_up(job, self._failed(job, exc))
                continue
            if wanted is None:
                job.polled_at = polled
                open_streams.add(job.stream_key)
                continue
            progressed = True
            self._vote(job, store, wanted)
        return progressed

    def _note_arrivals(self, job, store, value, size):
        """Keep what a refusal says about a check still waiting, from its count ``value``: how many ranks arrived,
        and which (once the check waited :data:`STUCK` seconds; where the count does not say, read from the
        check's list once per new count). How many ranks arrived."""
        arrived, ranks = arrivals(value, size)
        if arrived == job.arrived and job.reached is not None:
            return arrived
        if arrived != job.arrived:
            self.moved = time.monotonic()
        job.arrived = arrived
        if arrived >= size or time.monotonic() - job.time_then < STUCK:
            return arrived
        if ranks is not None:
            job.reached = ranks
            return arrived
        if not self._listed(store, size):
            return arrived
        try:
            job.reached = ranks_named([int(r) for r in _text(store.get(job.key + "/ranks")).split(",")
                                       if r.strip().isdigit()], size)[0]
        except Exception:
            job.reached = []  # not read again: the refusal then counts the ranks
        return arrived

    def _exchange_next(self):
        """Run the next exchange when some rank proposed it; True when one ran."""
        if not self.pending:
            return False
        first = next(iter(self.pending.values()))
        slot = "%sexchange/%d" % (comm.KEY_PREFIX, self.exchanges)
        try:
            store = self._store(first)
            mine = proposal(self.pending.values())
            if mine is not None:
                chosen = _text(store.compare_set(slot, "", mine))
            else:
                # what the slot holds, without waiting: compare_set of an absent key with "" creates it empty
                # (a later proposal still takes it), of a chosen one returns the choice (torch's stores before
                # 2.x have no check())
                if comm.blocking_wait_safe() and hasattr(store, "check") and not store.check([slot]):
                    return False  # not written: read without writing it, as a watcher waits for it to be written
                chosen = _text(store.compare_set(slot, "", ""))
                if not chosen:
                    return False
        except Exception as exc:
            self._break(self._failed(first, exc))
            return True
        job = self.pending.pop(chosen, None)
        if job is None:  # every rank reached it, yet this rank holds no such check: no way to pair it
            self._break(comm.StoodDown("the ranks' checks are out of order (%s is not pending here)" % chosen,
                                       broken=True))
            return True
        self.exchanges += 1
        self._reached_by_all(job)
        self._run(job, slot)
        return True

    def _reached_by_all(self, job):
        """Note that every rank reached ``job``, exchanged now (for :func:`passed_by`)."""
        self.agreed[job.stream_key] = (job.time_then, time.monotonic())  # a stream's checks go in order

    def _run(self, job, slot):
        from . import compare

        pending = job.pending
        try:
            report = compare.exchange(pending, job.tolerance if job.tolerance is not None
                                      else compare.DEFAULT_TOLERANCE)
            raise_at = None
            if raise_round(report, pending.stream.raise_settled):
                raise_at = self._agree_raise_step(job)
                pending.stream.raise_settled = True
        except comm.StoodDown as exc:
            self._break(exc, job)
            return
        job.done = True
        job.deliver(report, raise_at)  # before the store's keys go: deleting them never delays the verdict
        self._forget(job, slot, self.exchanges - 1)

    def _agree_raise_step(self, job):
        """The step this rank raises at (None: it does not raise): the largest of the ranks' proposals, one
        all-reduce of one number that every rank enters, raising or not (a rank not raising proposes
        :data:`NOT_RAISING`), so it never pairs with another exchange's all-reduce."""
        import torch

        step_now = job.current_step() if job.current_step is not None else job.step_then
        here = raise_vote(job.raising, job.step_then, job.time_then, step_now, time.monotonic())
        agreed = job.pending.channel.all_reduce_max(torch.tensor([float(here)], dtype=torch.float64))
        return raise_step(job.raising, int(agreed[0]))

    def _forget(self, job, slot, number):
        """One rank deletes an exchanged check's keys: every rank has read them (all entered its all-reduce).
        Exchange ``number``'s are rank ``number mod size``'s to delete: the store's round trips a check costs are
        shared among the ranks, not all rank 0's (which serves the store as well)."""
        channel = job.pending.channel
        if number % channel.size != channel.rank:
            return
        try:
            store = self._store(job)
            keys = (job.key + "/arrived", job.key + "/decision", slot)
            for key in keys + ((job.key + "/ranks",) if self._listed(store, channel.size) else ()):
                store.delete_key(key)
        except Exception:
            pass

    def _not_reached(self, job):
        pending = job.pending
        channel = pending.channel
        reached = []
        try:
            store = self._store(job)
            reached = arrivals(store.add(job.key + "/arrived", 0), channel.size)[1]
            if reached is None:
                reached = []
                if self._listed(store, channel.size):  # else nobody wrote it: a get would wait out the timeout
                    raw = store.get(job.key + "/ranks")
                    reached = [int(r) for r in _text(raw).split(",") if r.strip().isdigit()]
        except Exception:
            pass
        reached, missing = ranks_named(reached, channel.size)
        who = ("rank%s %s reached it, rank%s %s did not" % (
            "s" if len(reached) > 1 else "", _ranks(reached), "s" if len(missing) > 1 else "", _ranks(missing))
            if reached and missing else "not every rank reached it")
        return comm.StoodDown("%s within %ss (an optimizer stepped on some ranks only, ranks out of step, or a "
                              "rank gone)" % (who, channel.timeout))

    def _give_up(self, job, exc):
        self.pending.pop(job.key, None)
        job.done = True
        job.stand_down(exc)
        if exc.broken:
            self._break(exc)

    def _break(self, exc, job=None):
        """The channel carries no further check: every pending check stands down with the same reason."""
        jobs = ([job] if job is not None else []) + list(self.pending.values())
        self.pending.clear()
        for each in jobs:
            each.done = True
            each.stand_down(exc)


def _ranks(ranks):
    from .report import rank_ranges

    return rank_ranges(ranks)


class _WorkerThread(threading.Thread):
    """The worker's daemon thread, with the ``stop()`` that thread-leak guards call at a test's end (Lightning's
    ``thread_police`` calls a daemon thread's ``stop`` and asserts it ended): :func:`retire`."""

    def __init__(self, worker):
        threading.Thread.__init__(self, target=worker._main, name=comm.WORKER_THREAD, daemon=True)
        self._worker = worker

    def stop(self):
        retire(self._worker)


class _Watcher(threading.Thread):
    """Blocks in one store ``wait`` for ``slot`` (the next exchange's), then wakes the worker. Its ``stop()`` is
    its worker's, for thread-leak guards."""

    #: Seconds the wait lasts at most: the slot is written long before (a proposal, or a rank's stop).
    LIMIT = 24 * 3600.0

    def __init__(self, worker, store, slot):
        threading.Thread.__init__(self, name=comm.WORKER_THREAD + "-watch", daemon=True)
        self._worker, self.store, self.slot = worker, store, slot

    def run(self):
        from datetime import timedelta

        try:
            self.store.wait([self.slot], timedelta(seconds=self.LIMIT))
        except Exception:  # the store failed: the worker's next round finds out and says so
            pass
        finally:
            with self._worker.wake:
                self._worker.signalled = True
                self._worker.wake.notify()

    def stop(self):
        self._worker.thread.stop()


class _GroupMaker(threading.Thread):
    """Makes the check's gloo group as its worker starts (:meth:`Worker._prepare`); a failure is left to the first
    exchange, which makes it again and says why. Its ``stop()`` is its worker's, for thread-leak guards."""

    def __init__(self, worker, channel):
        threading.Thread.__init__(self, name=comm.WORKER_THREAD + "-group", daemon=True)
        self._worker, self.channel = worker, channel

    def run(self):
        try:
            self.channel.ready_group()
        except Exception:
            pass

    def stop(self):
        self._worker.thread.stop()


def retire(worker):
    """End one worker now, as the job's end would: the checks handed over are answered (at most
    :func:`drain_bound` seconds) or said dropped, then its thread ends. A later check starts a new worker."""
    with _lock:
        for scope, each in list(_workers.items()):
            if each is worker:
                del _workers[scope]
    if worker.pid != os.getpid() or worker.thread is threading.current_thread():
        return
    if worker.thread.is_alive():
        drain(drain_bound(), EXIT_QUIET, workers=[worker])
        _say_dropped([worker])
    worker.stop()


def _worker_failed(exc):
    _state["failed"] = "%s: %s" % (type(exc).__name__, exc)
    try:
        from .report import say

        say("tpu-closure-fix: the sync check's worker thread failed (%s) and the zero-code check is now off; "
            "training goes on." % _state["failed"], where=(__file__, 0))
    except Exception:
        pass


# --------------------------------------------------------------------------- the process's worker
def submit(job):
    """Hand ``job`` to its rank's worker in this process (started now if needed); False when not taken (the
    queue is full, or the worker failed)."""
    if _state["failed"] is not None:
        return False
    scope = getattr(job.pending.channel, "worker_scope", "process")
    with _lock:
        worker = _workers.get(scope)
        if not _serving(worker):
            worker = _start(scope, job.group)
    return worker.submit(job)


def _serving(worker):
    """Whether ``worker`` takes checks in this process: one made here (none inherited through a fork), not stopping."""
    return worker is not None and worker.pid == os.getpid() and not worker.stopping


def _start(scope, group):
    """A new worker for ``scope`` serving the process group ``group``, its thread started (``_lock`` held)."""
    worker = _workers[scope] = Worker(group, may_yield=scope == "process").start()
    _watch_destroy()
    _watch_sigterm()
    return worker


def ready(group):
    """The job made its process group ``group`` (its identity, :func:`.comm.default_group_id`): start this process's
    worker now, so the first check's training thread does not wait for a thread to start (0.2-1 ms) and its
    exchange finds the check's gloo group made (:meth:`Worker._prepare`: the worker's rendezvous with the other
    ranks' workers, on its own thread; the training thread communicates nothing). A worker already serving
    ``group`` is kept, and one serving an earlier group is left to the first check (which releases it,
    :func:`stale`)."""
    if _state["failed"] is not None or group is None:
        return
    with _lock:
        if not _serving(_workers.get("process")):
            _start("process", group)


def failed():
    """Whether a worker of this process failed (then said once; the zero-code check is off)."""
    return _state["failed"] is not None


def _mine():
    """This process's workers (none inherited through a fork)."""
    return [w for w in list(_workers.values()) if w.pid == os.getpid()]


def stale(group):
    """Whether this process's worker serves another process group than ``group`` (the job made a new one)."""
    worker = _workers.get("process")
    return worker is not None and worker.pid == os.getpid() and worker.group != group


def drain(seconds, quiet=None, workers=None):
    """Wait at most ``seconds`` until every check handed over so far (to ``workers``, default this process's) is
    answered; True when all are. ``quiet``: give up sooner once all that is left waits for ranks and nothing moved
    for that long (:func:`stalled`)."""
    deadline = time.monotonic() + seconds
    for worker in (_mine() if workers is None else workers):
        while worker.thread.is_alive() and not worker.idle():
            if time.monotonic() >= deadline or (quiet is not None and worker.stuck(quiet)):
                return False
            time.sleep(0.005)
    return True


def running():
    """Whether this process has a live worker thread."""
    return any(worker.thread.is_alive() for worker in _mine())


def stop(wait=EXIT_WAIT):
    """Stop this process's workers (pending checks are dropped unsaid), waiting at most ``wait`` seconds."""
    with _lock:
        workers = _mine()
        _workers.clear()
    for worker in workers:
        worker.stop(0)  # every one told first, then each waited for within the one bound
    deadline = time.monotonic() + wait
    for worker in workers:
        if worker.thread.is_alive() and worker.thread is not threading.current_thread():
            worker.thread.join(max(deadline - time.monotonic(), 0))


def ending():
    """Whether this process is exiting or destroying its process group now."""
    return _state["ending"]


def said_as_ending(exc):
    """Whether a check's failure is the job ending (said at info level) rather than a peer lost (a warning): the
    channel broke while this process is itself exiting or destroying its process group."""
    return bool(getattr(exc, "broken", False) and ending())


def drain_bound(environ=None):
    """Seconds to let the worker finish its checks at the job's end: :data:`EXIT_DRAIN`, never longer than the
    agreement's timeout."""
    from .. import settings

    return min(EXIT_DRAIN, settings.of(environ).get(comm.TIMEOUT_VAR))


def finish(wait=EXIT_WAIT, answer=True):
    """The job ends: let the workers answer the checks already handed over (at most :func:`drain_bound`
    seconds, less once only checks waiting for ranks are left and none moved for :data:`EXIT_QUIET` seconds;
    ``answer`` False: none), then stop them. Checks still open after that are dropped, in one line that says
    which and why (:func:`dropped_line`)."""
    _state["ending"] = True
    if answer and _mine():
        drain(drain_bound(), EXIT_QUIET)
        _say_dropped()
    stop(wait)


def dropped_line(jobs):
    """``(level, line)`` naming the checks the job's end drops, or None (none dropped). Checks some rank never
    reached could not be compared anyway (a probe optimizer's: INFO); a check every rank reached, or one not yet
    handed to the store, is a loss worth a WARNING."""
    import logging

    if not jobs:
        return None
    waiting = [j for j in jobs if j.deadline is not None and j.decision is None]
    lost = [j for j in jobs if j not in waiting]
    steps = ", ".join(str(j.pending.step) for j in (lost or waiting)[:5])
    if lost:
        return logging.WARNING, ("tpu-closure-fix: the job ended with %d sync check%s not answered (at step %s): "
                                 "the bound of %.0f s at the job's end ran out before %s exchanged; their verdict "
                                 "is unknown." % (len(lost), "" if len(lost) == 1 else "s", steps, drain_bound(),
                                                  "it was" if len(lost) == 1 else "they were"))
    return logging.INFO, ("tpu-closure-fix: the job ended with %d sync check%s that not every rank reached (at step "
                          "%s): dropped, as nothing could be compared." % (len(waiting), "" if len(waiting) == 1
                                                                           else "s", steps))


def _say_dropped(workers=None):
    jobs = []
    for worker in (_mine() if workers is None else workers):
        with worker.wake:
            jobs += [j for j in list(worker.queue) + list(worker.pending.values()) if not j.done]
    said = dropped_line(jobs)
    if said is not None:
        from .report import say

        say(said[1], where=(), level=said[0])


def _watch_sigterm():
    """Where SIGTERM still has its default action and this is the main thread (the worker starts at the first
    check, on the training thread), a handler answers the checks handed over before the process ends by that
    signal (:func:`_on_sigterm`). A handler the program or its framework installed is left alone."""
    import signal

    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        return
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # not settable here: the default action stays
        pass


def _unwatch_sigterm():
    """SIGTERM's default action back once no check is left to answer (the job destroyed its process group): only
    where the check's handler is still SIGTERM's own, on the main thread; the next worker installs it again."""
    import signal

    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        return
    try:
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except (ValueError, OSError):
        pass


def _on_sigterm(signum, frame):
    """SIGTERM: the default action back first (a second SIGTERM ends the process at once), the checks handed over
    answered or said dropped (:func:`finish`, bounded), then the signal again, to end as SIGTERM ends a process.

    Only while this is SIGTERM's handler: one installed after it that calls it in turn (Lightning's signal
    connector composes the handler it finds with its own, to stop gracefully or requeue) decides whether the
    process ends, as it would have with the default action it replaced; if it does end, the exit answers the
    checks (:func:`finish` at exit)."""
    import signal

    if signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        finish()
    finally:
        os.kill(os.getpid(), signal.SIGTERM)


def release(wait=EXIT_WAIT, answer=True):
    """Answer the checks handed over (``answer`` False: the process group they were made over is gone already),
    stop the worker and let go of the check's own gloo group (the job is destroying its process group; a new
    one gets a new worker)."""
    try:
        finish(wait, answer)
        comm.release_groups()
        _unwatch_sigterm()
    finally:
        _state["ending"] = False


def _after_fork_in_child():
    """A forked child starts without the parent's worker and with nothing of its checks."""
    global _lock
    _lock = threading.Lock()
    _workers.clear()
    _state["failed"] = None
    _state["ending"] = False


_destroy_wrapped = []


def watch_process_group():
    """Wrap ``init_process_group`` and ``destroy_process_group`` as soon as ``torch.distributed`` is imported (now,
    if it is): called when the check is armed, so a script's ``from torch.distributed import ...``, run after
    ``import torch``, binds the wrappers."""
    import wrapt

    wrapt.register_post_import_hook(lambda module: (_watch_init(), _watch_destroy()), "torch.distributed")


_init_wrapped = []


def _watch_init():
    """Wrap ``init_process_group`` once: once the job's default process group is made, the zero-code hook readies
    the check (:func:`.hook.group_made`: this worker started, the fingerprint's first-call costs paid), before the
    first optimizer step."""
    def wrapper(dist, original):
        def init_process_group(*args, **kwargs):
            result = original(*args, **kwargs)
            hook = sys.modules.get(__package__ + ".hook")
            if hook is not None:
                hook.group_made()  # never raises: a failure there is said once and leaves the job as it is
            return result
        return init_process_group
    _wrap_once("init_process_group", _init_wrapped, wrapper)


def _watch_destroy():
    """Wrap ``destroy_process_group`` once: destroying the default group releases the check's worker and group
    first (called with the worker's lock held)."""
    def wrapper(dist, original):
        def destroy_process_group(group=None, *args, **kwargs):
            default = group is None or group is _default_group(dist)
            if default:
                try:
                    release()
                except Exception:
                    pass
            result = original(group, *args, **kwargs)
            if default:
                _end_of_job("destroy")  # a divergence to raise that the job ended before: raised here
            return result
        return destroy_process_group
    _wrap_once("destroy_process_group", _destroy_wrapped, wrapper)


def _wrap_once(name, wrapped, wrapper):
    """Put ``wrapper(dist, original)`` in place of ``torch.distributed``'s function ``name``, once (``wrapped``
    keeps the original), under both names it goes by: ``torch.distributed``'s and ``distributed_c10d``'s, where
    it is defined."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or wrapped:
        return
    original = getattr(dist, name, None)
    if original is None:
        return
    wrapped.append(original)
    replacement = wrapper(dist, original)
    replacement.__wrapped__ = original
    replacement.__doc__ = original.__doc__
    setattr(dist, name, replacement)
    c10d = getattr(dist, "distributed_c10d", None)
    if getattr(c10d, name, None) is original:
        setattr(c10d, name, replacement)


def _default_group(dist):
    try:
        return dist.distributed_c10d._get_default_group()
    except Exception:
        return None


def _end_of_job(how):
    """Hand the end of the job to the zero-code hook (a divergence to raise that was not raised yet)."""
    hook = sys.modules.get(__package__ + ".hook")
    if hook is not None:
        hook.end_of_job(how)


def _end_of_forked_child():
    """A child forked by ``multiprocessing`` (torch's ``start_processes``: accelerate's debug and notebook
    launchers, Lightning's ``ddp_fork``) ends with ``os._exit``: no interpreter exit, no ``atexit``. Its
    process-end finalizers still run, and this is one of them: the checks handed over are answered (as at
    exit), and a divergence to raise fails the child."""
    finish()
    _end_of_job("fork-exit")


class _ForkToken(object):
    """What ``multiprocessing.util.register_after_fork`` keys its callback by (a weakly referenced object)."""


_FORK_TOKEN = _ForkToken()


def _in_forked_child(_token):
    """Run by ``multiprocessing`` in a forked child, after it cleared the parent's finalizers."""
    import multiprocessing.util

    multiprocessing.util.Finalize(None, _end_of_forked_child, exitpriority=10)


def _watch_forks():
    try:
        import multiprocessing.util

        multiprocessing.util.register_after_fork(_FORK_TOKEN, _in_forked_child)
    except Exception:  # no multiprocessing here: nothing forks through it
        pass


atexit.register(finish)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
_watch_forks()

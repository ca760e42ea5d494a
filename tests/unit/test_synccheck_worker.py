"""The check's worker (tpu_closure_fix.synccheck.worker): its decision lines, and two thread-ranks sharing one
in-memory store (torch's HashStore) whose workers agree, order and exchange checks the way processes do."""
import collections
import contextlib
import os
import sys
import threading

import pytest

torch = pytest.importorskip("torch", reason="SyncCheck compares torch tensors: no torch here")
dist = pytest.importorskip("torch.distributed")

from support.thread_ranks import ThreadChannel, ThreadWorld  # noqa: E402
from tpu_closure_fix import settings  # noqa: E402
from tpu_closure_fix.synccheck import comm, compare, worker  # noqa: E402


# --------------------------------------------------------------------------- decision lines
@pytest.mark.parametrize("arrived, now, expected", [(2, 0.0, "go"), (3, 9.0, "go"), (1, 0.5, None),
                                                    (1, 1.0, "abort"), (0, 2.0, "abort")])
def test_vote(arrived, now, expected):
    assert worker.vote(arrived, 2, now, deadline=1.0) == expected


class _Job(object):
    def __init__(self, key, decision, stream_key=None):
        self.key, self.decision, self.stream_key = key, decision, stream_key


def test_the_proposal_is_the_first_check_agreed_go():
    jobs = [_Job("a", None), _Job("b", "go"), _Job("c", "go")]
    assert worker.proposal(jobs) == "b"
    assert worker.proposal([_Job("a", None), _Job("x", "abort")]) is None


def test_the_proposal_never_puts_a_streams_later_check_before_its_older_one():
    """The last rank in votes "go" on arrival: here D/1 is agreed while D/0 was not polled yet. D/1 waits for
    D/0 (exchanged first it would read D's history as its first look); another stream's agreed check goes."""
    later_first = [_Job("G/0", None, "G"), _Job("D/0", None, "D"), _Job("D/1", "go", "D")]
    assert worker.proposal(later_first) is None
    assert worker.proposal(later_first + [_Job("P/0", "go", "P")]) == "P/0"
    assert worker.proposal([_Job("D/0", "go", "D"), _Job("D/1", "go", "D")]) == "D/0"
    assert worker.proposal([_Job("G/0", None, "G"), _Job("D/1", "go", "D")]) == "D/1"


def test_the_raise_proposal_leads_by_the_ranks_own_pace_and_never_by_fewer_than_its_least_steps():
    # 100 steps in 1 s since the check: 0.2 s more is 20 steps, plus one
    assert worker.raise_proposal(10, 0.0, 110, 1.0, lead=0.2, least=16) == 131
    # no step since the check (its training waited in a collective): still the least lead, plus one
    assert worker.raise_proposal(7, 0.0, 7, 3.0, lead=0.2, least=16) == 24
    assert worker.raise_proposal(7, 0.0, 7, 3.0) == 7 + worker.RAISE_LEAD_STEPS + 1
    # a rank whose step count went backwards (a new optimizer): from its step now
    assert worker.raise_proposal(9, 0.0, 3, 1.0, lead=0.2, least=16) == 20


@pytest.mark.parametrize("step, raise_at, expected", [(4, 5, False), (5, 5, True), (6, 5, True), (0, 0, True),
                                                      (9, None, False)])
def test_due_to_raise(step, raise_at, expected):
    assert worker.due_to_raise(step, raise_at) is expected


@pytest.mark.parametrize("size, bound, adds, expected", [
    (3, 62, [0, 2], (2, [0, 2])),  # each rank's bit: the sum names them
    (62, 62, [61, 0], (2, [0, 61])),  # the highest bit at the bound
    (63, 62, [62, 0], (2, None)),  # above the bound: each adds 1, the count alone
    (2, 1, [1], (1, None))])
def test_the_count_of_a_check_says_how_many_ranks_arrived_and_up_to_the_bound_which(size, bound, adds, expected):
    value = sum(worker.arrival(rank, size, bound) for rank in adds)
    assert worker.arrivals(value, size, bound) == expected
    assert worker.arrivals(0, size, bound)[0] == 0


def test_ranks_list_their_numbers_only_where_the_count_cannot_name_them():
    appends = type("S", (), {"append": lambda self, key, value: None})()
    assert [worker.Worker()._listed(appends, size) for size in (2, worker.MASK_RANKS, worker.MASK_RANKS + 1)] == [
        False, False, True]
    assert not worker.Worker()._listed(object(), worker.MASK_RANKS + 1)  # a store that cannot append: no list


def test_ranks_named():
    assert worker.ranks_named([2, 0, 0, 7], 4) == ([0, 2], [1, 3])
    assert worker.ranks_named([], 2) == ([], [0, 1])


# --------------------------------------------------------------------------- two thread-ranks, one store
class StoreChannel(ThreadChannel):
    """A thread-rank's channel with the process group's store the worker uses (shared by the threads)."""

    kind = "torch.distributed"

    def __init__(self, world, rank, store, timeout):
        super(StoreChannel, self).__init__(world, rank)
        self.store, self.timeout = store, timeout

    def _store(self):
        return self.store


class Outcome(object):
    def __init__(self):
        self.reports, self.stood_down, self.done = {}, {}, threading.Event()
        self.events = []  # check keys in the order their answers came

    def job(self, channel, stream, model, step, expected):
        pending = compare.prepare(model, step, stream, channel=channel)

        def deliver(report, raise_at):
            self.reports[pending.barrier] = report
            self.events.append(pending.barrier)
            if len(self.reports) + len(self.stood_down) >= expected:
                self.done.set()

        def stand_down(exc):
            self.stood_down[pending.barrier] = str(exc)
            self.events.append(pending.barrier)
            if len(self.reports) + len(self.stood_down) >= expected:
                self.done.set()

        return worker.Job(pending, deliver, stand_down)


def _models():
    torch.manual_seed(0)
    return {"A": torch.nn.Linear(3, 2), "B": torch.nn.Linear(5, 1), "P": torch.nn.Linear(2, 2)}


@contextlib.contextmanager
def _stopped_after(workers):
    """The workers stop when the block ends, however it ends (a failed wait included)."""
    try:
        yield
    finally:
        for each in workers:
            each.stop(5)


def _answered(outcomes, seconds):
    """Every rank's checks answered within ``seconds``."""
    for outcome in outcomes:
        assert outcome.done.wait(seconds)


def _run(orders, timeout=5.0, store=None):
    """Each rank (a thread) fingerprints the checks named in its order and hands them to its own worker."""
    store, world = store or dist.HashStore(), ThreadWorld(len(orders))
    outcomes = [Outcome() for _ in orders]
    workers = [worker.Worker().start() for _ in orders]
    models = _models()
    with _stopped_after(workers):
        for rank, order in enumerate(orders):
            channel = StoreChannel(world, rank, store, timeout)
            streams = {name: compare.Stream(name) for name in models}
            for name in order:
                assert workers[rank].submit(outcomes[rank].job(channel, streams[name], models[name], 1, len(order)))
        _answered(outcomes, 30)
    return outcomes


class _DeletionsSeen(object):
    """The store of :func:`_run`, noting which worker thread deleted each key (everything else passes through)."""

    def __init__(self, store):
        self.store, self.deleted = store, []

    def delete_key(self, key):
        self.deleted.append((threading.current_thread(), key))
        return self.store.delete_key(key)

    def __getattr__(self, name):
        return getattr(self.store, name)


#: The two ways ranks count themselves in: the count names the ranks (each adds its bit), and above the
#: bound (here made 1 rank) each adds 1 and lists its number besides (a key more per check).
COUNT_FORMS = [pytest.param(worker.MASK_RANKS, id="count-names-ranks"), pytest.param(1, id="count-and-list")]


@pytest.mark.parametrize("mask_ranks", COUNT_FORMS)
def test_each_exchanged_checks_keys_leave_the_store_deleted_by_the_ranks_in_turn(monkeypatch, mask_ranks):
    """Four checks of one stream on two ranks: every key the agreement wrote is gone once they are answered; the
    first and third exchanges' keys are rank 0's to delete, the second and fourth rank 1's (one rank each)."""
    monkeypatch.setattr(worker, "MASK_RANKS", mask_ranks)
    listed = mask_ranks < 2 and hasattr(dist.HashStore(), "append")
    store = _DeletionsSeen(dist.HashStore())
    outcomes = _run([["A"] * 4, ["A"] * 4], store=store)
    assert [sorted(o.reports) for o in outcomes] == [["A/0", "A/1", "A/2", "A/3"]] * 2
    assert store.num_keys() == 0
    by_check = {}
    for thread, key in store.deleted:
        by_check.setdefault(key.split("/exchange/")[-1] if "/exchange/" in key else key.rsplit("/", 1)[0],
                            set()).add(thread)
    assert len(store.deleted) == 4 * (4 if listed else 3) and all(len(threads) == 1 for threads in by_check.values())
    deleters = [by_check[comm.KEY_PREFIX + "A/%d" % n].pop() for n in range(4)]
    assert [by_check[str(n)].pop() for n in range(4)] == deleters  # the exchange's slot: the same rank's
    assert deleters[0] is deleters[2] and deleters[1] is deleters[3] and deleters[0] is not deleters[1]


def test_checks_fingerprinted_in_opposite_orders_are_exchanged_alike():
    """Rank 0 hands over A then B, rank 1 B then A: each check meets its own on the other rank."""
    outcomes = _run([["A", "B"], ["B", "A"]])
    for outcome in outcomes:
        assert outcome.stood_down == {}
        assert sorted(outcome.reports) == ["A/0", "B/0"]
        assert [outcome.reports[k].outcome for k in ("A/0", "B/0")] == ["identical", "identical"]
        assert [len(outcome.reports[k].names) for k in ("A/0", "B/0")] == [2, 2]


def test_a_streams_checks_are_exchanged_in_order_when_a_later_one_is_agreed_first():
    """Rank 0 hands over A/0 first (not the last rank: no vote), rank 1 then A/0 (last: "go") and A/1, rank 0
    A/1 (last: "go"). Rank 0's worker starts first, holding A/0 unpolled and A/1 agreed: every rank still
    exchanges A/0 first, so A/0 is the stream's first check and A/1 its second (out of order, A/1 read the
    history as the first look and A/0 came after it)."""
    import time

    store, world = dist.HashStore(), ThreadWorld(2)
    outcomes, workers = [Outcome(), Outcome()], [worker.Worker(), worker.Worker()]
    model = _models()["A"]
    channels = [StoreChannel(world, rank, store, 10.0) for rank in range(2)]
    streams = [compare.Stream("A"), compare.Stream("A")]
    jobs = [[outcomes[r].job(channels[r], streams[r], model, step, 2) for step in (0, 1)] for r in range(2)]
    for rank, index in ((0, 0), (1, 0), (1, 1), (0, 1)):
        workers[rank]._arrive(jobs[rank][index])
    assert [j.decision for j in jobs[0]] == [None, "go"] and [j.decision for j in jobs[1]] == ["go", None]
    with _stopped_after(workers):
        workers[0].start()
        time.sleep(0.5)  # rank 0's worker has proposed (or found nothing to propose) before rank 1's starts
        workers[1].start()
        _answered(outcomes, 30)
    for outcome in outcomes:
        assert outcome.stood_down == {}
        assert outcome.events == ["A/0", "A/1"]
        assert [outcome.reports[k].first_check for k in ("A/0", "A/1")] == [True, False]


@pytest.mark.parametrize("mask_ranks", COUNT_FORMS)
def test_a_check_one_rank_never_reaches_stands_down_naming_the_ranks_and_holds_no_other(monkeypatch, mask_ranks):
    """Rank 0 alone has check P (a probe); the check A both have is answered before P's deadline."""
    monkeypatch.setattr(worker, "MASK_RANKS", mask_ranks)
    # P's deadline leaves A room even on a loaded machine: A's answer coming first is what shows no wait
    outcomes = _run([["P", "A"], ["A"]], timeout=8)
    zero, one = outcomes
    assert zero.reports["A/0"].outcome == one.reports["A/0"].outcome == "identical"
    # listed: torch's stores without append() (before 2.x) cannot list who arrived, the message says less
    named = mask_ranks >= 2 or hasattr(dist.HashStore(), "append")
    who = "rank 0 reached it, rank 1 did not" if named else "not every rank reached it"
    assert zero.stood_down == {"P/0": who + " within 8s (an optimizer stepped on some ranks only, ranks out of "
                                            "step, or a rank gone)"}
    assert zero.events == ["A/0", "P/0"]  # A, fingerprinted after P, did not wait for P's deadline


@pytest.mark.parametrize("rank_1_runs", [True, False])
def test_a_probe_is_refused_at_its_quota_once_the_other_rank_went_past_it_and_a_lagging_rank_is_waited_for(
        rank_1_runs):
    """Rank 0 steps a probe P before the main optimizer A at 8 steps; rank 1 steps A alone. Once rank 1 reached
    A's checks (every A answered) and rank 0's worker read P's oldest again, P's ninth check is refused. Its twin:
    rank 1's worker never starts (a rank whose worker lags): nothing shows a rank went past P, and P's ninth check
    is taken."""
    import time

    store, world = dist.HashStore(), ThreadWorld(2)
    outcomes, workers = [Outcome(), Outcome()], [worker.Worker(), worker.Worker()]
    models = _models()
    channels = [StoreChannel(world, rank, store, 60.0) for rank in range(2)]
    streams = [{name: compare.Stream(name) for name in "AP"} for _ in range(2)]
    steps = worker.MAX_PENDING_PER_STREAM
    with _stopped_after(workers):
        workers[0].start()
        if rank_1_runs:
            workers[1].start()
        for step in range(steps):
            for rank, names in ((0, "PA"), (1, "A")):
                for name in names:
                    job = outcomes[rank].job(channels[rank], streams[rank][name], models[name], step, steps)
                    assert workers[rank].submit(job)
        probe = lambda: outcomes[0].job(channels[0], streams[0]["P"], models["P"], steps, steps)  # noqa: E731
        if rank_1_runs:
            _answered(outcomes, 30)  # rank 1's A checks, and so rank 0's
            deadline, ninth = time.monotonic() + 20, probe()
            while workers[0].submit(ninth) and time.monotonic() < deadline:
                time.sleep(0.01)  # rank 0's worker has not read P's oldest since A was agreed: taken still
                ninth = probe()
            assert ninth.refused is not None and ninth.refused[0] == worker.UNREACHED, ninth.refused
            assert ninth.refused[1].pending.barrier == "P/0"
            assert ninth.refused[2] < worker.MAX_PENDING // 2, ninth.refused  # the quota, not the memory bound
        else:
            time.sleep(0.5)  # rank 0's worker counted its checks in and read P's oldest
            ninth = probe()
            assert workers[0].submit(ninth) and ninth.refused is None


class _Held(object):
    """A check as the quota sees it: its stream, whether it arrived (deadline) and its vote."""

    def __init__(self, stream, arrived=True, decision=None, time_then=-10.0):
        self.stream_key, self.decision, self.done, self.refused = stream, decision, False, None
        self.polled_at = None  # never read incomplete by a worker
        self.deadline = 1.0 if arrived else None
        self.time_then = time_then  # handed over 10 s before the test's "now" (0.0) unless said


def test_a_full_queue_takes_no_more_checks(monkeypatch):
    monkeypatch.setattr(worker, "MAX_PENDING", 2)
    blocked = worker.Worker()  # not started: nothing is taken from its queue
    assert blocked.submit(_Held("a")) and blocked.submit(_Held("b"))
    late = _Held("c")
    assert not blocked.submit(late) and late.refused[0] == worker.BEHIND


@pytest.mark.parametrize("waiting, total, skipped, expected", [
    (["open"] * 8, 8, True, worker.UNREACHED),  # its oldest waits for a rank known to have gone past it
    (["open"] * 7, 7, True, None),  # ... within its quota still
    (["open"] * 8, 8, False, None),  # its oldest only waits (a rank whose worker lags): held by the bound alone
    (["open"] * 63, 63, False, None),  # ... however many of its checks wait, up to the bound
    (["go"] + ["open"] * 7, 8, True, None),  # its oldest agreed, not yet exchanged: a backlog, held by the bound only
    (["queued"] * 8, 8, True, None),  # not even counted in yet: the same
    (["go"] * 20, 64, False, worker.BEHIND),  # the process-wide memory bound
    ([], 64, False, worker.BEHIND),
    (["open"], 64, False, worker.UNREACHED)])
def test_the_refusal_names_the_stream_over_its_quota_and_why(waiting, total, skipped, expected):
    jobs = [_Held("s", arrived=state != "queued", decision="go" if state == "go" else None) for state in waiting]
    assert worker.refusal(jobs, total, quota=8, bound=64, skipped=skipped) == expected


class _Polled(object):
    stream_key, time_then = "probe", 10.0

    def __init__(self, polled_at):
        self.polled_at = polled_at


@pytest.mark.parametrize("polled_at, agreed, expected", [
    (12.0, {"main": (11.0, 11.5)}, True),  # a later main check every rank reached, known before the last read
    (12.0, {"main": (11.0, 12.5)}, False),  # ... known only after it: that read may predate the rank's arrival
    (12.0, {"main": (9.0, 11.5)}, False),  # ... handed over before the probe's check: says nothing of it
    (12.0, {"probe": (11.0, 11.5)}, False),  # a later check of its own stream: the rank reached this one too
    (None, {"main": (11.0, 11.5)}, False),  # never read incomplete
    (12.0, {}, False),
    (12.0, {"probe": (11.0, 11.5), "main": (11.0, 12.0)}, True)])
def test_a_rank_passed_a_check_by_only_when_it_reached_a_later_one_of_another_stream_first(polled_at, agreed,
                                                                                          expected):
    assert worker.passed_by(_Polled(polled_at), agreed) is expected


def test_a_stream_whose_oldest_check_some_rank_skipped_is_refused_at_its_quota_at_once():
    """The main stream's check handed over after the probe's oldest was reached by every rank, then the probe's
    oldest was read incomplete: the probe's ninth check is refused. Its twin: the same checks with nothing known of
    any other stream (a rank whose worker lags) are all taken."""
    for skipped in (True, False):
        held = worker.Worker()  # not started: what it holds stays as set here
        now = worker.time.monotonic()
        probes = [_Held("probe", time_then=now) for _ in range(worker.MAX_PENDING_PER_STREAM)]
        for probe in probes:
            assert held.submit(probe)
        if skipped:
            held.agreed["main"] = (now + 0.001, worker.time.monotonic())
        probes[0].polled_at = worker.time.monotonic() + 0.001
        over = _Held("probe", time_then=now)
        assert held.submit(over) is not skipped
        assert (over.refused or (None,))[0] == (worker.UNREACHED if skipped else None)


def test_a_stuck_stream_fills_its_own_quota_and_never_the_others():
    """Rank 0's probe checks never reach "go" while rank 1 reached a later main check: the probe's ninth is refused
    (UNREACHED), the main stream's checks are all still taken -- a process-wide bound alone would have refused the
    main stream's check once the probe's checks filled it."""
    held = worker.Worker()  # not started: what it holds stays as set here
    now = worker.time.monotonic()
    for _ in range(worker.MAX_PENDING_PER_STREAM):
        assert held.submit(_Held("probe", time_then=now - 10))
    held.agreed["main"] = (now - 5, now - 4)  # a main check handed over after them, reached by every rank
    held.streams["probe"][0].polled_at = now - 3  # then the probe's oldest read still incomplete
    over = _Held("probe")
    assert not held.submit(over) and over.refused[0] == worker.UNREACHED
    assert over.refused[1] is held.streams["probe"][0]
    for _ in range(worker.MAX_PENDING - 2 * worker.MAX_PENDING_PER_STREAM):
        main = _Held("main")
        assert held.submit(main)
        main.done = True  # answered: it leaves the stream's count


def test_a_refusal_says_which_ranks_reached_the_oldest_check():
    class _Oldest(object):
        arrived, reached, time_then = 1, [0], worker.time.monotonic()
        pending = type("P", (), {"step": 3, "channel": type("C", (), {"size": 2})()})()

    refused = _Held("probe")
    refused.refused = (worker.UNREACHED, _Oldest(), 8)
    said = worker.refusal_reason(refused, 1, "TPU_CLOSURE_FIX_SYNC_CHECK")
    assert said.startswith("its earlier checks were not reached by every rank (the oldest, at step 3, by rank 0 "
                           "only so far, "), said
    refused.refused = (worker.BEHIND, None, 8)
    assert worker.refusal_reason(refused, 1, "TPU_CLOSURE_FIX_SYNC_CHECK") == (
        "8 checks are still being exchanged (every 1 steps is more often than the ranks can exchange them); set "
        "TPU_CLOSURE_FIX_SYNC_CHECK higher")


class _CountingStore(object):
    """A store whose counts stay as set: it counts the polls of each key."""

    def __init__(self, arrived):
        self.arrived, self.polls = arrived, collections.Counter()

    def add(self, key, amount):
        self.polls[key.rsplit("/", 2)[-2]] += 1
        return self.arrived[key.rsplit("/", 2)[-2]]


@pytest.mark.parametrize("waited, expected", [(10.0, [0, 2]), (0.0, None)])
def test_a_check_waiting_long_knows_which_ranks_reached_it_from_its_count_alone(waited, expected):
    """Ranks 0 and 2 of 3 counted in: once the check waited past STUCK the worker knows them (no other read: the
    store here has nothing else); a check answered sooner keeps only the count."""
    channel = type("C", (), {"size": 3, "rank": 0})()
    job = worker.Job(compare.Pending(channel, compare.Stream("P"), 1, "P/0", None, None, None),
                     lambda *a: None, lambda *a: None)
    job.time_then = worker.time.monotonic() - waited
    value = worker.arrival(0, 3) + worker.arrival(2, 3)
    assert worker.Worker()._note_arrivals(job, object(), value, 3) == 2
    assert (job.arrived, job.reached) == (2, expected)


def test_a_stream_is_polled_oldest_first_and_no_further_than_its_first_open_check():
    import time

    store = _CountingStore({"P0": 1, "P1": 1, "P2": 1, "A0": 1})
    polling = worker.Worker()
    channel = type("C", (), {"size": 2, "rank": 0, "_store": lambda self: store})()
    for name in ("P0", "A0", "P1", "P2"):
        job = worker.Job(compare.Pending(channel, compare.Stream(name[0]), 1, name, None, None, None),
                         lambda *a: None, lambda *a: None)
        job.deadline = time.monotonic() + 60
        polling.pending[job.key] = job
    assert polling._agree() is False
    assert store.polls == {"P0": 1, "A0": 1}  # P1 and P2 wait behind P0 on every rank: not polled


def test_the_worker_stops_within_its_bound_and_leaves_no_thread():
    running = worker.Worker().start()
    running.stop(5)
    assert not running.thread.is_alive()
    assert not running.submit(object())  # a stopped worker takes nothing


def test_a_failure_inside_the_worker_is_said_once_and_no_check_is_taken_after(monkeypatch):
    from support.said import spoken

    monkeypatch.setitem(worker._state, "failed", None)
    monkeypatch.setattr(worker, "_workers", {})
    broken = worker.Worker()
    monkeypatch.setattr(broken, "_step", lambda: 1 / 0)
    broken.pending["x"] = object()  # something pending: the loop polls at once
    with spoken() as seen:
        broken.start().thread.join(10)
    assert not broken.thread.is_alive() and worker.failed()
    said = [w.message for w in seen if "worker thread failed" in w.message]
    assert said == ["tpu-closure-fix: the sync check's worker thread failed (ZeroDivisionError: division by zero) "
                    "and the zero-code check is now off; training goes on."]
    assert worker.submit(object()) is False and worker._workers == {}


# --------------------------------------------------------------------------- raise: every rank at the same step
def test_the_raise_round_runs_once_per_stream_when_the_verdict_diverged():
    class Verdict(object):
        def __init__(self, diverged):
            self.diverged = diverged

    assert worker.raise_round(Verdict(True), settled=False) is True
    assert worker.raise_round(Verdict(False), settled=False) is False
    assert worker.raise_round(Verdict(True), settled=True) is False  # the ranks agreed already for this stream


def test_a_rank_not_raising_votes_the_sentinel_and_never_raises():
    assert worker.raise_vote(False, 10, 0.0, 110, 1.0) == worker.NOT_RAISING
    assert worker.raise_vote(True, 10, 0.0, 110, 1.0) == worker.raise_proposal(10, 0.0, 110, 1.0)
    assert worker.raise_step(True, 131) == 131
    assert worker.raise_step(False, 131) is None  # told to warn: the others' step is not its own
    assert worker.raise_step(True, worker.NOT_RAISING) is None


class RaiseOutcome(Outcome):
    def __init__(self):
        super(RaiseOutcome, self).__init__()
        self.raise_at = {}

    def job(self, channel, stream, model, step, expected, raising=False):
        done = super(RaiseOutcome, self).job(channel, stream, model, step, expected)
        told = done.deliver

        def deliver(report, raise_at):
            self.raise_at[done.pending.barrier] = raise_at
            told(report, raise_at)

        return worker.Job(done.pending, deliver, done.stand_down, current_step=lambda: step, raising=raising)


def test_ranks_told_differently_on_divergence_pair_every_collective():
    """Rank 0 raises, rank 1 warns: after the diverged check A both enter the raise-step all-reduce, so the
    next check B's all-reduce pairs with B's on the other rank (answered, not out of step)."""
    store, world = dist.HashStore(), ThreadWorld(2)
    outcomes = [RaiseOutcome(), RaiseOutcome()]
    workers = [worker.Worker().start() for _ in range(2)]
    with _stopped_after(workers):
        for rank in range(2):
            torch.manual_seed(0)
            models = {"A": torch.nn.Linear(3, 2), "B": torch.nn.Linear(5, 1)}
            if rank == 1:
                with torch.no_grad():
                    models["A"].weight[0, 0] += 1.0
            channel = StoreChannel(world, rank, store, 10)
            for name in ("A", "B"):
                job = outcomes[rank].job(channel, compare.Stream(name), models[name], 3, 2, raising=rank == 0)
                assert workers[rank].submit(job)
        _answered(outcomes, 60)
    for outcome in outcomes:
        assert outcome.stood_down == {}
        assert outcome.reports["A/0"].outcome == "differ" and outcome.reports["B/0"].outcome == "identical"
    assert outcomes[0].raise_at["A/0"] is not None and outcomes[0].raise_at["A/0"] > 3
    assert outcomes[1].raise_at["A/0"] is None
    assert outcomes[0].raise_at["B/0"] is None and outcomes[1].raise_at["B/0"] is None


# --------------------------------------------------------------------------- the job's end
GLOO_CLOSED = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
               "[127.0.0.1]:19118. This is typically caused by a remote worker crashing. Check the logs of the remote "
               "worker before reporting an error. GLHF! \U0001f3d6\ufe0f\nsecond line")


def test_a_collective_that_did_not_complete_says_a_short_reason():
    from tpu_closure_fix.synccheck import comm

    channel = comm._StoreChannel(0, 2, 5)
    said = str(channel._did_not_complete("all-reduce", RuntimeError(GLOO_CLOSED)))
    assert said == ("the check's all-reduce did not complete (RuntimeError: Connection closed by peer "
                    "[127.0.0.1]:19118): a peer gone or timed out")
    long = str(channel._did_not_complete("all-gather", RuntimeError("x" * 300)))
    assert long == ("the check's all-gather did not complete (RuntimeError: %s...): a peer gone or timed out"
                    % ("x" * 77))


def test_a_broken_channel_is_the_job_ending_only_while_this_process_ends(monkeypatch):
    from tpu_closure_fix.synccheck import comm

    broken, lost = comm.StoodDown("closed", broken=True), comm.StoodDown("not reached")
    monkeypatch.setitem(worker._state, "ending", False)
    assert worker.said_as_ending(broken) is False  # a peer lost while this process trains: a warning
    monkeypatch.setitem(worker._state, "ending", True)
    assert worker.said_as_ending(broken) is True and worker.said_as_ending(lost) is False


def test_the_drain_at_the_end_is_bounded_by_the_agreement_timeout():
    assert worker.drain_bound({}) == worker.EXIT_DRAIN
    assert worker.drain_bound({"TPU_CLOSURE_FIX_SYNC_CHECK_TIMEOUT": "3"}) == 3
    assert worker.drain_bound({"TPU_CLOSURE_FIX_SYNC_CHECK_TIMEOUT": "600"}) == worker.EXIT_DRAIN


def test_at_the_end_the_checks_handed_over_are_answered_then_the_workers_stop(monkeypatch):
    """Both thread-ranks hand over two checks and end at once: ``finish`` answers them before it stops."""
    store, world = dist.HashStore(), ThreadWorld(2)
    outcomes = [Outcome() for _ in range(2)]
    workers = [worker.Worker().start() for _ in range(2)]
    monkeypatch.setattr(worker, "_workers", {("thread", rank): each for rank, each in enumerate(workers)})
    monkeypatch.setitem(worker._state, "ending", False)
    models = _models()
    for rank in range(2):
        channel = StoreChannel(world, rank, store, 20)
        for name in ("A", "B"):
            assert workers[rank].submit(outcomes[rank].job(channel, compare.Stream(name), models[name], 1, 2))
    worker.finish()
    assert [sorted(outcome.reports) for outcome in outcomes] == [["A/0", "B/0"], ["A/0", "B/0"]]
    assert not any(each.thread.is_alive() for each in workers) and worker._workers == {}
    assert worker.ending() is True


@pytest.mark.parametrize("states, moved, expected", [
    (["open", "open"], 0.0, True),  # only checks waiting for ranks, nothing moved for 5 s: given up
    (["open", "open"], 4.0, False),  # something moved 1 s ago: still waited for
    (["open", "go"], 0.0, False),  # one agreed, waiting for its exchange: still waited for
    (["open", "queued"], 0.0, False)])  # one not yet counted in
def test_the_end_gives_up_only_on_checks_waiting_for_ranks_when_nothing_moves(states, moved, expected):
    jobs = [_Held("s", arrived=state != "queued", decision="go" if state == "go" else None) for state in states]
    assert worker.stalled(jobs, moved, 5.0, quiet=2.0) is expected


def test_at_the_end_a_check_no_other_rank_will_reach_is_given_up_once_nothing_moves(monkeypatch):
    """Rank 0 alone hands over a probe's check: ``finish`` stops waiting for it once nothing moved for the quiet
    time, not at the drain's bound."""
    import time

    store, world = dist.HashStore(), ThreadWorld(2)
    outcome, alone = Outcome(), worker.Worker().start()
    monkeypatch.setattr(worker, "_workers", {"process": alone})
    monkeypatch.setattr(worker, "EXIT_QUIET", 0.2)
    monkeypatch.setattr(worker, "EXIT_DRAIN", 30)
    monkeypatch.setitem(worker._state, "ending", False)
    monkeypatch.setenv("TPU_CLOSURE_FIX_SYNC_CHECK_TIMEOUT", "600")
    settings.reload()
    assert alone.submit(outcome.job(StoreChannel(world, 0, store, 600), compare.Stream("P"), _models()["P"], 1, 1))
    started = time.monotonic()
    worker.finish()
    assert time.monotonic() - started < 20  # well below the 30 s bound: given up, not waited out
    assert not alone.thread.is_alive() and outcome.reports == {}


# --------------------------------------------------------------------------- sharing a core with training
@pytest.mark.parametrize("held, yielding, expected", [
    (worker.CATCH_UP, True, False),  # 1. falling behind: takes its share
    (worker.CATCH_UP + 5, True, False),
    (worker.KEPT_UP, False, True),  # 2. keeping up: yields
    (0, False, True),
    (worker.KEPT_UP + 1, True, True),  # 3. between the bounds: as it was, either way
    (worker.CATCH_UP - 1, True, True),
    (worker.KEPT_UP + 1, False, False),
    (worker.CATCH_UP - 1, False, False)])
def test_the_worker_yields_a_shared_core_while_it_keeps_up_and_takes_its_share_when_behind(held, yielding, expected):
    assert worker.yields(held, yielding) is expected


LINUX_ONLY = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="threads' scheduling: Linux only")


def _policy(thread):
    return os.sched_getscheduler(thread.native_id)


@LINUX_ONLY
def test_a_worker_that_keeps_up_yields_and_one_that_falls_behind_takes_its_share(monkeypatch):
    """Two thread-ranks exchange checks: idle, their workers have the starting thread's policy; with few checks
    held they run as SCHED_BATCH, the test's thread and a plain thread as before; once they count themselves
    behind (the bounds lowered: every held check is too many) they are back. A gloo thread running SCHED_BATCH
    before the worker started is never taken for one of the worker's group."""
    here = os.sched_getscheduler(threading.get_native_id())
    plain = threading.Thread(target=threading.Event().wait, args=(30,), daemon=True)
    plain.start()
    hold = threading.Event()
    older = _in_thread(lambda: None, "pt_gloo_runloop", batch=True, hold=hold)["tid"]  # a user's, before the worker
    store, world = dist.HashStore(), ThreadWorld(2)
    workers = [worker.Worker().start() for _ in range(2)]
    models = _models()
    policies = [[_policy(each.thread) for each in workers]]
    with _stopped_after(workers):
        for number in range(3):
            if number == 2:
                monkeypatch.setattr(worker, "CATCH_UP", 0)
                monkeypatch.setattr(worker, "KEPT_UP", -1)
            outcomes = [Outcome() for _ in range(2)]
            for rank in range(2):
                channel = StoreChannel(world, rank, store, 10)
                assert workers[rank].submit(outcomes[rank].job(channel, compare.Stream("A"), models["A"], number, 1))
            _answered(outcomes, 30)
            policies.append([_policy(each.thread) for each in workers])
            if number == 1:  # yielding: a SCHED_BATCH gloo thread that ran before the worker is not its group's
                assert all(older not in each.group_threads() for each in workers)
        hold.set()
        assert here == os.SCHED_OTHER and policies == [[here] * 2] + [[os.SCHED_BATCH] * 2] * 2 + [[here] * 2]
        assert os.sched_getscheduler(threading.get_native_id()) == here and _policy(plain) == here


def _in_thread(fn, name=None, batch=False, hold=None):
    """Run ``fn`` on a new thread (named ``name`` for the system, SCHED_BATCH if ``batch``) and return what it
    returned; ``hold``: an Event the thread waits for before it ends (its id stays valid meanwhile)."""
    import ctypes

    result, ready = {}, threading.Event()

    def run():
        if name:
            ctypes.CDLL(None).prctl(15, name.encode())  # PR_SET_NAME: the name /proc/self/task/<id>/comm gives
        if batch:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        result["value"] = fn()
        result["tid"] = threading.get_native_id()
        ready.set()
        if hold is not None:
            hold.wait(30)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30)
    if hold is None:
        thread.join(30)
    return result


@LINUX_ONLY
def test_the_gloo_threads_noted_are_those_started_meanwhile_under_the_workers_policy():
    """Of the threads started since the snapshot, only those named as gloo's and running SCHED_BATCH (inherited
    from the yielding worker) are noted: not a gloo thread another thread started at the training's policy, not a
    thread of another name, not one that ran before."""
    hold = threading.Event()
    try:
        older = _in_thread(lambda: None, "pt_gloo_runloop", batch=True, hold=hold)["tid"]
        before = worker.task_ids()
        ours = _in_thread(lambda: None, "pt_gloo_runloop", batch=True, hold=hold)["tid"]
        loop = _in_thread(lambda: None, "gloo_tcp_loop", batch=True, hold=hold)["tid"]
        theirs = _in_thread(lambda: None, "pt_gloo_runloop", hold=hold)["tid"]
        other = _in_thread(lambda: None, "python-batch", batch=True, hold=hold)["tid"]
        found = worker.gloo_threads_since(before, os.SCHED_BATCH)
        assert sorted(found) == sorted([ours, loop]) and not {older, theirs, other} & set(found)
    finally:
        hold.set()


@LINUX_ONLY
def test_a_refused_switch_leaves_every_thread_at_the_default_policy(monkeypatch):
    """The system refuses to switch another thread: the worker's thread, switched first, is put back to
    SCHED_OTHER (a worker left yielding for good falls behind) and the switch says it failed; twin: allowed, it
    is SCHED_BATCH."""
    original = os.sched_setscheduler

    def refuse_others(tid, policy, param):
        if tid != 0:
            raise PermissionError(1, "Operation not permitted")
        return original(tid, policy, param)

    allowed = _in_thread(lambda: (worker.schedule(True, [threading.get_native_id()]), os.sched_getscheduler(0)))
    assert allowed["value"] == (True, os.SCHED_BATCH)
    monkeypatch.setattr(os, "sched_setscheduler", refuse_others)
    refused = _in_thread(lambda: (worker.schedule(True, [threading.get_native_id()]), os.sched_getscheduler(0)))
    assert refused["value"] == (False, os.SCHED_OTHER)


@LINUX_ONLY
def test_a_thread_that_ended_meanwhile_is_passed_over():
    ended = _in_thread(lambda: None)["tid"]  # joined: its id names no thread now
    switched = _in_thread(lambda: (worker.schedule(True, [ended]), os.sched_getscheduler(0)))
    assert switched["value"] == (True, os.SCHED_BATCH)


@LINUX_ONLY
def test_only_a_process_wide_worker_switches_its_scheduling(monkeypatch):
    """A process with a process group has one worker, which may switch; replicas that are threads of one process
    each have theirs (their gloo groups' threads cannot be told apart): none of them switches."""
    monkeypatch.setattr(worker, "_workers", {})
    started = [worker._start("process", None), worker._start(("thread", 0), None)]
    try:
        assert [each.schedulable for each in started] == [True, False]
    finally:
        for each in started:
            each.stop(5)

"""The check's worker (tpu_closure_fix.synccheck.worker): its decision lines, and two thread-ranks sharing one
in-memory store (torch's HashStore) whose workers agree, order and exchange checks the way processes do."""
import threading

import pytest

torch = pytest.importorskip("torch", reason="SyncCheck compares torch tensors: no torch here")
dist = pytest.importorskip("torch.distributed")

from support.thread_ranks import ThreadChannel, ThreadWorld  # noqa: E402
from tpu_closure_fix.synccheck import compare, worker  # noqa: E402


# --------------------------------------------------------------------------- decision lines
@pytest.mark.parametrize("arrived, now, expected", [(2, 0.0, "go"), (3, 9.0, "go"), (1, 0.5, None),
                                                    (1, 1.0, "abort"), (0, 2.0, "abort")])
def test_vote(arrived, now, expected):
    assert worker.vote(arrived, 2, now, deadline=1.0) == expected


class _Job(object):
    def __init__(self, key, decision):
        self.key, self.decision = key, decision


def test_the_proposal_is_the_first_check_agreed_go():
    jobs = [_Job("a", None), _Job("b", "go"), _Job("c", "go")]
    assert worker.proposal(jobs) == "b"
    assert worker.proposal([_Job("a", None), _Job("x", "abort")]) is None


def test_the_raise_proposal_leads_by_the_ranks_own_pace():
    # 100 steps in 1 s since the check: 0.2 s more is 20 steps, plus one
    assert worker.raise_proposal(10, 0.0, 110, 1.0, lead=0.2) == 131
    # no step since the check: the next one
    assert worker.raise_proposal(7, 0.0, 7, 3.0, lead=0.2) == 8
    # a rank whose step count went backwards (a new optimizer) proposes no less than its next step
    assert worker.raise_proposal(9, 0.0, 3, 1.0, lead=0.2) == 4


@pytest.mark.parametrize("step, raise_at, expected", [(4, 5, False), (5, 5, True), (6, 5, True), (0, 0, True),
                                                      (9, None, False)])
def test_due_to_raise(step, raise_at, expected):
    assert worker.due_to_raise(step, raise_at) is expected


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


def _run(orders, timeout=5.0):
    """Each rank (a thread) fingerprints the checks named in its order and hands them to its own worker."""
    store, world = dist.HashStore(), ThreadWorld(len(orders))
    outcomes = [Outcome() for _ in orders]
    workers = [worker.Worker().start() for _ in orders]
    models = _models()
    try:
        for rank, order in enumerate(orders):
            channel = StoreChannel(world, rank, store, timeout)
            streams = {name: compare.Stream(name) for name in models}
            for name in order:
                assert workers[rank].submit(outcomes[rank].job(channel, streams[name], models[name], 1, len(order)))
        for outcome in outcomes:
            assert outcome.done.wait(30)
    finally:
        for each in workers:
            each.stop(5)
    return outcomes


def test_checks_fingerprinted_in_opposite_orders_are_exchanged_alike():
    """Rank 0 hands over A then B, rank 1 B then A: each check meets its own on the other rank."""
    outcomes = _run([["A", "B"], ["B", "A"]])
    for outcome in outcomes:
        assert outcome.stood_down == {}
        assert sorted(outcome.reports) == ["A/0", "B/0"]
        assert [outcome.reports[k].outcome for k in ("A/0", "B/0")] == ["identical", "identical"]
        assert [len(outcome.reports[k].names) for k in ("A/0", "B/0")] == [2, 2]


def test_a_check_one_rank_never_reaches_stands_down_naming_the_ranks_and_holds_no_other():
    """Rank 0 alone has check P (a probe); the check A both have is answered before P's deadline."""
    # P's deadline leaves A room even on a loaded machine: A's answer coming first is what shows no wait
    outcomes = _run([["P", "A"], ["A"]], timeout=8)
    zero, one = outcomes
    assert zero.reports["A/0"].outcome == one.reports["A/0"].outcome == "identical"
    # torch's stores without append() (before 2.x) cannot list who arrived: the message says less
    who = "rank 0 reached it, rank 1 did not" if hasattr(dist.HashStore(), "append") else "not every rank reached it"
    assert zero.stood_down == {"P/0": who + " within 8s (an optimizer stepped on some ranks only, ranks out of "
                                            "step, or a rank gone)"}
    assert zero.events == ["A/0", "P/0"]  # A, fingerprinted after P, did not wait for P's deadline


def test_a_full_queue_takes_no_more_checks(monkeypatch):
    monkeypatch.setattr(worker, "MAX_PENDING", 2)
    blocked = worker.Worker()  # not started: nothing is taken from its queue
    assert blocked.submit(object()) and blocked.submit(object())
    assert not blocked.submit(object())


def test_the_worker_stops_within_its_bound_and_leaves_no_thread():
    running = worker.Worker().start()
    running.stop(5)
    assert not running.thread.is_alive()
    assert not running.submit(object())  # a stopped worker takes nothing


def test_a_failure_inside_the_worker_is_said_once_and_no_check_is_taken_after(monkeypatch, recwarn):
    monkeypatch.setitem(worker._state, "failed", None)
    monkeypatch.setattr(worker, "_workers", {})
    broken = worker.Worker()
    monkeypatch.setattr(broken, "_agree", lambda: 1 / 0)
    broken.pending["x"] = object()  # something pending: the loop polls at once
    broken.start().thread.join(10)
    assert not broken.thread.is_alive() and worker.failed()
    said = [str(w.message) for w in recwarn if "worker thread failed" in str(w.message)]
    assert said == ["tpu-closure-fix: the sync check's worker thread failed (ZeroDivisionError: division by zero) "
                    "and the zero-code check is now off; training goes on."]
    assert worker.submit(object()) is False and worker._workers == {}

"""The agreement waits for the other ranks by blocking on the store, not by polling it: its store calls per check
are as many when the other rank comes late as when it comes at once (a poll's every wake-up takes the
interpreter lock from the training thread). Twin: the polling shape (a torch whose timed-out wait breaks the
store) makes more calls the longer it waits. And the worker's last rank in votes as it arrives."""
import collections
import threading
import time

import pytest

torch = pytest.importorskip("torch", reason="SyncCheck's agreement runs over a torch store: no torch here")
dist = pytest.importorskip("torch.distributed")

from tpu_closure_fix.synccheck import comm, compare, worker  # noqa: E402

#: Seconds the other rank comes after this one: at once, and late.
LATE = (0.0, 0.6)
#: Store calls of one rank's agreement when it comes first and blocks: count in, wait, read the vote.
BLOCKING_CALLS = 3
#: The worker blocks on a second connection to the store (``clone``) and reads slots with ``check``; a torch whose
#: stores have neither (1.x) keeps the polling worker, whose shape the twins show on every torch.
WATCHABLE = pytest.mark.skipif(not all(hasattr(dist.HashStore, name) for name in ("check", "clone")),
                               reason="this torch's stores have no check/clone: its agreement and worker poll "
                                      "(see the twins)")


class CountingStore(object):
    """torch's in-memory store, counting the calls each thread makes."""

    def __init__(self):
        self.store, self.calls = dist.HashStore(), collections.Counter()

    def __getattr__(self, name):
        method = getattr(self.store, name)

        def call(*args):
            self.calls[threading.current_thread().name] += 1
            return method(*args)
        return call


class Channel(comm._StoreChannel):
    def __init__(self, store, rank, size=2, timeout=30):
        super(Channel, self).__init__(rank, size, timeout)
        self.store = store

    def _store(self):
        return self.store


def _agree_with_a_late_rank(late):
    """Rank 0 agrees on this thread; rank 1 counts itself in ``late`` seconds after. (rank 0's store calls,
    both answers)."""
    store = CountingStore()
    answers = {}

    def other():
        time.sleep(late)
        answers[1] = Channel(store, 1).agree("api/1")

    thread = threading.Thread(target=other, name="rank 1")
    thread.start()
    answers[0] = Channel(store, 0).agree("api/1")
    thread.join(30)
    return store.calls[threading.current_thread().name], answers


@WATCHABLE  # the wait is on a connection of the thread's own (a clone): where stores have none, the agreement polls
@pytest.mark.parametrize("late", LATE)
def test_the_agreement_blocks_on_the_store_however_long_the_other_rank_takes(monkeypatch, late):
    monkeypatch.setattr(comm, "blocking_wait_safe", lambda: True)
    calls, answers = _agree_with_a_late_rank(late)
    assert answers == {0: True, 1: True}
    assert calls <= BLOCKING_CALLS


@pytest.mark.parametrize("late", LATE[1:])
def test_twin_polling_the_count_makes_more_calls_the_longer_it_waits(monkeypatch, late):
    monkeypatch.setattr(comm, "blocking_wait_safe", lambda: False)  # the shape a torch 1.x store needs
    calls, answers = _agree_with_a_late_rank(late)
    assert answers == {0: True, 1: True}
    assert calls > BLOCKING_CALLS


def test_a_rank_that_never_comes_is_voted_out_at_the_deadline_and_the_store_still_serves(monkeypatch):
    monkeypatch.setattr(comm, "blocking_wait_safe", lambda: True)
    store = CountingStore()
    assert Channel(store, 0, timeout=1).agree("api/7") is False
    assert store.add("after", 1) == 1 and store.get(comm.KEY_PREFIX + "api/7/decision") == b"abort"


@pytest.mark.parametrize("version, safe", [("2.13.0+cpu", True), ("2.9.0+cu128", True), ("2.10.0a0+git", True),
                                           ("2.8.1", False), ("1.13.1", False), ("garbage", False)])
def test_a_blocking_wait_is_used_only_where_a_timed_out_one_leaves_the_store_usable(version, safe):
    assert comm.blocking_wait_safe(version) is safe


# --------------------------------------------------------------------------- the wait holds no one else's connection
class SignallingStore(object):
    """A store that sets ``waiting`` as a ``wait`` starts on it or on a connection cloned from it, and counts the
    waits that timed out in ``timed_out``."""

    def __init__(self, store, waiting, timed_out):
        self.store, self.waiting, self.timed_out = store, waiting, timed_out

    def wait(self, *args):
        self.waiting.set()
        try:
            return self.store.wait(*args)
        except Exception:
            self.timed_out.append(args)
            raise

    def clone(self):
        return SignallingStore(self.store.clone(), self.waiting, self.timed_out)

    def __getattr__(self, name):
        return getattr(self.store, name)


@WATCHABLE
@pytest.mark.parametrize("own", [True, False])
def test_while_a_rank_waits_for_the_vote_its_other_threads_use_the_store_at_once(monkeypatch, own):
    """Rank 0 waits for rank 1's count on a real TCPStore; meanwhile another thread of rank 0 (its worker, its
    training thread) uses the job's connection, and only then does rank 1 count in: the vote comes within the wait.
    Twin (``own`` False: the wait on the job's own connection): that use waits until rank 0's wait timed out."""
    from datetime import timedelta

    monkeypatch.setattr(comm, "blocking_wait_safe", lambda: True)
    if not own:
        monkeypatch.setattr(comm, "own_connection", lambda store: store)
    timeout = 30 if own else 3  # the twin's wait must time out: a short one
    waiting, timed_out = threading.Event(), []
    server = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False)
    store = SignallingStore(server, waiting, timed_out)
    other = {}

    def other_thread_then_rank_1():
        waiting.wait(60)
        time.sleep(0.2)  # rank 0 is inside its wait
        other["used"] = store.add("the training's own key", 1)
        other["answer"] = Channel(store, 1, timeout=timeout).agree("api/9")

    thread = threading.Thread(target=other_thread_then_rank_1, name="rank 0's other thread")
    thread.start()
    answer = Channel(store, 0, timeout=timeout).agree("api/9")
    thread.join(60)
    assert other["used"] == 1
    assert len(timed_out) == (0 if own else 1), timed_out
    if own:
        assert (answer, other["answer"]) == (True, True)


# --------------------------------------------------------------------------- the worker's last rank in
def _job(store, rank, name="A"):
    torch.manual_seed(0)
    channel = Channel(store, rank)
    pending = compare.Pending(channel, compare.Stream(name), 1, name + "/0", None, torch.zeros(8), None)
    return worker.Job(pending, lambda *a: None, lambda *a: None)


@pytest.mark.parametrize("last", [True, False])
def test_the_worker_of_the_last_rank_in_votes_as_it_arrives(last):
    """The rank whose count completes the check votes "go" at once (no poll for a count after it); a rank
    before it leaves the check open. Twin: the rank before the last."""
    store = CountingStore()
    if last:
        store.add(comm.KEY_PREFIX + "A/0/arrived", worker.arrival(1, 2))  # the other rank came first
    arriving = worker.Worker()
    job = _job(store, 0)
    arriving._arrive(job)
    assert job.decision == ("go" if last else None)
    assert store.get(comm.KEY_PREFIX + "A/0/decision") == b"go" if last else _absent(store, "A/0/decision")


def _absent(store, key):
    """Whether ``key`` is not in ``store`` (a short wait for it times out: torch 1.x stores have no check)."""
    from datetime import timedelta

    try:
        store.wait([comm.KEY_PREFIX + key], timedelta(milliseconds=200))
    except Exception:
        return True
    return False


# --------------------------------------------------------------------------- the worker waits for a late rank
#: Seconds the other rank's worker gets the check after this one's, in the worker's test: at once, and late.
WORKER_LATE = (0.0, 1.0)
#: Store calls of the first rank's worker for one check when it blocks: count in, a round, the watch (a second
#: connection and its one wait), a round at STUCK, a round when the other rank's proposal comes, the exchange
#: and its keys deleted (17 here). The polling shape makes about 20 rounds of 2 calls per second of waiting.
WORKER_CALLS = 20


class CountingView(object):
    """One rank's view of a shared store, counting its calls (its second connection's too)."""

    def __init__(self, store, calls):
        self.store, self.calls = store, calls

    def __getattr__(self, name):
        method = getattr(self.store, name)

        def call(*args):
            self.calls[0] += 1
            result = method(*args)
            return CountingView(result, self.calls) if name == "clone" else result
        return call


def _worker_check_with_a_late_rank(late):
    """Each rank's worker (rank 1's ``late`` seconds after rank 0's) gets one check; (rank 0's store calls,
    each rank's report outcomes)."""
    from support.thread_ranks import ThreadChannel, ThreadWorld

    class StoreChannel(ThreadChannel):
        kind = "torch.distributed"

        def __init__(self, world, rank, store):
            super(StoreChannel, self).__init__(world, rank)
            self.store, self.timeout = store, 30

        def _store(self):
            return self.store

    shared, world = dist.HashStore(), ThreadWorld(2)
    calls = [[0], [0]]
    answered = [threading.Event(), threading.Event()]
    outcomes = {}
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    workers = [worker.Worker().start() for _ in range(2)]
    try:
        for rank in (0, 1):
            if rank:
                time.sleep(late)
            channel = StoreChannel(world, rank, CountingView(shared, calls[rank]))
            pending = compare.prepare(model, 1, compare.Stream("A"), channel=channel)

            def deliver(report, raise_at, rank=rank):
                outcomes[rank] = report.outcome
                answered[rank].set()

            def stand_down(exc, rank=rank):
                outcomes[rank] = str(exc)
                answered[rank].set()
            assert workers[rank].submit(worker.Job(pending, deliver, stand_down))
        assert all(event.wait(30) for event in answered)
    finally:
        for each in workers:
            each.stop(5)
    assert not any(each.thread.is_alive() or (each.watcher and each.watcher.is_alive()) for each in workers)
    return calls[0][0], outcomes


@WATCHABLE
@pytest.mark.parametrize("late", WORKER_LATE)
def test_the_worker_blocks_on_the_store_while_a_check_waits_for_a_late_rank(monkeypatch, late):
    """While its check waits for the other rank, the worker makes as many store calls (each a wake-up that takes
    the interpreter lock from the training thread) however long it waits: it blocks in one wait."""
    monkeypatch.setattr(comm, "blocking_wait_safe", lambda version=None: True)
    calls, outcomes = _worker_check_with_a_late_rank(late)
    assert outcomes == {0: "identical", 1: "identical"}
    assert calls <= WORKER_CALLS


@pytest.mark.parametrize("late", WORKER_LATE[1:])
def test_twin_a_polling_worker_makes_more_calls_the_longer_the_late_rank_takes(monkeypatch, late):
    monkeypatch.setattr(comm, "blocking_wait_safe", lambda version=None: False)  # a torch 1.x store: it polls
    calls, outcomes = _worker_check_with_a_late_rank(late)
    assert outcomes == {0: "identical", 1: "identical"}
    assert calls > WORKER_CALLS


@WATCHABLE
@pytest.mark.parametrize("written", [True, False])
def test_a_stopping_worker_writes_the_watched_slot_so_its_watcher_ends_without_a_timed_out_wait(monkeypatch, written):
    """A check no other rank reaches: the worker's watcher blocks on the next exchange's slot; stopping the worker
    writes that slot empty (a later proposal still takes it) and the watcher ends within the stop's bound, its
    wait never timing out. Twin: without that write the watcher is still blocked after the stop."""
    monkeypatch.setattr(comm, "blocking_wait_safe", lambda version=None: True)
    if not written:
        monkeypatch.setattr(worker.Worker, "_unwatch", lambda self: None)
    store = CountingStore()
    alone = worker.Worker().start()
    assert alone.submit(_job(store, 0, name="P"))
    deadline = time.monotonic() + 10
    while (alone.watcher is None or not alone.watcher.is_alive()) and time.monotonic() < deadline:
        time.sleep(0.01)
    watcher = alone.watcher
    assert watcher is not None and watcher.is_alive()
    alone.stop(5)
    assert not alone.thread.is_alive()
    slot = comm.KEY_PREFIX + "exchange/0"
    if written:
        assert not watcher.is_alive() and store.get(slot) == b""
        proposed = comm.KEY_PREFIX + "P/0"
        assert store.compare_set(slot, "", proposed) == proposed.encode()
    else:
        assert watcher.is_alive() and not store.check([slot])
        store.set(slot, "")  # let it go
        watcher.join(5)

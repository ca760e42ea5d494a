"""The check's worker thread is one a thread-leak guard accepts (Lightning's ``thread_police``,
pytest-threadleak): a daemon thread whose ``stop()`` answers or drops the checks handed over, says which, and
ends it; a later check starts a new one."""
import importlib
import threading
import time
import types

import pytest

torch = pytest.importorskip("torch", reason="the sync check's worker serves torch: no torch here")

from support import ranks  # noqa: E402
from support.thread_guard import zombies  # noqa: E402
from tpu_closure_fix.synccheck import comm, worker  # noqa: E402


def test_the_workers_thread_passes_a_thread_police_guard(monkeypatch):
    monkeypatch.setattr(worker, "_workers", {})
    before = list(threading.enumerate())
    running = worker.Worker().start()
    worker._workers["process"] = running
    assert zombies(before) == [] and not running.thread.is_alive()
    assert worker._workers == {}  # retired: the next check starts a new worker


def test_twin_a_plain_daemon_thread_fails_that_guard():
    before = list(threading.enumerate())
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="plain-daemon", daemon=True)
    thread.start()
    try:
        assert zombies(before) == ["plain-daemon"]
    finally:
        stop.set()
        thread.join(5)


@pytest.mark.skipif(
    not hasattr(importlib.import_module("torch.optim.optimizer"), "register_optimizer_step_post_hook"),
    reason="the zero-code SyncCheck needs torch >= 2.0 (its global step hooks); torch %s here" % torch.__version__)
def test_a_2_rank_ddp_job_under_a_thread_guard_passes_and_checks_on_after(tmp_path):
    runs = ranks.run_ranks("guarded", 2, tmp_path, env={"TPU_CLOSURE_FIX_SYNC_CHECK": "1"}, args=["--steps", "5"])
    ranks.assert_all_ok(runs)
    for run in runs:
        assert "tpu-closure-fix-synccheck" in " ".join(run.result["threads_started"]), run.result
        assert run.result["zombies"] == [], run.result
        assert run.result["last_outcome"] == "identical" and run.result["drained_after"]
        assert run.result["checks"] == 9  # steps 0 to 5, then 6 to 8 by a new worker


def test_a_worker_readied_for_the_process_group_serves_its_first_check(monkeypatch):
    """Started when the job made its process group (idle until the first check), the worker is the one the first
    check is handed to: no thread starts on the training thread then. One serving an earlier group is left to
    the first check (which releases it)."""
    monkeypatch.setattr(worker, "_workers", {})
    monkeypatch.setattr(worker, "_watch_sigterm", lambda: None)
    worker.ready("group-1")
    readied = worker._workers["process"]
    try:
        assert readied.thread.is_alive() and readied.group == "group-1" and readied.idle()
        worker.ready("group-1")
        worker.ready("group-2")
        assert worker._workers["process"] is readied
        handed = []
        monkeypatch.setattr(worker.Worker, "submit", lambda self, job: handed.append(self) or True)
        job = types.SimpleNamespace(pending=types.SimpleNamespace(channel=object()), group="group-1")
        assert worker.submit(job) and handed == [readied]
    finally:
        for each in list(worker._workers.values()) + [readied]:
            each.stop()


def test_twin_nothing_is_readied_without_a_group_or_after_a_worker_failed(monkeypatch):
    monkeypatch.setattr(worker, "_workers", {})
    worker.ready(None)
    assert worker._workers == {}
    monkeypatch.setitem(worker._state, "failed", "RuntimeError: planted")
    worker.ready("group-1")
    assert worker._workers == {}


# --------------------------------------------------------------------------- the check's group, made as it starts
class _Rendezvous(comm.DistributedChannel):
    """The process group's channel, its group's rendezvous recorded (by thread name) and held until ``release``
    is set; ``fails``: the rendezvous raises instead."""

    def __init__(self, release, fails=False):
        self.rank, self.size, self.timeout = 0, 2, 5
        self.release, self.fails, self.made = release, fails, []

    def ready_group(self):
        self.made.append(threading.current_thread().name)
        if self.fails:
            raise RuntimeError("planted: a peer never came")
        self.release.wait(30)


class _HostRendezvous(comm.HostChannel):
    """torch_xla's host channel (its replicas each have a worker of their own), its group's rendezvous recorded."""

    def __init__(self, release):
        self.rank, self.size, self.timeout, self.made = 0, 2, 5, []

    def ready_group(self):
        self.made.append(threading.current_thread().name)


def _started(monkeypatch, channel, group="group-1", current="group-1"):
    """A worker serving ``group`` started while the job's process group is ``current`` and ``comm.channel()``
    answers ``channel``; returned once its preparation ended."""
    monkeypatch.setattr(comm, "channel", lambda timeout=None: channel)
    monkeypatch.setattr(comm, "default_group_id", lambda: current)
    prepared = threading.Event()
    real = worker.Worker._prepare
    monkeypatch.setattr(worker.Worker, "_prepare", lambda self: (real(self), prepared.set()))
    running = worker.Worker(group).start()
    assert prepared.wait(10)
    return running


def _wait_for(condition, seconds=10):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_a_worker_serving_the_process_group_makes_the_checks_group_as_it_starts_and_goes_on_meanwhile(monkeypatch):
    """The rendezvous runs on a thread of its own: held there (a peer not started yet), the worker still takes the
    checks handed to it."""
    release = threading.Event()
    channel = _Rendezvous(release)
    running = _started(monkeypatch, channel)
    try:
        assert _wait_for(lambda: channel.made == [comm.WORKER_THREAD + "-group"]), channel.made
        arrived = []
        monkeypatch.setattr(worker.Worker, "_arrive", lambda self, job: arrived.append(job))
        monkeypatch.setattr(worker.Worker, "_step", lambda self: False)
        with running.wake:
            running.queue.append("a check")
            running.wake.notify()
        assert _wait_for(lambda: arrived == ["a check"]) and channel.made == [comm.WORKER_THREAD + "-group"]
    finally:
        release.set()
        running.stop()
    assert _wait_for(lambda: comm.WORKER_THREAD + "-group" not in [t.name for t in threading.enumerate()])


@pytest.mark.parametrize("group, current, kind", [(None, "group-1", "process group"),
                                                  ("group-1", "group-2", "process group"),
                                                  ("group-1", "group-1", "host"), ("group-1", "group-1", None)],
                         ids=["serving-no-group", "an-earlier-group", "host-channel", "world-of-one"])
def test_twin_no_group_is_made_for_a_worker_not_serving_the_current_process_group(monkeypatch, group, current,
                                                                                   kind):
    release = threading.Event()
    release.set()
    channel = {"process group": _Rendezvous(release), "host": _HostRendezvous(release), None: None}[kind]
    running = _started(monkeypatch, channel, group, current)
    try:
        assert getattr(channel, "made", []) == []
        assert comm.WORKER_THREAD + "-group" not in [t.name for t in threading.enumerate()]
    finally:
        running.stop()


def test_a_rendezvous_that_fails_is_left_to_the_first_exchange_and_the_worker_serves_on(monkeypatch):
    monkeypatch.setattr(worker, "_state", {"failed": None, "ending": False})
    channel = _Rendezvous(threading.Event(), fails=True)
    running = _started(monkeypatch, channel)
    try:
        assert _wait_for(lambda: channel.made and comm.WORKER_THREAD + "-group" not in
                         [t.name for t in threading.enumerate()])
        assert running.thread.is_alive() and not worker.failed()
    finally:
        running.stop()


def test_two_threads_asking_for_the_checks_group_at_once_make_it_once(monkeypatch):
    """The worker's first exchange may ask for the group while the thread making it as the worker started is still
    in the rendezvous: it waits for that one and uses it (a second group would take another prefix: no peer)."""
    made = []

    def gloo(prefix, rank, size, timeout):
        time.sleep(0.3)  # in the rendezvous: the second thread asks meanwhile
        made.append(prefix)
        return object()

    fake = types.SimpleNamespace(PrefixStore=lambda prefix, store: prefix, ProcessGroupGloo=gloo)

    class Channel(comm.DistributedChannel):
        def __init__(self):
            self.rank, self.size, self.timeout = 0, 2, 5

        def _store(self):
            return "store"

        def _c10d(self):
            return fake

        def _scope(self):
            return ("process group", 1)

    monkeypatch.setattr(comm, "_groups", {})
    monkeypatch.setattr(comm, "_made", {})
    found = []
    threads = [threading.Thread(target=lambda: found.append(Channel()._made_group("worker"))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert made == [comm.KEY_PREFIX + "group/worker/1"] and len(found) == 2 and found[0] is found[1]

"""The check's worker thread is one a thread-leak guard accepts (Lightning's ``thread_police``,
pytest-threadleak): a daemon thread whose ``stop()`` answers or drops the checks handed over, says which, and
ends it; a later check starts a new one."""
import importlib
import threading
import types

import pytest

torch = pytest.importorskip("torch", reason="the sync check's worker serves torch: no torch here")

from support import ranks  # noqa: E402
from support.thread_guard import zombies  # noqa: E402
from tpu_closure_fix.synccheck import worker  # noqa: E402


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

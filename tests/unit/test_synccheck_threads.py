"""The check's worker thread is one a thread-leak guard accepts (Lightning's ``thread_police``,
pytest-threadleak): a daemon thread whose ``stop()`` answers or drops the checks handed over, says which, and
ends it; a later check starts a new one."""
import importlib
import threading

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

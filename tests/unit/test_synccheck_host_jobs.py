"""The host channel shares the host with other programs: a job started as ``xmp.spawn`` starts one (a launcher
process, replica processes, no process group, the zero-code check armed; tests/support/xla_host_job.py) beside
another job on ``MASTER_PORT`` + 1, another job on the check's own port, a squatter on the port a channel names,
a foreign process writing the check's key names; and replicas handed no channel, or a channel of one host in a
world of two. Every job finishes (hard timeout) and each test asserts every process's exit code and what each
rank said: the check works, or each rank that waited says why; nothing said is false.
"""
import json
import os
import socket
import sys
import threading
import time

import pytest

pytest.importorskip("torch", reason="SyncCheck compares torch tensors: no torch here")

from support import features, ports  # noqa: E402
from support.ranks import REPO, TESTS  # noqa: E402
from tpu_closure_fix.verify.child import run_children  # noqa: E402

pytestmark = features.needs_step_hooks()  # the zero-code check

TIMEOUT = 240
STEPS = 9
#: Checks per replica: before the first update, step 1, then every 3 steps.
CHECKS = 2 + STEPS // 3
SECRET = "0123456789abcdef" * 2


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TPU_CLOSURE_FIX", "MASTER_")) or k == ports.BLOCK_VARIABLE}
    env.update(TPU_CLOSURE_FIX_SYNC_CHECK="3", TPU_CLOSURE_FIX_SYNC_CHECK_TIMEOUT="20", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([REPO, TESTS]))
    env.update(extra)
    return env


def _job(folder, scenario="same", extra=(), **env):
    """argv and environment of a checked job writing into ``folder``."""
    os.makedirs(str(folder), exist_ok=True)
    argv = [sys.executable, "-m", "support.xla_host_job", "launch", "--world", "2", "--scenario", scenario,
            "--steps", str(STEPS), "--out-dir", str(folder)] + list(extra)
    return argv, _env(**env)


def _ranks(folder, world=2):
    ranks = []
    for rank in range(world):
        path = os.path.join(str(folder), "rank-%d.json" % rank)
        with open(path) as handle:
            ranks.append(json.load(handle))
    return ranks


def _run(argv, env, timeout=TIMEOUT):
    run = run_children([argv], timeout, env=env, cwd=TESTS, marker=None)[0]
    assert not run.timed_out, run.stderr[-3000:]
    return run


def _in_background(argv, env):
    """Run a job on a thread; ``(thread, box)``: the ChildRun lands in ``box[0]``."""
    box = []
    thread = threading.Thread(target=lambda: box.append(_run(argv, env)))
    thread.start()
    return thread, box


def _ready(folder, thread):
    path = os.path.join(str(folder), "ready")
    deadline = time.monotonic() + TIMEOUT
    while not os.path.exists(path):
        assert thread.is_alive() and time.monotonic() < deadline, "the checked job never got to its hold"
        time.sleep(0.05)
    with open(path) as handle:
        return json.load(handle)["port"]


def _plain_job(folder, master_port, timeout=10):
    """A plain 2-rank gloo job on ``master_port`` (unarmed): its two ChildRuns and results."""
    os.makedirs(str(folder), exist_ok=True)
    env = {k: v for k, v in _env().items() if not k.startswith("TPU_CLOSURE_FIX_SYNC")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port))
    commands = [[sys.executable, "-m", "support.xla_host_job", "plain", "--rank", str(rank), "--world", "2",
                 "--out-dir", str(folder), "--timeout", str(timeout)] for rank in (0, 1)]
    runs = run_children(commands, TIMEOUT, env=env, cwd=TESTS, marker=None)
    assert not any(run.timed_out for run in runs)
    return runs, _ranks(folder)


def _checked(ranks, said=()):
    """Every replica trained every step, every check was answered, and each said exactly ``said``."""
    for rank in ranks:
        assert rank["error"] is None and rank["steps"] == STEPS and rank["drained"], rank
        assert rank["checks"] == CHECKS, rank
        assert len(rank["said"]) == len(said) and all(s in m for s, m in zip(said, rank["said"])), rank["said"]


DIVERGED = "between the start (identical before the first optimizer step) and step 1"


def _held_job(tmp_path, scenario="same", **env):
    hold = str(tmp_path / "go")
    argv, job_env = _job(tmp_path / "a", scenario, ["--hold", hold], **env)
    thread, box = _in_background(argv, job_env)
    return thread, box, hold


def _release(thread, box, hold):
    open(hold, "w").close()
    thread.join(TIMEOUT + 30)
    assert box, "the checked job did not finish"
    return box[0]


def test_a_job_on_master_port_plus_one_and_the_checked_job_both_finish(tmp_path):
    """The checked job's ``MASTER_PORT`` is P; a plain job on P + 1 meanwhile: both succeed, the check answers
    every check (the replicas differ: rank 0 warns once, the others log it; nothing else said)."""
    master = ports.free_ports(2)[0]
    thread, box, hold = _held_job(tmp_path, "different", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master))
    try:
        port = _ready(tmp_path / "a", thread)
        assert port not in (master, master + 1)
        runs, plain = _plain_job(tmp_path / "b", master + 1)
    finally:
        launcher = _release(thread, box, hold)
    assert [run.returncode for run in runs] == [0, 0] and all(r["ok"] for r in plain), plain
    assert launcher.returncode == 0, launcher.stderr[-3000:]
    ranks = _ranks(tmp_path / "a")
    _checked(ranks[:1], said=[DIVERGED])
    assert ranks[1]["said"] == [] and ranks[1]["checks"] == CHECKS and ranks[0]["made"] is True


def test_a_job_on_the_checks_own_port_fails_alone_and_the_check_works(tmp_path):
    """A plain job started on the check's own port: its rank 0 cannot listen there (in use), its rank 1
    reaches the check's store, finds none of its own keys and times out: that job fails, with those reasons,
    and the checked job answers every check with nothing said."""
    thread, box, hold = _held_job(tmp_path, "same")
    try:
        port = _ready(tmp_path / "a", thread)
        runs, plain = _plain_job(tmp_path / "b", port, timeout=8)
    finally:
        launcher = _release(thread, box, hold)
    assert [run.returncode for run in runs] == [1, 1], plain
    assert "address already in use" in plain[0]["error"].lower(), plain[0]
    assert plain[1]["error"] is not None, plain[1]
    assert launcher.returncode == 0, launcher.stderr[-3000:]
    _checked(_ranks(tmp_path / "a"))


def test_nothing_else_can_listen_on_the_checks_port_while_the_job_runs(tmp_path):
    """The port is bound before any replica starts, on loopback only: a squatter cannot take it."""
    thread, box, hold = _held_job(tmp_path, "same")
    try:
        port = _ready(tmp_path / "a", thread)
        for address in ("127.0.0.1", "0.0.0.0"):
            with socket.socket() as squatter:
                with pytest.raises(OSError):
                    squatter.bind((address, port))
                    squatter.listen(1)
    finally:
        launcher = _release(thread, box, hold)
    assert launcher.returncode == 0, launcher.stderr[-3000:]
    _checked(_ranks(tmp_path / "a"))


def test_a_foreign_writer_of_the_checks_key_names_changes_nothing(tmp_path):
    """A process that reaches the check's store and writes every key name the check uses (the exchange slots,
    the agreement's counts and votes, without the job's secret): the replicas still differ and are warned
    at the first difference, every check answered."""
    thread, box, hold = _held_job(tmp_path, "different")
    try:
        port = _ready(tmp_path / "a", thread)
        writer = [sys.executable, "-c", FOREIGN_WRITER, str(port)]
        run = _run(writer, _env(), timeout=60)
    finally:
        launcher = _release(thread, box, hold)
    assert run.returncode == 0, run.stderr[-3000:]
    assert launcher.returncode == 0, launcher.stderr[-3000:]
    ranks = _ranks(tmp_path / "a")
    _checked(ranks[:1], said=[DIVERGED])
    assert ranks[1]["said"] == [] and ranks[1]["checks"] == CHECKS


FOREIGN_WRITER = """
import sys
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), None, False, timedelta(seconds=10), wait_for_workers=False)
prefix = "tpu_closure_fix/synccheck/"
for n in range(64):
    store.set(prefix + "exchange/%d" % n, "nonsense-%d" % n)
for key in ("arrived", "decision", "ranks"):
    store.set(prefix + key, "abort")
store.set(prefix + "made", "1")
print("written")
"""


@pytest.mark.parametrize("squatter", ["socket", "store"])
def test_a_squatter_on_the_port_a_users_channel_names_is_said_by_every_rank(tmp_path, squatter):
    """The user's channel (``HOST:PORT:SECRET``: process 0 makes the store) names a port another program holds:
    a listening socket that never answers, or another job's TCPStore. Process 0 says it cannot listen there;
    process 1 says the program there does not answer as a store, or the store is not the job's; both train on and
    exit 0."""
    from datetime import timedelta

    import torch.distributed as dist

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(8)
    port = holder.getsockname()[1]
    foreign = None
    if squatter == "store":
        foreign = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=30), wait_for_workers=False,
                                master_listen_fd=holder.fileno(), use_libuv=True)
        holder.detach()
    try:
        argv, env = _job(tmp_path / "a", "same", TPU_CLOSURE_FIX_SYNC_CHECK_TIMEOUT="5",
                         TPU_CLOSURE_FIX_SYNC_CHECK_CHANNEL="127.0.0.1:%d:%s" % (port, SECRET))
        launcher = _run(argv, env)
    finally:
        if foreign is None:
            holder.close()
        del foreign
    assert launcher.returncode == 0, launcher.stderr[-3000:]
    ranks = _ranks(tmp_path / "a")
    for rank in ranks:
        assert rank["error"] is None and rank["steps"] == STEPS and rank["made"] is False, rank
        assert len(rank["said"]) == 1 and "stands down" in rank["said"][0], rank["said"]
    assert "could not listen at 127.0.0.1:%d" % port in ranks[0]["said"][0], ranks[0]["said"]
    other = ranks[1]["said"][0]
    if squatter == "store":
        assert "the store at 127.0.0.1:%d is not this job's" % port in other, other
    else:
        assert "the program at 127.0.0.1:%d accepts connections but does not answer as a store" % port in other, other


def test_replicas_handed_no_channel_each_say_why_and_train_on(tmp_path):
    """Replicas started without the launcher's hand-over (a job started another way): no port is guessed;
    each rank says why its check stands down, and trains on."""
    argv, env = _job(tmp_path / "a", "different", ["--direct"])
    launcher = _run(argv, env)
    assert launcher.returncode == 0, launcher.stderr[-3000:]
    for rank in _ranks(tmp_path / "a"):
        assert rank["error"] is None and rank["steps"] == STEPS and rank["port"] is None, rank
        assert len(rank["said"]) == 1 and "no channel was handed to this replica" in rank["said"][0], rank["said"]


def test_a_channel_of_one_host_in_a_world_of_two_hosts_is_said_by_every_rank(tmp_path):
    """The launcher's channel reaches its own host only: replicas whose world spans two hosts stand down
    saying so (never a false "rank did not reach it" after a wait)."""
    argv, env = _job(tmp_path / "a", "same", ["--hosts", "2"])
    launcher = _run(argv, env)
    assert launcher.returncode == 0, launcher.stderr[-3000:]
    for rank in _ranks(tmp_path / "a"):
        assert rank["error"] is None and rank["steps"] == STEPS and rank["made"] is True, rank
        assert len(rank["said"]) == 1 and "this job's replicas span hosts" in rank["said"][0], rank["said"]

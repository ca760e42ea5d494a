"""The host channel of the check on torch_xla without a process group, as rules: which channel, which port,
which host, one worker and one stream count per replica (replicas may be threads of one process), one
device-to-host transfer per check, and a store that cannot be opened said once, naming where and what to set.

Fast: no process, no torch_xla (its runtime is a namespace answering as torch_xla's documented functions do);
the real TCPStore + gloo exchange between replica threads is tests/unit/test_synccheck_host_threads.py.
"""
import os
import socket
import sys
import threading
import types

import pytest

torch = pytest.importorskip("torch", reason="SyncCheck compares torch tensors: no torch here")

import torch.distributed  # noqa: E402,F401  (the real one: no process group in this process)

from tpu_closure_fix import settings  # noqa: E402
from tpu_closure_fix.synccheck import comm, compare, worker  # noqa: E402
from tpu_closure_fix.synccheck import hook as synchook  # noqa: E402


def _xla(monkeypatch, size, ordinal=lambda: 0, process_index=0, device_type="CPU", dist=None):
    """torch_xla imported in this process (world ``size``), and ``torch.distributed`` as ``dist`` (None: the
    real one, with no process group)."""
    if dist is not None:
        monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    monkeypatch.setitem(sys.modules, "torch_xla.core.xla_model", types.SimpleNamespace(get_ordinal=ordinal))
    monkeypatch.setitem(sys.modules, "torch_xla.runtime", types.SimpleNamespace(
        world_size=lambda: size, global_ordinal=ordinal, process_index=lambda: process_index,
        device_type=lambda: device_type))


def _process_group(size):
    return types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True,
                                 get_world_size=lambda: size, get_rank=lambda: 1)


# --------------------------------------------------------------------------- which channel
def test_a_process_group_is_the_channel_even_on_xla(monkeypatch):
    _xla(monkeypatch, 2, dist=_process_group(2))
    assert type(comm.channel(timeout=5)) is comm.DistributedChannel


def test_xla_replicas_without_a_process_group_get_the_host_channel(monkeypatch):
    _xla(monkeypatch, 4, ordinal=lambda: 3, process_index=1, device_type="TPU")
    channel = comm.channel(timeout=5)
    assert type(channel) is comm.HostChannel and channel.kind == "xla host"
    assert (channel.rank, channel.size, channel.timeout, channel.server, channel.device_type) == (3, 4, 5, False,
                                                                                                  "TPU")
    assert channel.worker_scope == ("xla replica", 3)


@pytest.mark.parametrize("group_size,thread_local,xla_size,kind", [
    (2, False, 1, "torch.distributed"),
    (2, False, 4, "torch.distributed"),  # a process group on XLA: the job's store, a worker per process
    (2, True, 4, "xla host"),  # per-thread groups (TPU v2/v3): the worker thread sees none of them
    (0, False, 4, "xla host"),
    (1, False, 4, "xla host"),
    (2, True, 1, None),
    (1, False, 1, None),
    (0, False, 1, None),
])
def test_the_channel_rule(group_size, thread_local, xla_size, kind):
    assert comm.choose(group_size, thread_local, xla_size) == kind


def test_torchs_thread_local_process_groups_are_recognised(monkeypatch):
    """torch_xla installs torch's threaded process groups on TPU v2/v3 (each replica thread its own default
    group): the real ``ThreadLocalWorld`` is recognised; its twin, torch's own world, is not."""
    import torch.distributed.distributed_c10d as c10d

    multi_threaded_pg = pytest.importorskip("torch.testing._internal.distributed.multi_threaded_pg",
                                            reason="torch's threaded process groups came with torch 2.0")

    assert comm.thread_local_groups() is False
    monkeypatch.setattr(c10d, "_world", multi_threaded_pg.ThreadLocalWorld())
    assert comm.thread_local_groups() is True


def test_under_thread_local_process_groups_each_replica_thread_is_its_ordinal(monkeypatch):
    import torch.distributed.distributed_c10d as c10d

    multi_threaded_pg = pytest.importorskip("torch.testing._internal.distributed.multi_threaded_pg",
                                            reason="torch's threaded process groups came with torch 2.0")

    _xla(monkeypatch, 2, ordinal=lambda: 1)
    monkeypatch.setattr(comm, "_process_group_initialized", lambda: True)
    assert comm.replica_index() == 0  # a process group of the process: one replica per process
    monkeypatch.setattr(c10d, "_world", multi_threaded_pg.ThreadLocalWorld())
    assert comm.replica_index() == 1


def test_the_store_server_is_in_process_zero(monkeypatch):
    _xla(monkeypatch, 2, process_index=0)
    assert comm.channel().server is True


@pytest.mark.parametrize("dist", [None, _process_group(1)], ids=["no-process-group", "process-group-of-one"])
def test_one_xla_device_has_no_channel(monkeypatch, dist):
    _xla(monkeypatch, 1, dist=dist)
    assert comm.channel() is None


def test_the_rank_is_the_ordinal_of_the_calling_thread(monkeypatch):
    """Replicas that are threads of one process: torch_xla's global ordinal is per thread."""
    local = threading.local()
    _xla(monkeypatch, 2, ordinal=lambda: local.ordinal)
    ranks = {}

    def replica(ordinal):
        local.ordinal = ordinal
        ranks[ordinal] = comm.channel().rank

    threads = [threading.Thread(target=replica, args=(o,)) for o in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert ranks == {0: 0, 1: 1}


# --------------------------------------------------------------------------- which port, which host
@pytest.mark.parametrize("raw, master, port", [
    (None, None, 12356),  # torch_xla's xla:// default 12355, plus one
    ("", "", 12356),
    (None, "29500", 29501),  # MASTER_PORT + 1
    ("23456", "29500", 23456),  # the variable wins
    (" 40000 ", None, 40000),
    (None, "65535", 12356),  # no port after it: the default's
    (None, "nonsense", 12356),
], ids=["default", "empty", "master-port-plus-one", "variable", "spaces", "master-port-last", "master-port-bad"])
def test_the_port_rule(raw, master, port):
    assert comm.parse_port(raw, master) == (port, None)


@pytest.mark.parametrize("raw", ["0", "65536", "12a", "-1", "1e4", "\u0661\u0662"])
def test_a_bad_port_is_said_with_the_accepted_values(raw):
    port, problem = comm.parse_port(raw, "29500")
    assert port == 29501
    flat = " ".join(problem.split())
    assert flat.startswith("%s=" % comm.PORT_VAR) and "accepted: a TCP port number 1-65535" in flat
    assert "Using 29501." in flat and "`unset %s` (port 29501)" % comm.PORT_VAR in flat


def test_a_bad_port_is_warned_once_when_armed(monkeypatch):
    from support.said import fresh, spoken

    fresh()
    monkeypatch.setattr(settings, "_said", set())
    monkeypatch.setattr(synchook, "arm", lambda *args: None)
    environ = {"TPU_CLOSURE_FIX_SYNC_CHECK": "3", comm.PORT_VAR: "http"}
    with spoken() as seen:
        synchook.arm_from_environment(environ)
        comm.store_port(environ)  # the store made later says nothing again
    said = [w.message for w in seen]
    assert len(said) == 1 and comm.PORT_VAR in said[0] and "12356" in said[0]


@pytest.mark.parametrize("environ, device, host", [
    ({"MASTER_ADDR": "10.0.0.7"}, "TPU", "10.0.0.7"),  # the variable first, as xla://
    ({}, "TPU", "10.1.2.3"),  # on a TPU: worker 0's address
    ({}, "CPU", "127.0.0.1"),
    ({"MASTER_ADDR": "  "}, None, "127.0.0.1"),
], ids=["master-addr", "tpu-worker-0", "cpu-localhost", "blank-master-addr"])
def test_the_host_rule(environ, device, host):
    assert comm.store_host(environ, device, discover=lambda: "10.1.2.3") == host


# --------------------------------------------------------------------------- per replica
@pytest.mark.parametrize("dist, replica", [(None, 1), (_process_group(2), 0)],
                         ids=["no-process-group", "process-group"])
def test_the_replica_of_a_thread_is_its_ordinal_unless_a_process_group_makes_each_process_one(monkeypatch, dist,
                                                                                             replica):
    _xla(monkeypatch, 2, ordinal=lambda: 1, dist=dist)
    assert comm.replica_index() == replica


def test_two_replica_threads_name_their_optimizers_alike(monkeypatch):
    """Each replica counts the optimizers it names: replica threads of one process give their first
    optimizer the same name, as replica processes would, and each its second one the next."""
    local = threading.local()
    _xla(monkeypatch, 2, ordinal=lambda: local.ordinal)
    monkeypatch.setattr(synchook, "_digests", {})
    names = {}

    def replica(ordinal):
        local.ordinal = ordinal
        names[ordinal] = [synchook._stream_key(torch.optim.SGD([torch.nn.Parameter(torch.ones(3))], lr=0.1))
                          for _ in range(2)]

    for ordinal in (0, 1):  # one after the other: the counts must not add up across replicas
        thread = threading.Thread(target=replica, args=(ordinal,))
        thread.start()
        thread.join(120)  # a loaded machine: the first name imports what it reads
    assert names[0] == names[1] and names[0][0].endswith("-1") and names[0][1].endswith("-2")


class _Recorded(object):
    """A worker that records what it is given (never started as a thread)."""

    def __init__(self, group=None):
        self.group, self.jobs, self.pid, self.stopping = group, [], os.getpid(), False
        self.thread = types.SimpleNamespace(is_alive=lambda: False)

    def start(self):
        return self

    def submit(self, job):
        self.jobs.append(job)
        return True


def _job(channel):
    return types.SimpleNamespace(pending=types.SimpleNamespace(channel=channel), group=None)


def test_one_worker_per_replica_and_one_per_process_group(monkeypatch):
    monkeypatch.setattr(worker, "Worker", _Recorded)
    monkeypatch.setattr(worker, "_workers", {})
    monkeypatch.setattr(worker, "_watch_destroy", lambda: None)
    monkeypatch.setitem(worker._state, "failed", None)
    replicas = [types.SimpleNamespace(worker_scope=("xla replica", r)) for r in (0, 1, 0)]
    grouped = [types.SimpleNamespace(worker_scope="process") for _ in range(2)]
    for channel in replicas + grouped:
        assert worker.submit(_job(channel))
    assert sorted(map(str, worker._workers)) == ["('xla replica', 0)", "('xla replica', 1)", "process"]
    assert [len(worker._workers[k].jobs) for k in (("xla replica", 0), ("xla replica", 1), "process")] == [2, 1, 2]


# --------------------------------------------------------------------------- one transfer
def test_the_details_reach_the_host_exactly_in_one_piece():
    """Hashes of every 32-bit value (negative ones too) and the sums come back exact from one transfer."""
    vector = torch.arange(7, dtype=torch.float32)
    hashes = torch.tensor([0, 1, -1, -2147483648, 2147483647, 65536, -65537], dtype=torch.int32)
    stats = torch.randn(7, 3)
    host, details = compare._to_host(vector, {"hashes": hashes, "stats": stats})
    assert torch.equal(host, vector)
    assert details["hashes"].tolist() == [h & 0xFFFFFFFF for h in hashes.tolist()]
    assert torch.equal(details["stats"], stats)


def test_the_host_transfer_is_one_copy(monkeypatch):
    copies = []
    original = torch.Tensor.to

    def counted(self, *args, **kwargs):
        if args and args[0] == "cpu":
            copies.append(self.numel())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", counted)
    compare._to_host(torch.zeros(5), {"hashes": torch.zeros(2, dtype=torch.int32), "stats": torch.zeros(2, 3)})
    assert copies == [5 + 2 * 2 + 2 * 3]


# --------------------------------------------------------------------------- a store that cannot be opened
def test_a_port_in_use_stands_the_check_down_once_naming_where_and_what_to_set(monkeypatch):
    monkeypatch.setattr(comm, "_host", {"server": None, "clients": {}, "failed": None})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        monkeypatch.setenv(comm.PORT_VAR, str(port))
        settings.reload()
        monkeypatch.delenv("MASTER_ADDR", raising=False)
        with pytest.raises(comm.StoodDown) as first:
            comm.host_store(True, "CPU", timeout=5)
        with pytest.raises(comm.StoodDown) as again:
            comm.host_store(True, "CPU", timeout=5)
    assert first.value.broken and again.value is first.value  # not tried again: one message
    message = str(first.value)
    assert "127.0.0.1:%d" % port in message and "set %s to a free port" % comm.PORT_VAR in message


def test_each_replica_of_a_process_has_its_own_group_over_the_same_prefix(monkeypatch):
    """Replica threads of one process: one gloo group per rank, built over the same store prefix on every rank
    (a count shared by the process would give the second rank another prefix: no rendezvous)."""
    made = []
    fake = types.SimpleNamespace(PrefixStore=lambda prefix, store: prefix,
                                 ProcessGroupGloo=lambda prefix, rank, size, timeout: made.append((prefix, rank))
                                 or object())

    class Channel(comm.HostChannel):
        def __init__(self, rank):
            self.rank, self.size, self.timeout = rank, 2, 5

        def _store(self):
            return "store"

        def _c10d(self):
            return fake

    monkeypatch.setattr(comm, "_groups", {})
    monkeypatch.setattr(comm, "_made", {})
    groups = [Channel(rank)._group() for rank in (0, 1, 0, 1)]
    assert made == [("tpu_closure_fix/synccheck/group/call/1", 0), ("tpu_closure_fix/synccheck/group/call/1", 1)]
    assert groups[0] is groups[2] and groups[1] is groups[3] and groups[0] is not groups[1]


def test_the_slot_fields_survive_another_replica_thread_clearing_their_cache(monkeypatch):
    """Replica threads of one process fingerprint at once: a clear of the shared cache right after this thread
    filled it must not cost this thread its fields."""
    from tpu_closure_fix.synccheck import fingerprint

    class ClearedAtOnce(dict):
        def __setitem__(self, key, value):
            super().__setitem__(key, value)
            self.clear()  # the other thread's check, between this thread's fill and its read

    monkeypatch.setattr(fingerprint, "_slot_cache", ClearedAtOnce())
    held = ((0, 1) + fingerprint.describe(torch.zeros(2)),)
    fields, present = fingerprint._slot_fields(held, 4)
    assert present.tolist() == [False, True, False, False] and fields.numel() == 5 * 4


def test_a_store_not_there_is_said_with_its_causes_and_the_variables(monkeypatch):
    """A process other than process 0 that finds no store within the timeout: its two causes (process 0 not at
    its first check yet, or another host) and the variables naming host and port; its twin, the server side,
    names the free port to set."""
    from support import ports

    monkeypatch.setattr(comm, "_host", {"server": None, "clients": {}, "failed": None})
    port = ports.free_port()
    monkeypatch.setenv(comm.PORT_VAR, str(port))
    settings.reload()
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(comm.StoodDown) as missing:
        comm.host_store(False, "CPU", timeout=1)
    message = str(missing.value)
    assert "its store at 127.0.0.1:%d could not be reached" % port in message, message
    assert "not there within 1s" in message and "MASTER_ADDR" in message and comm.PORT_VAR in message, message
    assert "set %s to a free port" % comm.PORT_VAR not in message


def test_a_reason_quotes_one_short_line():
    assert comm._short("Connection closed by peer " + "x" * 200 + "\nmore") == \
        ("Connection closed by peer " + "x" * 200)[:77] + "..."
    assert comm._short("short\nsecond") == "short" and comm._short("") == ""
    assert comm._short("[/a/pair.cc:553] Connection closed by peer [127.0.0.1]:1. This is typically caused") == \
        "Connection closed by peer [127.0.0.1]:1"

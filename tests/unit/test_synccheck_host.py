"""The host channel of the check on torch_xla without a process group, as rules: which channel, the channel
handed over (its value, its store on loopback under the job's secret, no port guessed), one worker and one
stream count per replica (replicas may be threads of one process), one device-to-host transfer per check, and
a store that cannot be opened said once, naming where and what to set. Other programs on the host:
tests/unit/test_synccheck_host_jobs.py.

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

from datetime import timedelta  # noqa: E402

import torch.distributed as dist  # noqa: E402

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


# --------------------------------------------------------------------------- which channel, which store
SECRET = "0123456789abcdef" * 2


@pytest.mark.parametrize("raw, channel", [
    (None, None),  # nothing handed over
    ("", None),
    ("127.0.0.1:41234:%s:made" % SECRET, ("127.0.0.1", 41234, SECRET, True)),  # the launcher's
    ("10.0.0.7:29600:%s" % SECRET, ("10.0.0.7", 29600, SECRET, False)),  # the user's: process 0 makes it
    (" host-0:29600:%s " % SECRET.upper(), ("host-0", 29600, SECRET.upper(), False)),
    ("[fe80::1]:29600:%s" % SECRET, ("fe80::1", 29600, SECRET, False)),
    ("fe80::1:29600:%s:made" % SECRET, ("fe80::1", 29600, SECRET, True)),
], ids=["unset", "empty", "launcher", "user", "spaces-upper", "ipv6-brackets", "ipv6-made"])
def test_the_channel_rule(raw, channel):
    assert comm.parse_channel(raw) == (None if channel is None else comm.Channel(*channel), None)


@pytest.mark.parametrize("raw", ["29600", "host:29600", "host:0:%s" % SECRET, "host:65536:%s" % SECRET,
                                 ":29600:%s" % SECRET, "host:29600:%s" % SECRET[:31], "host:29600:%sxy" % SECRET,
                                 "host:\u0661\u0662:%s" % SECRET])
def test_a_bad_channel_is_said_with_the_accepted_values(raw):
    channel, problem = comm.parse_channel(raw)
    assert channel is None
    flat = " ".join(problem.split())
    assert flat.startswith("%s=" % comm.CHANNEL_VAR) and "accepted: HOST:PORT:SECRET, the same on every host" in flat
    assert "The sync check stands down" in flat and "secrets.token_hex(16)" in flat and "process 0's host" in flat


def test_a_bad_channel_is_warned_once_when_armed(monkeypatch):
    from support.said import fresh, spoken

    fresh()
    monkeypatch.setattr(settings, "_said", set())
    monkeypatch.setattr(synchook, "arm", lambda *args: None)
    environ = {"TPU_CLOSURE_FIX_SYNC_CHECK": "3", comm.CHANNEL_VAR: "http"}
    with spoken() as seen:
        synchook.arm_from_environment(environ)
        assert comm.handed_channel(environ) is None  # the store reached later says nothing again
    said = [w.message for w in seen]
    assert len(said) == 1 and comm.CHANNEL_VAR in said[0], said


def test_a_channel_set_after_the_settings_were_read_is_found_where_the_store_is_reached(monkeypatch):
    """The launcher sets the variable in its own process after the settings were read, for replicas that may be
    its threads: the channel is read by the settings' row when the store is reached. Twin: the settings kept at
    activation do not hold it, so a reader of those would find no channel."""
    monkeypatch.delenv(comm.CHANNEL_VAR, raising=False)
    settings.reload()
    monkeypatch.setenv(comm.CHANNEL_VAR, "127.0.0.1:41234:%s:made" % SECRET)
    assert comm.handed_channel() == comm.Channel("127.0.0.1", 41234, SECRET, True)
    assert settings.current().get(comm.CHANNEL_VAR) is None


def test_a_bad_channel_read_at_each_store_is_said_once_through_the_settings(monkeypatch):
    from support.said import fresh, spoken

    fresh()
    monkeypatch.setenv(comm.CHANNEL_VAR, "http")
    with spoken() as seen:
        assert comm.handed_channel() is None and comm.handed_channel() is None
    assert len(seen) == 1 and (comm.CHANNEL_VAR, "http") in settings._said, seen


@pytest.mark.parametrize("local, size, processes, answer", [
    (4, 4, 2, True), (2, 4, 2, False), (None, 4, 1, True), (None, 4, 2, False)],
    ids=["one-host", "two-hosts", "no-count-one-process", "no-count-two-processes"])
def test_the_world_is_local_when_this_hosts_devices_are_all_of_it(monkeypatch, local, size, processes, answer):
    runtime = types.SimpleNamespace(world_size=lambda: size, process_count=lambda: processes)
    if local is not None:
        runtime.local_device_count = lambda: local
    monkeypatch.setitem(sys.modules, "torch_xla.runtime", runtime)
    assert comm.world_is_local() is answer


def _fresh_host(monkeypatch, channel=None):
    monkeypatch.setattr(comm, "_host", {"server": None, "clients": {}, "failed": None})
    monkeypatch.setattr(settings, "_said", set())
    if channel is None:
        monkeypatch.delenv(comm.CHANNEL_VAR, raising=False)
    else:
        monkeypatch.setenv(comm.CHANNEL_VAR, channel)


def test_no_channel_handed_over_stands_down_naming_the_variable_and_guesses_no_port(monkeypatch):
    _fresh_host(monkeypatch)
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(comm.StoodDown) as first:
        comm.host_store(True, "CPU", timeout=5)
    with pytest.raises(comm.StoodDown) as again:
        comm.host_store(False, "CPU", timeout=5, rank=1)
    assert first.value.broken and again.value is first.value
    assert "no channel was handed to this replica (%s is unset)" % comm.CHANNEL_VAR in str(first.value)
    assert comm._host["server"] is None


def test_a_launchers_channel_in_a_world_of_two_hosts_stands_down(monkeypatch):
    _fresh_host(monkeypatch, "127.0.0.1:1:%s:made" % SECRET)
    _xla(monkeypatch, 4, process_index=0)
    sys.modules["torch_xla.runtime"].local_device_count = lambda: 2
    with pytest.raises(comm.StoodDown) as down:
        comm.host_store(True, "CPU", timeout=5)
    assert "this job's replicas span hosts" in str(down.value) and comm._host["server"] is None


def test_the_launchers_store_listens_on_loopback_only_and_keys_carry_the_secret(monkeypatch):
    """The hand-over: a store on 127.0.0.1 at a port the kernel picked, its channel in the children's
    environment while they run, gone after; a replica's keys land under the secret only."""
    from tpu_closure_fix.synccheck import launch

    _fresh_host(monkeypatch)
    _xla(monkeypatch, 2)
    environ = {}
    with launch.handing_over(environ) as value:
        channel, _ = comm.parse_channel(value)
        assert environ[comm.CHANNEL_VAR] == value and channel.made and channel.host == "127.0.0.1"
        listening = _listening(channel.port)
        monkeypatch.setenv(comm.CHANNEL_VAR, value)
        store = comm.host_store(False, "CPU", timeout=5)
        store.set("tpu_closure_fix/synccheck/x", "1")
        import torch.distributed as dist
        from datetime import timedelta

        foreign = dist.TCPStore("127.0.0.1", channel.port, None, False, timedelta(seconds=5), wait_for_workers=False)
        assert not _holds(foreign, "tpu_closure_fix/synccheck/x")
        assert _holds(foreign, channel.secret + "/tpu_closure_fix/synccheck/x")
    assert comm.CHANNEL_VAR not in environ
    if listening is not None and comm._takes_a_socket(dist):
        assert listening == ["0100007F"], listening  # 127.0.0.1, never every interface
    elif listening is not None:  # torch before 2.1 binds the store itself: every interface (the exposure stated)
        assert listening in (["00000000"], ["00000000000000000000000000000000"]), listening


def _holds(store, key):
    """Whether ``store`` holds ``key`` (a short wait: torch 2.1 and before have no ``check``)."""
    from datetime import timedelta

    try:
        store.wait([key], timedelta(milliseconds=300))
    except Exception:
        return False
    return True


@pytest.mark.parametrize("takes_a_socket", [True, False])
def test_the_store_is_made_with_the_mark_on_a_torch_that_binds_it_itself(monkeypatch, takes_a_socket):
    """torch before 2.1 cannot be handed a socket: the store binds a port the kernel picks and still holds the
    mark under the secret, which a joining replica finds (by a bounded wait where the store has no ``check``).
    Twin: the socket handed over, as on today's torch."""
    if takes_a_socket and not comm._takes_a_socket(dist):
        pytest.skip("this torch's TCPStore takes no socket (master_listen_fd): the other case is its path")
    monkeypatch.setattr(comm, "_takes_a_socket", lambda _dist: takes_a_socket)
    store = comm.make_store("127.0.0.1", 0, "s3cret", 5)
    assert store.port > 0
    client = dist.PrefixStore("s3cret", dist.TCPStore("127.0.0.1", store.port, None, False, timedelta(seconds=5),
                                                      wait_for_workers=False))
    assert comm._has_mark(client, 2) and comm._has_mark(_WithoutCheck(client), 2)
    other = dist.PrefixStore("other", client)
    assert not comm._has_mark(_WithoutCheck(other), 0.3) and not comm._has_mark(other, 0.3)


class _WithoutCheck(object):
    """A store as torch 2.1 and before have it: no ``check``."""

    def __init__(self, store):
        self._store = store

    def wait(self, keys, timeout):
        return self._store.wait(keys, timeout)


def _listening(port):
    """The local addresses (hex, as /proc/net/tcp writes them) listening on ``port``; None where unreadable."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            return None
        for row in rows:
            fields = row.split()
            address, hex_port = fields[1].split(":")
            if int(hex_port, 16) == port and fields[3] == "0A":
                found.append(address)
    return found


def test_a_channel_already_set_stands_and_no_store_is_made(monkeypatch):
    from tpu_closure_fix.synccheck import launch

    environ = {comm.CHANNEL_VAR: "10.0.0.7:29600:%s" % SECRET}
    with launch.handing_over(environ) as value:
        assert value is None and environ[comm.CHANNEL_VAR] == "10.0.0.7:29600:%s" % SECRET
    assert environ[comm.CHANNEL_VAR] == "10.0.0.7:29600:%s" % SECRET


def _starters_wrapped(times):
    """A stand-in for torch_xla's pjrt module whose starters are wrapped ``times`` times (as a second import
    hook, or a reload, would): how many wrappers stand between each starter and the original."""
    import types

    import wrapt

    from tpu_closure_fix.synccheck import launch

    module = types.ModuleType("pjrt_standin")
    module.run_multiprocess = lambda fn, *args: fn(*args)
    module.spawn_threads = lambda fn, *args: fn(*args)
    for _ in range(times):
        launch._wrap_starters(module)
    depth = {}
    for name in launch.STARTERS:
        starter, depth[name] = getattr(module, name), 0
        while isinstance(starter, wrapt.FunctionWrapper):
            starter, depth[name] = starter.__wrapped__, depth[name] + 1
    return depth


def test_the_starters_are_wrapped_once_however_often_their_module_is_seen():
    assert _starters_wrapped(3) == {"run_multiprocess": 1, "spawn_threads": 1}


def test_twin_never_seen_the_starters_are_the_originals():
    assert _starters_wrapped(0) == {"run_multiprocess": 0, "spawn_threads": 0}


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

    def __init__(self, group=None, may_yield=True):
        self.group, self.jobs, self.pid, self.stopping = group, [], os.getpid(), False
        self.may_yield = may_yield
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
    # replica threads' workers never switch their scheduling: their groups' threads cannot be told apart
    assert [worker._workers[k].may_yield for k in (("xla replica", 0), ("xla replica", 1), "process")] == [
        False, False, True]


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
def test_a_users_channel_on_a_port_in_use_stands_the_check_down_once_naming_where_and_what_to_set(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        _fresh_host(monkeypatch, "127.0.0.1:%d:%s" % (port, SECRET))
        with pytest.raises(comm.StoodDown) as first:
            comm.host_store(True, "CPU", timeout=5)
        with pytest.raises(comm.StoodDown) as again:
            comm.host_store(True, "CPU", timeout=5)
    assert first.value.broken and again.value is first.value  # not tried again: one message
    message = str(first.value)
    assert "could not listen at 127.0.0.1:%d" % port in message and "set %s to a free port" % comm.CHANNEL_VAR \
        in message


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


def test_a_store_not_there_is_said_with_its_cause_and_the_variable(monkeypatch):
    """A process other than process 0 that finds no store within the timeout at the user's channel: why (process
    0 makes it at its first check, where the variable says); its twin, the server side, names the free port."""
    from support import ports

    port = ports.free_port()
    _fresh_host(monkeypatch, "127.0.0.1:%d:%s" % (port, SECRET))
    with pytest.raises(comm.StoodDown) as missing:
        comm.host_store(False, "CPU", timeout=1)
    message = str(missing.value)
    assert "its store at 127.0.0.1:%d could not be reached within 1s" % port in message, message
    assert "process 0 makes it at its first check" in message and comm.CHANNEL_VAR in message, message
    assert "set %s to a free port" % comm.CHANNEL_VAR not in message


def _slow_client(release):
    """A connect that has not answered when the bound passes (as torch's client retrying a refused port on a
    loaded host): it waits until ``release`` is set."""
    def connect():
        release.wait(10)
        raise OSError("gave up")

    return connect


def test_a_bound_passed_with_nothing_listening_is_said_as_unreached_not_as_another_program(monkeypatch):
    from support import ports

    port, release = ports.free_port(), threading.Event()
    _fresh_host(monkeypatch, "127.0.0.1:%d:%s" % (port, SECRET))
    monkeypatch.setattr(comm, "_bounded", lambda connect, seconds, found, real=comm._bounded: real(
        _slow_client(release), 0.2, found))
    try:
        with pytest.raises(comm.StoodDown) as missing:
            comm.host_store(False, "CPU", timeout=1)
    finally:
        release.set()
    message = str(missing.value)
    assert "its store at 127.0.0.1:%d could not be reached" % port in message, message
    assert "accepts connections" not in message and "another program" not in message, message


def test_twin_a_bound_passed_with_a_program_listening_names_that_program(monkeypatch):
    release = threading.Event()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(4)
        port = squatter.getsockname()[1]
        found = comm.Channel("127.0.0.1", port, SECRET, False)
        try:
            with pytest.raises(comm.StoodDown) as named:
                comm._bounded(_slow_client(release), 0.2, found)
        finally:
            release.set()
    assert "the program at 127.0.0.1:%d accepts connections but does not answer" % port in str(named.value)


def test_a_reason_quotes_one_short_line():
    assert comm._short("Connection closed by peer " + "x" * 200 + "\nmore") == \
        ("Connection closed by peer " + "x" * 200)[:77] + "..."
    assert comm._short("short\nsecond") == "short" and comm._short("") == ""
    assert comm._short("[/a/pair.cc:553] Connection closed by peer [127.0.0.1]:1. This is typically caused") == \
        "Connection closed by peer [127.0.0.1]:1"

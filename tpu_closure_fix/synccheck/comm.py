"""How the replicas exchange a check: the channel, and the agreement that makes every collective all-or-none.

Picked at each check from the process's environment alone:

* ``torch.distributed`` initialised with a world size > 1: the check runs on a gloo group of its own
  (a ``ProcessGroupGloo`` over a prefix of the process group's store, made once, on the first check every
  rank agreed to), so it never pairs with the training's own
  collectives; the vector is computed on the parameters' device and crosses on the host. Before every
  collective the ranks *agree* through the process group's store: each rank counts itself in under the
  check's key; the last one in votes "go", and a rank that waited ``timeout`` seconds without a vote votes
  "abort" (an atomic compare-and-set, so the first vote written is every rank's answer). A rank enters
  the collective only on "go", so a check that some rank never reaches (an optimizer stepped on one
  rank only, a rank gone, ranks out of step) is entered by none: it stands down with one warning.
  :meth:`_StoreChannel.agree` is that agreement on the calling thread (``compare_replicas``,
  ``check_sync``, the callback), where up to ``GATHER_RANKS`` ranks the vectors ride with it through the
  store and no collective follows (:meth:`_StoreChannel.meet`); the zero-code check runs the same votes on
  its worker thread (:mod:`.worker`), every pending check at once, so no training thread waits there.
* torch_xla with a world size > 1 and no process group (``xmp.spawn``, Lightning's ``XLAStrategy``,
  accelerate on XLA): :class:`HostChannel`, the same agreement and the same gloo exchange on the host, over
  a ``torch.distributed.TCPStore`` of the check's own (one connection per rank, made lazily off the training
  thread), found through the channel handed to the replicas in ``TPU_CLOSURE_FIX_SYNC_CHECK_CHANNEL``
  (:func:`parse_channel`): the process that starts them (``xmp.spawn``, ``torch_xla.launch``) makes the store
  on loopback at a port the kernel picks and hands its port and a per-job secret to its children
  (:mod:`.launch`); across hosts the user sets the variable alike on every host and process 0 makes the store.
  Every key carries the secret, and a replica joins only a store holding the job's mark: never a port derived
  from another, never a store the job did not make; without a channel the check stands down saying why. A
  replica is a rank (``runtime.global_ordinal()``), also where the replicas are threads of one process
  (PJRT on CPU, TPU v2/v3): each has its own worker and gloo group. No XLA collective is ever issued, so a
  check one replica skips stands down instead of hanging the device.
* Otherwise (one process, world size 1): no channel; a check does nothing.
"""
import functools
import os
import struct
import sys
import threading

from .. import settings
from ..config import CHANNEL_VAR, TIMEOUT_VAR
# the agreement's default timeout and the channel's rule: settings.TABLE's
from ..settings import DEFAULT_TIMEOUT, MADE, SECRET_DIGITS, Channel, parse_channel  # noqa: F401 (names of comm)

KEY_PREFIX = "tpu_closure_fix/synccheck/"

_groups = {}  # (scope, user, rank) -> the check's own gloo group
_made = {}  # (user, rank) -> the check's groups made for it in this process: each its own prefix of the store
_making = {}  # (scope, user, rank) -> the lock held while that group is made (two threads may ask for it at once)
_making_lock = threading.Lock()
_connections = threading.local()  # this thread's (store, its own connection to it): see own_connection
#: Up to this many ranks a check's MAX is taken from every rank's whole vector (each rank receives
#: ``GATHER_RANKS`` x 76.7 KiB at most): through the store with the agreement on the calling thread
#: (:meth:`_StoreChannel.meet`), from an all-gather on the worker. gloo's all-reduce took 1.7-2.0 ms on 2 ranks
#: whatever the vector's length, its all-gather of the whole vector 0.35-0.57 ms (and 9.6 against 15.0 ms on 8
#: ranks sharing 2 cores; benchmarks/synccheck_anchors.py, docs/synccheck.md). Above it the bytes each rank
#: receives (and, through the store, its one server sends) grow with the ranks.
GATHER_RANKS = 8
#: The name of the zero-code check's worker threads (:mod:`.worker`).
WORKER_THREAD = "tpu-closure-fix-synccheck"


def _user_of_groups():
    """Who runs this check's collectives: the zero-code check's worker thread, or a caller's thread
    (``compare_replicas``, ``check_sync``, the callback). Each has a gloo group of its own: their checks run
    concurrently and must never pair with each other's collectives."""
    import threading

    return "worker" if threading.current_thread().name == WORKER_THREAD else "call"


def release_groups():
    """Let go of the check's own gloo groups (their connections close with them): the job is ending its process
    group."""
    _groups.clear()


def default_group_id():
    """An identity of the job's default process group now (None: none), to tell a new group from the old."""
    dist = sys.modules.get("torch.distributed")
    try:
        return id(dist.distributed_c10d._get_default_group())
    except Exception:
        return None


class StoodDown(RuntimeError):
    """A check that could not complete; ``broken``: the channel can carry no further check."""

    def __init__(self, message, broken=False):
        super().__init__(message)
        self.broken = broken


def handed_channel(environ=None):
    """The channel handed to this replica (:func:`parse_channel`), or None; a bad value is said once (the
    settings' one warn-once: not again where the check was armed and said it).

    Read from the environment at this call, by the settings' row (:func:`..settings.read_now`), not from the
    settings kept at activation: the process that starts the replicas sets the variable after it read its
    settings (:mod:`.launch`), and its replicas may be its own threads (``spawn_threads``) or forked children,
    which would see the kept value from before the hand-over. A ``settings.reload()`` there instead would read
    every other variable again mid-run, and a second time when the hand-over ends."""
    return settings.read_now(CHANNEL_VAR, environ)


def _xla_runtime():
    """torch_xla's runtime module when torch_xla is already imported here (never imports torch_xla itself)."""
    if sys.modules.get("torch_xla.core.xla_model") is None:
        return None
    runtime = sys.modules.get("torch_xla.runtime")
    if runtime is None:
        try:
            import torch_xla.runtime as runtime  # torch_xla >= 2.1
        except Exception:
            return None
    return runtime


def _xla_world():
    """(xla_model module, world size) when torch_xla is already imported here, else (None, 1). Never
    imports torch_xla: a process that has not imported it is not running on XLA."""
    xm = sys.modules.get("torch_xla.core.xla_model")
    if xm is None:
        return None, 1
    size = None
    try:
        size = _xla_runtime().world_size()
    except Exception:
        fn = getattr(xm, "xrt_world_size", None) or getattr(xm, "world_size", None)
        try:
            size = fn() if fn is not None else 1
        except Exception:
            size = 1
    return xm, int(size)


def xla_world_size():
    """How many replicas torch_xla's ``xm.optimizer_step`` reduces over here (1: torch_xla not imported)."""
    return _xla_world()[1]


def _xla_ordinal(xm):
    """This replica's global ordinal (per thread where the replicas are threads of one process)."""
    runtime = sys.modules.get("torch_xla.runtime")
    fn = getattr(runtime, "global_ordinal", None) or getattr(xm, "get_ordinal", None)
    try:
        return int(fn()) if fn is not None else 0
    except Exception:
        return 0


def replica_index():
    """Which of this process's replicas the calling thread is: torch_xla's global ordinal when torch_xla is
    imported and there is no process group of the process (replicas may be threads of one process), else 0 (a
    process group's rank is a process: one replica each)."""
    xm = sys.modules.get("torch_xla.core.xla_model")
    if xm is None or (_process_group_initialized() and not thread_local_groups()):
        return 0
    return _xla_ordinal(xm)


def _process_group_initialized():
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized())
    except Exception:
        return False


#: torch's threaded process groups: torch_xla installs them on TPU v2/v3 (``torch_xla.experimental.pjrt_backend``)
#: so that each replica thread has a default process group of its own.
THREADED_PG = "torch.testing._internal.distributed.multi_threaded_pg"


def thread_local_groups():
    """Whether torch.distributed's process groups are per thread here (torch's ``ThreadLocalWorld``): another
    thread -- the check's worker -- sees none of the training thread's."""
    threaded = sys.modules.get(THREADED_PG)
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    world_class = getattr(threaded, "ThreadLocalWorld", None)
    return world_class is not None and isinstance(getattr(c10d, "_world", None), world_class)


def choose(group_size, thread_local, xla_size):
    """Which channel a check takes: ``"torch.distributed"`` with a process group of more than one rank that
    the check's worker thread can use too; else ``"xla host"`` with more than one torch_xla replica (no process
    group, or only per-thread ones); else None (one replica: nothing to compare). ``group_size``: the default
    process group's world size (0: none)."""
    if group_size > 1 and not thread_local:
        return "torch.distributed"
    if xla_size > 1:
        return "xla host"
    return None


def channel(timeout=None):
    """The channel of this process for a check now, or None (one device: nothing to compare). Called on the
    thread of the replica it is for (its rank is that thread's)."""
    dist = sys.modules.get("torch.distributed")
    group_size = dist.get_world_size() if _process_group_initialized() else 0
    xm, size = _xla_world()
    kind = choose(group_size, thread_local_groups(), size if xm is not None else 1)
    if kind == "torch.distributed":
        return DistributedChannel(dist, timeout)
    if kind == "xla host":
        return HostChannel(xm, size, timeout)
    return None


def _timeout(timeout):
    if timeout is None:
        timeout = settings.current().get(TIMEOUT_VAR)
    return timeout


#: The first torch whose store survives a timed-out ``wait`` (it cancels the wait on the server: checked on 2.9 and
#: 2.13); an older one polls instead.
BLOCKING_WAIT_TORCH = (2, 9)


def blocking_wait_safe(version=None):
    """Whether a ``wait`` on the store may time out and leave it usable: torch >= :data:`BLOCKING_WAIT_TORCH`."""
    if version is None:
        torch = sys.modules.get("torch")
        version = getattr(torch, "__version__", "0")
    version = str(version)
    safe = _blocking_wait_safe.get(version)
    if safe is None:  # read once per version string: the worker asks at every round
        parts = []
        for piece in version.split("+")[0].split(".")[:2]:
            digits = "".join(c for c in piece if c.isdigit()) if piece[:1].isdigit() else ""
            parts.append(int(digits[:4]) if digits else 0)
        safe = _blocking_wait_safe[version] = tuple(parts) >= BLOCKING_WAIT_TORCH
    return safe


_blocking_wait_safe = {}  # torch's version string -> blocking_wait_safe's answer


def own_connection(store):
    """This thread's own connection to ``store`` (``store.clone()``, made once per thread and store), or None
    where the store cannot be cloned. The check's blocking calls (the vote's wait, its gloo group's rendezvous)
    go through it: a blocking call holds its connection until it returns, and on the job's connection it would
    hold every other thread's use of that store for as long -- the training thread's and the check's worker,
    whose peers may be waiting for this rank in turn: a cycle across ranks, broken only by the timeout."""
    held = getattr(_connections, "pair", None)
    if held is not None and held[0] is store:
        return held[1]
    clone = None
    try:
        clone = store.clone() if hasattr(store, "clone") else None
    except Exception:  # a store that cannot be cloned: its callers keep the shapes that never block on it
        clone = None
    _connections.pair = (store, clone)
    return clone


class _StoreChannel(object):
    """What both channels share: the agreement through a store, the exchange on a gloo group of the check's
    own built over a prefix of that store. Subclasses give ``_store()``, ``_scope()`` (what the group is
    made over: a new scope, a new group) and ``worker_scope`` (which worker thread serves this rank)."""

    kind = None
    worker_scope = "process"

    def __init__(self, rank, size, timeout):
        self.rank, self.size, self.timeout = rank, size, _timeout(timeout)

    def device(self, tensors):
        """Where the vector is computed: the parameters' own device (one pass there, one copy to the host)."""
        import torch

        return tensors[0].device if tensors else torch.device("cpu")

    def _store(self):
        raise NotImplementedError

    def _scope(self):
        raise NotImplementedError

    def _c10d(self):
        """The torch.distributed module whose gloo classes build and drive the check's group."""
        import torch.distributed as dist

        return dist

    def _failed_store(self, exc):
        return StoodDown("the store of the process group failed (%s: %s)" % (type(exc).__name__, exc), broken=True)

    def agree(self, key):
        """Whether every rank reached check ``key`` (see the module docstring). Raises StoodDown when the
        store itself fails (its host gone).

        Each rank counts itself in; the last one in votes "go" at once. The others wait for the vote
        (:meth:`_await_vote`) until ``timeout`` passed and then vote "abort", by compare-and-set: the first
        vote written is every rank's answer."""
        return self._agree(key)

    def meet(self, key, vector):
        """Agree on check ``key`` (:meth:`agree`) and take the elementwise MAX of every rank's ``vector``: the
        MAX on the host, or None when not every rank reached the check.

        Up to ``GATHER_RANKS`` ranks the vectors ride with the agreement: each rank writes its vector into the
        store before it counts itself in, so once the vote is "go" every rank's vector is there to read. One
        meeting of the ranks instead of two (the agreement, then a collective), and no collective at all.
        Above the bound each rank would read every other's vector from the one store: the agreement, then
        :meth:`all_reduce_max`."""
        if not rides_with_vote(self):
            return self.all_reduce_max(vector) if self.agree(key) else None
        host = vector.detach().to("cpu").contiguous()
        if not self._agree(key, (vector_key(self.rank), _bytes_of(host))):
            return None
        try:
            return read_max(self, self._store(), KEY_PREFIX + key, host)
        except StoodDown:
            raise
        except Exception as exc:
            raise self._failed_store(exc)

    def _agree(self, key, written=None):
        """:meth:`agree`; ``written``: a (key suffix, bytes) this rank writes before it counts itself in, and
        deletes again when the vote is "abort" (no rank reads it then)."""
        import time

        key = KEY_PREFIX + key
        try:
            store = self._store()
            if written is not None:
                store.set(key + written[0], written[1])
            deadline = time.monotonic() + self.timeout
            arrived = store.add(key + "/arrived", 1)
            if arrived < self.size:
                arrived = self._await_vote(store, key, deadline)
            decision = store.compare_set(key + "/decision", "", "go" if arrived >= self.size else "abort")
            go = decision in (b"go", "go")
            if written is not None and not go:
                store.delete_key(key + written[0])
        except StoodDown:
            raise
        except Exception as exc:
            raise self._failed_store(exc)
        return go

    def _await_vote(self, store, key, deadline):
        """Wait until the last rank in voted or ``deadline`` passed; the ranks counted in then (``size``: the
        vote is written). Where a timed-out ``wait`` leaves the store usable (:func:`blocking_wait_safe`) and the
        store can be cloned, one blocking ``wait`` for the vote's key on this thread's own connection
        (:func:`own_connection`), with the GIL released; elsewhere (on torch 1.x a timed-out wait leaves the
        store's socket out of step for every later use) poll the count, pausing longer each time."""
        import time
        from datetime import timedelta

        waiting = own_connection(store) if blocking_wait_safe() else None
        if waiting is not None:
            try:
                waiting.wait([key + "/decision"], timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
                return self.size  # the vote is written: compare_set below reads it
            except Exception:  # the deadline passed (a store that broke fails the vote that follows too)
                return 0
        arrived, delay = 0, 0.0002
        while time.monotonic() < deadline:
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
            arrived = store.add(key + "/arrived", 0)
            if arrived >= self.size:
                break
        return arrived

    def forget(self, key):
        """Delete a finished check's keys from the store (best effort): its vote (rank 0) and the vector each
        rank wrote for :meth:`meet` (its own). Call it once every rank is past that check: after a later check's
        "go" (a rank still reading a vector would otherwise find it gone)."""
        if key is None:
            return
        try:
            store = self._store()
            suffixes = ("/arrived", "/decision") if self.rank == 0 else ()
            if rides_with_vote(self):
                suffixes += (vector_key(self.rank),)
            for suffix in suffixes:
                store.delete_key(KEY_PREFIX + key + suffix)
        except Exception:
            pass

    def _group(self):
        """The check's own gloo process group of this rank, made once per scope: a ``ProcessGroupGloo`` built
        directly over a prefix of the store. Building it is a rendezvous of the ranks' checks only (the zero-code
        check's as its workers start, :meth:`ready_group`; else at the first exchange, entered after every rank
        agreed "go"): no collective on the job's groups, and none of the process-wide group
        numbering ``new_group`` uses, so making it from the check's worker thread cannot pair with groups the
        training makes meanwhile. Keyed per rank: replicas that are threads of one process each have theirs."""
        return self._made_group(_user_of_groups())

    def ready_group(self):
        """Make the zero-code check's gloo group of this rank now, if not made yet: a rendezvous of the ranks'
        check workers, which each start one as the job makes its process group (:meth:`.worker.Worker._prepare`)."""
        self._made_group("worker")

    def _made_group(self, user):
        """``user``'s group (:meth:`_group`), made once: a second thread asking meanwhile waits for the first."""
        from datetime import timedelta

        dist = self._c10d()
        scope = self._scope()
        key = (scope, user, self.rank)
        group = _groups.get(key)
        if group is not None:
            return group
        with _making_lock:
            making = _making.setdefault(key, threading.Lock())
        with making:
            group = _groups.get(key)
            if group is None:
                for old in [k for k in _groups if k[0][0] == scope[0] and k[0] != scope]:
                    del _groups[old]  # a group of an earlier default group
                made = _made[(user, self.rank)] = _made.get((user, self.rank), 0) + 1
                store = self._store()
                # the rendezvous waits for every rank's address: on this thread's own connection (own_connection)
                prefix = dist.PrefixStore("%sgroup/%s/%d" % (KEY_PREFIX, user, made), own_connection(store) or store)
                group = dist.ProcessGroupGloo(prefix, self.rank, self.size, timedelta(seconds=self.timeout))
                _groups[key] = group
        return group

    def _run(self, what, fn):
        try:
            group = self._group()
        except StoodDown:
            raise
        except Exception as exc:
            raise self._did_not_complete(what, exc)
        try:
            return fn(group)
        except Exception as exc:
            raise self._did_not_complete(what, exc)

    def _did_not_complete(self, what, exc):
        """The collective's failure, its error cut to a short reason (:func:`_short`)."""
        return StoodDown("the check's %s did not complete (%s: %s): a peer gone or timed out"
                         % (what, type(exc).__name__, _short(str(exc))), broken=True)

    def all_reduce_max(self, vector):
        """The elementwise MAX of every rank's ``vector``, on the host: up to ``GATHER_RANKS`` ranks from one
        all-gather (the same exact maximum), above that from gloo's all-reduce (the size alone decides, so
        every rank enters the same collective)."""
        if self.size <= GATHER_RANKS:
            return self._gathered_max(vector)
        dist = self._c10d()
        host = vector.detach().to("cpu", copy=True)

        def reduce(group):
            options = dist.AllreduceOptions()
            options.reduceOp = dist.ReduceOp.MAX
            group.allreduce([host], options).wait()
            return host
        return self._run("all-reduce", reduce)

    def _gathered_max(self, vector):
        import torch

        host = vector.detach().to("cpu", copy=True)

        def gather(group):
            out = [[torch.empty_like(host) for _ in range(self.size)]]
            group.allgather(out, [host]).wait()
            rows = out[0]
            return functools.reduce(torch.maximum, rows[1:], rows[0])  # the rows are this call's: no copy kept
        return self._run("all-reduce", gather)

    def all_gather(self, vector):
        import torch

        host = vector.detach().to("cpu", copy=True)

        def gather(group):
            out = [[torch.empty_like(host) for _ in range(self.size)]]
            group.allgather(out, [host]).wait()
            return out[0]
        return self._run("all-gather", gather)


def rides_with_vote(channel):
    """Whether ``channel``'s ranks exchange their vectors through the store with the vote (up to
    ``GATHER_RANKS`` ranks): each rank writes its vector under the check's key before it counts itself in and
    reads the others' once the check is agreed "go" (:func:`read_max`), so no collective follows."""
    return channel.size <= GATHER_RANKS


def vector_key(rank):
    """The suffix, after a check's key, of the vector rank ``rank`` wrote for it."""
    return "/vector/%d" % rank


def read_max(channel, store, key, vector):
    """The elementwise MAX of this rank's ``vector`` and every other rank's, read from ``store`` under the
    check's full ``key`` (every rank wrote its vector before it counted itself in: call once the check is
    agreed "go"). A peer's vector of another length: StoodDown; a store that fails: its error."""
    import torch

    host = vector.detach().to("cpu").contiguous()
    values = _read_all(store, [key + vector_key(r) for r in range(channel.size) if r != channel.rank])
    return torch.stack([host] + [_tensor_of(value, host) for value in values]).amax(0)


def _raw(tensor):
    """The bytes of the contiguous CPU tensor ``tensor`` (no numpy: it may be absent)."""
    import ctypes

    return ctypes.string_at(tensor.data_ptr(), tensor.numel() * tensor.element_size())


def _from_raw(data, dtype, count):
    import torch

    if hasattr(torch, "frombuffer"):
        return torch.frombuffer(bytearray(data), dtype=dtype, count=count) if count else torch.empty(0, dtype=dtype)
    return torch.tensor(memoryview(bytearray(data)).cast("i" if dtype == torch.int32 else "f").tolist(),
                        dtype=dtype)  # torch < 1.10


#: How a vector travels through the store: a header (the form, the vector's length, the values sent), then
#: either every value (DENSE) or the positions of the values that are not -inf and those values (SPARSE): an
#: absent slot is -inf in every field, the MAX's identity, so a small model's vector (a few of its 1,024 slots
#: held) is about 1 KiB instead of 76 KiB, and read back it is bit for bit the vector written.
_HEADER = struct.Struct("<iii")
DENSE, SPARSE = 1, 2


def _bytes_of(host):
    """``host`` (a contiguous float32 CPU vector) as the bytes a peer reads back with :func:`_tensor_of`."""
    import torch

    kept = torch.nonzero(host != float("-inf")).reshape(-1)
    if 2 * kept.numel() >= host.numel():
        return _HEADER.pack(DENSE, host.numel(), host.numel()) + _raw(host)
    return (_HEADER.pack(SPARSE, host.numel(), kept.numel()) + _raw(kept.to(torch.int32).contiguous())
            + _raw(host[kept].contiguous()))


def _tensor_of(value, like):
    """The vector a peer wrote with :func:`_bytes_of`, checked against ``like`` (this rank's: float32, its
    length); StoodDown (this check cannot be read, the channel still can) for bytes that are not such a vector."""
    import torch

    value = bytes(value)
    form, length, count = _HEADER.unpack_from(value) if len(value) >= _HEADER.size else (0, -1, 0)
    body = len(value) - _HEADER.size
    expected = {DENSE: 4 * length, SPARSE: 8 * count}.get(form)
    if length != like.numel() or expected is None or body != expected or not 0 <= count <= length:
        raise StoodDown("a peer's vector cannot be read here (%d bytes; this rank's holds %d values): install the "
                        "same tpu-closure-fix release on every host" % (len(value), like.numel()))
    if form == DENSE:
        return _from_raw(value[_HEADER.size:], torch.float32, length)
    positions = _from_raw(value[_HEADER.size:_HEADER.size + 4 * count], torch.int32, count).to(torch.int64)
    vector = torch.full((length,), float("-inf"), dtype=torch.float32)
    if count:
        if int(positions.min()) < 0 or int(positions.max()) >= length:
            raise StoodDown("a peer's vector cannot be read here (a position out of range): install the same "
                            "tpu-closure-fix release on every host")
        vector[positions] = _from_raw(value[_HEADER.size + 4 * count:], torch.float32, count)
    return vector


def _read_all(store, keys):
    """The values of ``keys``: one ``multi_get`` round trip where the store has it, else one ``get`` each."""
    if not keys:
        return []
    multi_get = getattr(store, "multi_get", None)
    if multi_get is not None:
        try:
            return multi_get(keys)
        except Exception:  # a store class whose multi_get is not implemented; one that failed fails below too
            pass
    return [store.get(key) for key in keys]


class DistributedChannel(_StoreChannel):
    """torch.distributed's world: agreement through the job's store (one worker thread per process)."""

    kind = "torch.distributed"

    def __init__(self, dist, timeout=None):
        self.dist = dist
        super().__init__(dist.get_rank(), dist.get_world_size(), timeout)

    def _store(self):
        return self.dist.distributed_c10d._get_default_store()

    def _c10d(self):
        return self.dist

    def _scope(self):
        return ("process group", id(self.dist.distributed_c10d._get_default_group()))


class HostChannel(_StoreChannel):
    """torch_xla's replicas without a process group: agreement and exchange on the host, over the check's own
    store (:func:`host_store`); never an XLA collective. Made on the replica's own thread (its rank is that
    thread's ordinal); its store and group are made by whoever first exchanges (the worker thread)."""

    kind = "xla host"

    def __init__(self, xm, size, timeout=None):
        runtime = sys.modules.get("torch_xla.runtime")
        super().__init__(_xla_ordinal(xm), size, timeout)
        self.worker_scope = ("xla replica", self.rank)
        self.server = _call(getattr(runtime, "process_index", None), 0) == 0
        self.device_type = _call(getattr(runtime, "device_type", None), None)

    def _store(self):
        return host_store(self.server, self.device_type, self.timeout, self.rank)

    def _scope(self):
        return ("xla host", 0)

    def _failed_store(self, exc):
        return StoodDown("the sync check's own store failed (%s: %s)" % (type(exc).__name__, exc), broken=True)


def _call(fn, default):
    try:
        return fn() if fn is not None else default
    except Exception:
        return default


_host = {"server": None, "clients": {}, "failed": None}
_host_lock = threading.Lock()
#: The key every store the check makes holds under the job's secret: a replica joins no store without it.
MARK = KEY_PREFIX + "made"
#: Seconds a replica waits for the mark on a store it reached: its maker writes it the moment the store listens.
MARK_WAIT = 10


def host_store(server, device_type=None, timeout=DEFAULT_TIMEOUT, rank=0):
    """Rank ``rank``'s connection to the check's store, under the job's secret: a ``PrefixStore`` over a
    ``TCPStore`` client, so every key the check reads or writes starts with the secret. The store is the one
    the channel handed to the replica names (:func:`handed_channel`): made by the process that started the
    replicas, or else by process 0 (``server``) on the channel's host and port. A replica joins a store only
    once it holds the job's :data:`MARK`, so never one the job did not make. One connection per rank (a TCPStore
    client serves one call at a time, and a replica thread's gloo rendezvous blocks in a ``get``), made at its
    first call, never on the training thread. No channel, a channel that cannot serve this world, a store that
    cannot be made, reached or shown to be the job's: StoodDown (broken), the same at every later call."""
    with _host_lock:
        if _host["failed"] is not None:
            raise _host["failed"]
        client = _host["clients"].get(rank)
        if client is None:
            try:
                client = _host["clients"][rank] = _connect(server, timeout)
            except StoodDown as exc:
                _host["failed"] = exc
                raise
        return client


def _connect(server, timeout):
    found = handed_channel()
    if found is None:
        raise StoodDown("no channel was handed to this replica (%s is unset): the process that starts the replicas "
                        "hands one over when it imports tpu_closure_fix.synccheck before xmp.spawn or "
                        "torch_xla.launch; across hosts set it alike on every host (docs/synccheck.md)" % CHANNEL_VAR,
                        broken=True)
    if found.made and not world_is_local():
        raise StoodDown("the channel handed over by the process that started the replicas serves its own host only, "
                        "and this job's replicas span hosts: set %s alike on every host, or init a process group "
                        "(docs/synccheck.md)" % CHANNEL_VAR, broken=True)
    if server and not found.made and _host["server"] is None:
        try:
            _host["server"] = make_store(found.host, found.port, found.secret, timeout)
        except Exception as exc:
            raise StoodDown("its store could not listen at %s:%d (%s: %s): set %s to a free port on process 0's host"
                            % (found.host, found.port, type(exc).__name__, _short(str(exc)), CHANNEL_VAR),
                            broken=True)
    return _join(found, timeout)


def world_is_local():
    """Whether every replica of torch_xla's world runs on this host (its devices here are the whole world)."""
    runtime = sys.modules.get("torch_xla.runtime")
    try:
        return int(runtime.local_device_count()) >= int(runtime.world_size())
    except Exception:  # a runtime without these functions: one process is one host
        return _call(getattr(runtime, "process_count", None), 1) <= 1


def make_store(host, port, secret, timeout):
    """A TCPStore server listening at ``host``'s address only (``port`` 0: a free port the kernel picks),
    holding the job's :data:`MARK` under ``secret``; returns it (its ``port`` says which)."""
    import socket
    from datetime import timedelta

    import torch.distributed as dist

    if not _takes_a_socket(dist):
        # torch before 2.1 binds the store's socket itself, on every interface: the kernel picks the port (0); the
        # keys still carry the secret (docs/synccheck.md, the exposure that remains)
        store = dist.TCPStore(host, port, None, True, timedelta(seconds=timeout), wait_for_workers=False)
        dist.PrefixStore(secret, store).set(MARK, "1")
        return store
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind((host, port))
        listener.listen(128)
        port = listener.getsockname()[1]
        options = dict(wait_for_workers=False, master_listen_fd=listener.fileno())
        try:
            store = dist.TCPStore(host, port, None, True, timedelta(seconds=timeout), use_libuv=True, **options)
        except (TypeError, RuntimeError) as exc:  # torch before 2.3: no libuv choice, or "Libuv implementation missing"
            if isinstance(exc, RuntimeError) and "libuv" not in str(exc).lower():
                raise
            store = dist.TCPStore(host, port, None, True, timedelta(seconds=timeout), **options)
    except BaseException:
        listener.close()
        raise
    listener.detach()  # the store owns the socket now: it closes it when it goes
    dist.PrefixStore(secret, store).set(MARK, "1")  # keys: SECRET/tpu_closure_fix/...
    return store


def _takes_a_socket(dist):
    """Whether this torch's TCPStore serves on a socket it is given (``master_listen_fd``, torch >= 2.1)."""
    return "master_listen_fd" in (getattr(dist.TCPStore.__init__, "__doc__", None) or "")


def _has_mark(store, seconds):
    """Whether ``store`` shows the job's mark within ``seconds``. ``check`` (torch >= 2.2) never blocks; without
    it (torch 2.1 and before), one bounded ``wait``: a store it times out on is left anyway (the check stands down)."""
    import time
    from datetime import timedelta

    if not hasattr(store, "check"):
        try:
            store.wait([MARK], timedelta(seconds=seconds))
            return True
        except Exception:  # timed out: no mark
            return False
    deadline = time.monotonic() + seconds
    while not store.check([MARK]):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _join(found, timeout):
    """A connection to the store at ``found``'s host and port, under its secret, once the store shows the mark."""
    from datetime import timedelta

    import torch.distributed as dist

    where = "%s:%d" % (found.host, found.port)
    try:
        client = _bounded(lambda: dist.TCPStore(found.host, found.port, None, False, timedelta(seconds=timeout),
                                                wait_for_workers=False), timeout + 1, found)
        store = dist.PrefixStore(found.secret, client)
        if not _has_mark(store, min(MARK_WAIT, timeout)):
            raise StoodDown("the store at %s is not this job's (no mark of its secret within %ds): another program "
                            "listens there; set %s to a free port" % (where, min(MARK_WAIT, timeout), CHANNEL_VAR),
                            broken=True)
    except StoodDown:
        raise
    except Exception as exc:
        raise StoodDown("its store at %s could not be reached within %ds (%s: %s)%s"
                        % (where, timeout, type(exc).__name__, _short(str(exc)),
                           "" if found.made else ": process 0 makes it at its first check, at the host and port of "
                           "%s" % CHANNEL_VAR), broken=True)
    return store


def _bounded(connect, seconds, found):
    """``connect()``'s store, made on a thread of its own and waited for at most ``seconds``: torch's TCPStore
    client waits without end for the answer of a program that accepts connections and never answers (a
    squatter). Such a thread is left behind, blocked until that program lets go. Past the bound, a program is
    named as listening there only if one accepts a connection now: torch's client retries a refused connection
    with pauses of its own, so on a loaded host the bound can pass while nothing listens at all."""
    box = []

    def run():
        try:
            box.append((connect(), None))
        except Exception as exc:
            box.append((None, exc))

    thread = threading.Thread(target=run, name=WORKER_THREAD + "-connect", daemon=True)
    thread.start()
    thread.join(seconds)
    if not box:
        if not _accepts(found.host, found.port):
            raise TimeoutError("no store answered within %ds" % seconds)
        raise StoodDown("the program at %s:%d accepts connections but does not answer as a store within %ds: "
                        "another program listens there; set %s to a free port"
                        % (found.host, found.port, seconds, CHANNEL_VAR), broken=True)
    if box[0][1] is not None:
        raise box[0][1]
    return box[0][0]


def _accepts(host, port, seconds=1.0):
    """Whether a program accepts a TCP connection at ``host``:``port`` (within ``seconds``)."""
    import socket

    try:
        socket.create_connection((host, port), timeout=seconds).close()
        return True
    except OSError:
        return False


def _short(text, limit=80):
    """An error's text as a one-line reason: the first sentence of its first line, without gloo's
    ``[source:line]`` prefix, in ASCII, at most ``limit`` characters (the warning quoting it stays readable)."""
    import re

    reason = text.splitlines()[0] if text else ""
    reason = re.sub(r"^\[[^\]]*\]\s*", "", reason)  # "[/.../gloo/transport/tcp/pair.cc:553] "
    reason = re.split(r"\.\s+(?=[A-Z])", reason)[0].encode("ascii", "ignore").decode("ascii").strip()
    return reason if len(reason) <= limit else reason[:limit - 3].rstrip() + "..."


_forked_away = []  # the parent's store connections, kept unreleased in a forked child (its sockets are the parent's)


def _after_fork_in_child():
    """A forked child makes its own store and gloo groups: the parent's connections are not its own (they are
    kept, never used nor released: closing them here could close the parent's)."""
    global _host_lock
    _host_lock = threading.Lock()
    _forked_away.append((dict(_host), dict(_groups)))
    _host.update(server=None, clients={}, failed=None)
    _groups.clear()
    _made.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

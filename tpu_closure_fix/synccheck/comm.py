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
  ``check_sync``, the callback); the zero-code check runs the same votes on its worker thread
  (:mod:`.worker`), every pending check at once, so no training thread waits there.
* torch_xla with a world size > 1 and no process group (``xmp.spawn``, Lightning's ``XLAStrategy``,
  accelerate on XLA): :class:`HostChannel`, the same agreement and the same gloo exchange on the host, over
  a ``torch.distributed.TCPStore`` of the check's own (its server in one process, one connection per rank,
  made lazily off the training thread) found the way torch_xla's ``xla://`` init method finds its master:
  ``MASTER_ADDR``, else TPU worker 0's address on a TPU, else 127.0.0.1; on port
  ``TPU_CLOSURE_FIX_SYNC_CHECK_PORT``, else ``MASTER_PORT`` + 1 (12356 by default). The server is in the
  process of ``process_index() == 0``. A
  replica is a rank (``runtime.global_ordinal()``), also where the replicas are threads of one process
  (PJRT on CPU, TPU v2/v3): each has its own worker and gloo group. No XLA collective is ever issued, so a
  check one replica skips stands down instead of hanging the device.
* Otherwise (one process, world size 1): no channel; a check does nothing.
"""
import os
import sys
import threading

from .. import settings
from ..config import PORT_VAR, TIMEOUT_VAR
# the agreement's default timeout and the port rule: settings.TABLE's
from ..settings import DEFAULT_TIMEOUT, parse_port

KEY_PREFIX = "tpu_closure_fix/synccheck/"

_groups = {}  # (scope, user, rank) -> the check's own gloo group
_made = {}  # (user, rank) -> the check's groups made for it in this process: each its own prefix of the store
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


def store_port(environ=None):
    """The port of the check's own store: ``TPU_CLOSURE_FIX_SYNC_CHECK_PORT`` as the settings hold it (a bad
    value said once), else ``MASTER_PORT`` + 1 as the environment holds it now (``environ``: a mapping read
    instead of both)."""
    chosen = settings.of(environ).get(PORT_VAR)
    if chosen is not None:
        return chosen
    environ = os.environ if environ is None else environ
    return parse_port(None, environ.get("MASTER_PORT"))[0]


def store_host(environ=None, device_type=None, discover=None):
    """The host of the check's store, found as torch_xla's ``xla://`` init method finds its master:
    ``MASTER_ADDR``, else on a TPU worker 0's address (``discover()``), else 127.0.0.1."""
    environ = os.environ if environ is None else environ
    host = (environ.get("MASTER_ADDR") or "").strip()
    if host:
        return host
    if device_type == "TPU" and discover is not None:
        return discover()
    return "127.0.0.1"


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
    parts = []
    for piece in str(version).split("+")[0].split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit()) if piece[:1].isdigit() else ""
        parts.append(int(digits[:4]) if digits else 0)
    return tuple(parts) >= BLOCKING_WAIT_TORCH


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
        import time

        key = KEY_PREFIX + key
        try:
            store = self._store()
            deadline = time.monotonic() + self.timeout
            arrived = store.add(key + "/arrived", 1)
            if arrived < self.size:
                arrived = self._await_vote(store, key, deadline)
            decision = store.compare_set(key + "/decision", "", "go" if arrived >= self.size else "abort")
        except StoodDown:
            raise
        except Exception as exc:
            raise self._failed_store(exc)
        return decision in (b"go", "go")

    def _await_vote(self, store, key, deadline):
        """Wait until the last rank in voted or ``deadline`` passed; the ranks counted in then (``size``: the
        vote is written). Where a timed-out ``wait`` leaves the store usable (:func:`blocking_wait_safe`) one
        blocking ``wait`` for the vote's key, with the GIL released; elsewhere (on torch 1.x a timed-out wait
        leaves the store's socket out of step for every later use) poll the count, pausing longer each time."""
        import time
        from datetime import timedelta

        if blocking_wait_safe():
            try:
                store.wait([key + "/decision"], timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
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
        """Delete a finished check's keys from the store (rank 0, best effort)."""
        if self.rank != 0 or key is None:
            return
        try:
            store = self._store()
            for suffix in ("/arrived", "/decision"):
                store.delete_key(KEY_PREFIX + key + suffix)
        except Exception:
            pass

    def _group(self):
        """The check's own gloo process group of this rank, made once per scope: a ``ProcessGroupGloo`` built
        directly over a prefix of the store. Building it is a rendezvous of the ranks' checks only (entered
        after every rank agreed "go"): no collective on the job's groups, and none of the process-wide group
        numbering ``new_group`` uses, so making it from the check's worker thread cannot pair with groups the
        training makes meanwhile. Keyed per rank: replicas that are threads of one process each have theirs."""
        from datetime import timedelta

        dist = self._c10d()
        scope, user = self._scope(), _user_of_groups()
        group = _groups.get((scope, user, self.rank))
        if group is None:
            for key in [k for k in _groups if k[0][0] == scope[0] and k[0] != scope]:
                del _groups[key]  # a group of an earlier default group
            made = _made[(user, self.rank)] = _made.get((user, self.rank), 0) + 1
            prefix = dist.PrefixStore("%sgroup/%s/%d" % (KEY_PREFIX, user, made), self._store())
            group = dist.ProcessGroupGloo(prefix, self.rank, self.size, timedelta(seconds=self.timeout))
            _groups[(scope, user, self.rank)] = group
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
        dist = self._c10d()
        host = vector.detach().to("cpu", copy=True)

        def reduce(group):
            options = dist.AllreduceOptions()
            options.reduceOp = dist.ReduceOp.MAX
            group.allreduce([host], options).wait()
            return host
        return self._run("all-reduce", reduce)

    def all_gather(self, vector):
        import torch

        host = vector.detach().to("cpu", copy=True)

        def gather(group):
            out = [[torch.empty_like(host) for _ in range(self.size)]]
            group.allgather(out, [host]).wait()
            return out[0]
        return self._run("all-gather", gather)


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


def host_store(server, device_type=None, timeout=DEFAULT_TIMEOUT, rank=0):
    """Rank ``rank``'s connection to the check's store: a TCPStore at :func:`store_host` and
    :func:`store_port` whose server runs in the process with ``process_index() == 0`` (one per process, made
    at the first call; never on the training thread: a client may wait for the server). Each rank has a
    connection of its own: a TCPStore client serves one call at a time, and the gloo rendezvous of one
    replica thread blocks in a ``get`` until the others have written their keys. A store that cannot be made
    raises StoodDown (broken), the same one at every later call in the process."""
    with _host_lock:
        if _host["failed"] is not None:
            raise _host["failed"]
        client = _host["clients"].get(rank)
        if client is None:
            if server and _host["server"] is None:
                _host["server"] = _open_store(True, device_type, timeout)
            client = _host["clients"][rank] = _open_store(False, device_type, timeout)
        return client


def _open_store(server, device_type, timeout):
    from datetime import timedelta

    import torch.distributed as dist

    port = store_port()
    host = None
    try:
        host = store_host(device_type=device_type, discover=_tpu_master)
        return dist.TCPStore(host, port, None, server, timedelta(seconds=timeout), wait_for_workers=False)
    except Exception as exc:
        _host["failed"] = StoodDown(
            "its store at %s:%d could not be %s (%s: %s); %s"
            % (host or "?", port, "opened" if server else "reached", type(exc).__name__,
               _short(str(exc)), "set %s to a free port (the same on every host)" % PORT_VAR if server else
               "process 0 opens it at its first check, so it was not there within %ds, or it is not on that host "
               "(MASTER_ADDR names process 0's host; %s its port)" % (timeout, PORT_VAR)), broken=True)
        raise _host["failed"]


def _short(text, limit=80):
    """An error's text as a one-line reason: the first sentence of its first line, without gloo's
    ``[source:line]`` prefix, in ASCII, at most ``limit`` characters (the warning quoting it stays readable)."""
    import re

    reason = text.splitlines()[0] if text else ""
    reason = re.sub(r"^\[[^\]]*\]\s*", "", reason)  # "[/.../gloo/transport/tcp/pair.cc:553] "
    reason = re.split(r"\.\s+(?=[A-Z])", reason)[0].encode("ascii", "ignore").decode("ascii").strip()
    return reason if len(reason) <= limit else reason[:limit - 3].rstrip() + "..."


def _tpu_master():
    from torch_xla._internal import tpu

    return tpu.discover_master_worker_ip()


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

"""How the replicas exchange a check: the channel, and the agreement that makes every collective all-or-none.

Picked at each check from the process's environment alone:

* ``torch.distributed`` initialised with a world size > 1: the check runs on a gloo group of its own
  (a ``ProcessGroupGloo`` over a prefix of the process group's store, made once, on the first check every
  rank agreed to), so it never pairs with the training's own
  collectives; the vector is computed on the parameters' device and crosses on the host. Before every
  collective the ranks *agree* through the process group's store: each rank counts itself in under the
  check's key and watches the count; a rank that sees every rank in votes "go", one that waited ``timeout``
  seconds without seeing it votes "abort" (an atomic compare-and-set, so the first vote written is every
  rank's answer). A rank enters
  the collective only on "go", so a check that some rank never reaches (an optimizer stepped on one
  rank only, a rank gone, ranks out of step) is entered by none: it stands down with one warning.
  :meth:`DistributedChannel.agree` is that agreement on the calling thread (``compare_replicas``,
  ``check_sync``, the callback); the zero-code check runs the same votes on its worker thread
  (:mod:`.worker`), every pending check at once, so no training thread waits there.
* torch_xla with a world size > 1 and no process group: ``xm.all_reduce`` inside the XLA graph. There
  is no side channel to agree on, so this path relies on every replica checking at the same steps.
* Otherwise (one process, world size 1): no channel; a check does nothing.
"""
import os
import sys

#: Seconds a rank waits for the others to reach the same check (or for the check's collective) before
#: it stands down; ``TPU_CLOSURE_FIX_SYNC_CHECK_TIMEOUT`` overrides it. Long enough for the first check
#: of a job, whose first step on XLA includes compiling the training graph.
DEFAULT_TIMEOUT = 300
TIMEOUT_VAR = "TPU_CLOSURE_FIX_SYNC_CHECK_TIMEOUT"
KEY_PREFIX = "tpu_closure_fix/synccheck/"

_groups = {}  # (id(default process group), user) -> the check's own gloo group
_made = {}  # user -> the check's groups made for it in this process: each its own prefix of the store
#: The name of the zero-code check's worker thread (:mod:`.worker`).
WORKER_THREAD = "tpu-closure-fix-synccheck"


def _user_of_groups():
    """Who runs this check's collectives: the zero-code check's worker thread, or a caller's thread
    (``compare_replicas``, ``check_sync``, the callback). Each has a gloo group of its own: their checks run
    concurrently and must never pair with each other's collectives."""
    import threading

    return "worker" if threading.current_thread().name == WORKER_THREAD else "call"


def release_groups():
    """Let go of the check's own gloo group (its connections close with it): the job is ending its process
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


def parse_timeout(raw):
    """(seconds, problem) for a raw value of TPU_CLOSURE_FIX_SYNC_CHECK_TIMEOUT (unset/empty: the default)."""
    from ..config import ASCII_WHITESPACE, bad_value_message

    value = "" if raw is None else raw.strip(ASCII_WHITESPACE)
    if value == "":
        return DEFAULT_TIMEOUT, None
    if len(value) <= 7 and value.isascii() and value.isdigit() and int(value) > 0:
        return int(value), None
    return DEFAULT_TIMEOUT, bad_value_message(
        TIMEOUT_VAR, raw, "a whole number of seconds > 0 (ASCII digits, e.g. 600), or unset (%d)" % DEFAULT_TIMEOUT,
        "Using %d." % DEFAULT_TIMEOUT, "`unset %s` (%d s), or `export %s=600`" % (TIMEOUT_VAR, DEFAULT_TIMEOUT,
                                                                                  TIMEOUT_VAR))


def _xla_world():
    """(xla_model module, world size) when torch_xla is already imported here, else (None, 1). Never
    imports torch_xla: a process that has not imported it is not running on XLA."""
    xm = sys.modules.get("torch_xla.core.xla_model")
    if xm is None:
        return None, 1
    size = None
    runtime = sys.modules.get("torch_xla.runtime")
    try:
        if runtime is None:
            import torch_xla.runtime as runtime  # torch_xla >= 2.1
        size = runtime.world_size()
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
    runtime = sys.modules.get("torch_xla.runtime")
    fn = getattr(runtime, "global_ordinal", None) or getattr(xm, "get_ordinal", None)
    try:
        return int(fn()) if fn is not None else 0
    except Exception:
        return 0


def channel(timeout=None):
    """The channel of this process for a check now, or None (one device: nothing to compare)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return DistributedChannel(dist, timeout)
    xm, size = _xla_world()
    if xm is not None and size > 1:
        return XlaChannel(xm, size)
    return None


class DistributedChannel(object):
    kind = "torch.distributed"

    def __init__(self, dist, timeout=None):
        self.dist = dist
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()
        if timeout is None:
            timeout, _ = parse_timeout(os.environ.get(TIMEOUT_VAR))
        self.timeout = timeout

    def device(self, tensors):
        """Where the vector is computed: the parameters' own device (one pass there, one copy to the host)."""
        import torch

        return tensors[0].device if tensors else torch.device("cpu")

    def _store(self):
        return self.dist.distributed_c10d._get_default_store()

    def agree(self, key):
        """Whether every rank reached check ``key`` (see the module docstring). Raises StoodDown when the
        store itself fails (its host gone).

        Each rank counts itself in, then polls the count (no blocking ``wait``: on torch 1.x a timed-out wait
        leaves the store's socket out of step for every later use) until all are in or ``timeout`` passed,
        and votes "go" or "abort" by compare-and-set: the first vote written is every rank's answer."""
        import time

        key = KEY_PREFIX + key
        try:
            store = self._store()
            arrived = store.add(key + "/arrived", 1)
            deadline, delay = time.monotonic() + self.timeout, 0.0002
            while arrived < self.size and time.monotonic() < deadline:
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
                arrived = store.add(key + "/arrived", 0)
            decision = store.compare_set(key + "/decision", "", "go" if arrived >= self.size else "abort")
        except Exception as exc:
            raise StoodDown("the store of the process group failed (%s: %s)" % (type(exc).__name__, exc),
                            broken=True)
        return decision in (b"go", "go")

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
        """The check's own gloo process group, made once per default group: a ``ProcessGroupGloo`` built
        directly over a prefix of the default group's store. Building it is a rendezvous of the ranks' checks
        only (entered after every rank agreed "go"): no collective on the default group, and none of the
        process-wide group numbering ``new_group`` uses, so making it from the check's worker thread cannot
        pair with groups the training makes meanwhile."""
        from datetime import timedelta

        default = self.dist.distributed_c10d._get_default_group()
        user = _user_of_groups()
        group = _groups.get((id(default), user))
        if group is None:
            for key in [k for k in _groups if k[0] != id(default)]:
                del _groups[key]  # a group of an earlier default group
            _made[user] = _made.get(user, 0) + 1
            prefix = self.dist.PrefixStore("%sgroup/%s/%d" % (KEY_PREFIX, user, _made[user]), self._store())
            group = self.dist.ProcessGroupGloo(prefix, self.rank, self.size, timedelta(seconds=self.timeout))
            _groups[(id(default), user)] = group
        return group

    def _run(self, what, fn):
        try:
            return fn(self._group())
        except Exception as exc:
            raise StoodDown("the check's %s did not complete (%s: %s): a peer gone or timed out"
                            % (what, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else ""), broken=True)

    def all_reduce_max(self, vector):
        host = vector.detach().to("cpu", copy=True)

        def reduce(group):
            options = self.dist.AllreduceOptions()
            options.reduceOp = self.dist.ReduceOp.MAX
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


class XlaChannel(object):
    kind = "xla"

    def __init__(self, xm, size):
        self.xm = xm
        self.size = size
        self.rank = _xla_ordinal(xm)

    def device(self, tensors):
        torch_xla = sys.modules.get("torch_xla")
        device_fn = getattr(torch_xla, "device", None)  # torch_xla >= 2.5: xm.xla_device is deprecated
        return device_fn() if callable(device_fn) else self.xm.xla_device()

    def agree(self, key):
        return True  # no side channel under XLA: the replicas' schedule is the agreement

    def forget(self, key):
        pass

    def all_reduce_max(self, vector):
        try:
            out = self.xm.all_reduce(self.xm.REDUCE_MAX, vector)
            out = vector if out is None else out
            return out.detach().cpu()
        except Exception as exc:
            raise StoodDown("the check's all-reduce failed (%s: %s)" % (type(exc).__name__, exc), broken=True)

    def all_gather(self, vector):
        try:
            here = vector.to(self.device([]))
            rows = self.xm.all_gather(here.unsqueeze(0), dim=0).detach().cpu()
        except Exception as exc:
            raise StoodDown("the check's all-gather failed (%s: %s)" % (type(exc).__name__, exc), broken=True)
        return list(rows)

"""When the zero-code check runs: armed from the environment, counted per optimizer, the same on every rank.

``TPU_CLOSURE_FIX_SYNC_CHECK=N`` (N optimizer steps; unset, empty or ``0``: off) and
``TPU_CLOSURE_FIX_SYNC_CHECK_ON_DIVERGENCE=warn|raise`` (default ``warn``) arm a global optimizer step
hook of torch (``torch.optim.optimizer.register_optimizer_step_post_hook``, torch >= 2.0) in every
process of the job: the start-up hook imports the package as soon as torch is imported when the variable
is set (``import tpu_closure_fix`` and ``tpu-closure-fix run`` do the same), whether or not a framework
is ever imported or probed, so arming never depends on what one rank's code happens to import. The
check is armed also under ``TPU_CLOSURE_FIX=0``: with the fix off it is exactly the net one wants.

Why one torch hook and not a hook per framework: every framework's step -- the Lightning Trainer's
``optimizer.step(closure)`` inside ``xm.optimizer_step``, Lite/Fabric's, accelerate's, a plain loop's --
ends in the optimizer's own ``step``, and torch runs the global hooks around it.

``TPU_CLOSURE_FIX_SYNC_CHECK_GROUP=auto|world`` (default ``auto``) says over which ranks the parameters that
no layout places (DTensor, FSDP, DDP, neuronx-distributed) are compared: ``auto`` decides at each optimizer's
first check (bitwise equal over the world: compared over the world from then on; different: pipeline stages
or shards, or replicas that started different -- said once, not compared again), ``world`` says every rank
holds the same model (a difference at the first check is then a divergence).

Counting: per optimizer and per thread, only the outermost step counts (an optimizer stepped inside another's, as
``ZeroRedundancyOptimizer``'s inner optimizer, is not counted); a step that raised (an LBFGS closure out
of data) is not counted and does not stop the counting. Checks run at an optimizer's first step and then
every N. Each optimizer is a *stream* named by its parameters' shapes and dtypes and the user's calls that
first stepped it, so every rank names the same optimizer alike; before a check's collective the ranks agree
that all of them reached that check of that stream (:mod:`.comm`): an optimizer stepped on some ranks only (a
rank-0 probe model) never gets a collective, its stream stands down with one warning (at the agreement's
timeout, or sooner once its unreached checks fill its quota), and the other streams go on. The training thread
only fingerprints (:func:`.compare.prepare`, the result copied to the host in one transfer) and goes on; the
agreement, the exchange, the verdict and the report run on its rank's worker thread (:mod:`.worker`), over the
process group's store or, on torch_xla without one, the check's own (:class:`.comm.HostChannel`); a divergence
to raise is raised by the training thread at the optimizer step the ranks agreed on. A process of world size 1
only counts. Replicas that are threads of one process (torch_xla's PJRT on CPU, TPU v2/v3) each count and name
their optimizers on their own.

Reports name tensors by module path (``encoder.layers.3.weight``), read at each optimizer's first check from the
modules in reach of its step (the stack's local variables) and the DDP / FSDP modules recorded when they were made
(:mod:`.evidence`); never by scanning the live objects. A failure inside the hook (anything but the
divergence itself) is warned about once, disarms the check, and leaves training running.
"""
import atexit
import logging
import os
import sys
import threading
import time
import weakref

from .. import settings
from ..config import CHANNEL_VAR, GROUP_VAR, ON_DIVERGENCE_VAR, SYNC_CHECK_VAR, TIMEOUT_VAR
from ..settings import DEFAULT_ACTION, DEFAULT_GROUP
from . import comm, compare, report as reports  # none imports torch: this module is loaded only when armed
from .report import ReplicaDivergenceError
#: The torch module whose global hook registry arms the check.
TORCH_OPTIMIZER = "torch.optim.optimizer"
#: What is armed: steps between checks (0: off), the action, torch's hook handles.
_armed = {"every": 0, "action": DEFAULT_ACTION, "handles": None, "replicas": DEFAULT_GROUP}
#: What the checks saw in this process: how many ran and the latest SyncReport (None on one device).
seen = {"checks": 0, "last_report": None}
#: id(optimizer) -> (its check history (compare.Stream), [steps completed so far]).
_counts = {}
#: Per thread, ``step``: (id, frame) of the outermost optimizer step running now in it (None: none). Each
#: thread has its own: a step in one thread is never "inside" a step running in another.
_outermost = threading.local()
#: Guards the counts: steps of one optimizer may end in several threads at once.
_lock = threading.Lock()
#: Divergences the ranks agreed to raise and not raised yet: id(stream) -> (the error, this rank). A job that
#: ends before the agreed step still fails (:func:`end_of_job`).
_unraised = {}


def _say_once(key, message, where=None):
    """Say ``message`` once per ``key`` in this process, on the one path of every report (:func:`.report.say`)."""
    reports.say_once(key, message, where=where)


# --------------------------------------------------------------------------- arming
def arm_from_environment(environ=None):
    """Arm the check as the settings say (:func:`..settings.current`; ``environ``: a mapping read instead). A bad
    value: one report, at the user's import line, then off / the default. Returns every."""
    switches = settings.of(environ)
    every = switches.get(SYNC_CHECK_VAR)
    if not every:
        return 0
    action = switches.get(ON_DIVERGENCE_VAR)
    for used_later in (TIMEOUT_VAR, CHANNEL_VAR):  # a bad value is said now, at the user's line, not at a check
        switches.get(used_later)
    arm(every, action, switches.get(GROUP_VAR))
    return every


def arm(every, action=DEFAULT_ACTION, replicas=DEFAULT_GROUP):
    """Check every ``every`` optimizer steps from now on; the hooks go in when torch.optim is imported."""
    _armed["every"], _armed["action"], _armed["replicas"] = every, action, replicas
    module = sys.modules.get(TORCH_OPTIMIZER)
    if module is not None:
        _register(module)
        return
    import wrapt  # a runtime dependency; only loaded here when the check is asked for

    wrapt.register_post_import_hook(_register, TORCH_OPTIMIZER)


def _register(module):
    """Put the pre- and post-hook in torch's global registry (once); older torch: one warning."""
    if _armed["handles"] is not None or not _armed["every"]:
        return
    register_post = getattr(module, "register_optimizer_step_post_hook", None)
    register_pre = getattr(module, "register_optimizer_step_pre_hook", None)
    if register_post is None or register_pre is None:
        import torch

        _say_once("torch", "tpu-closure-fix: %s needs torch >= 2.0 "
                           "(torch.optim.optimizer.register_optimizer_step_post_hook); torch %s has none, so the "
                           "zero-code sync check is off. Use SyncCheck or check_sync in the code instead."
                  % (SYNC_CHECK_VAR, getattr(torch, "__version__", "?")))
        return
    _armed["handles"] = (register_pre(_before_step), register_post(_after_step))
    from . import fingerprint, worker

    worker.watch_process_group()  # before the script's own ``from torch.distributed import init_process_group``
    # read now, with torch, not inside an optimizer's first step: the hash module (about 1 ms to import),
    # Python's library folders (about 0.3 ms) and the libraries' names (about 0.08 ms), which every new
    # optimizer's name reads
    fingerprint.xxhash_module()
    _python_library_dirs()
    reports.library_dirs()


def disarm():
    """Take the hooks out of torch's registry and forget every count."""
    handles, _armed["handles"] = _armed["handles"], None
    _armed["every"] = 0
    for handle in handles or ():
        handle.remove()
    _counts.clear()
    _digests.clear()
    _outermost.step = None


def armed_every():
    """Steps between checks when torch's live registry holds this module's post-hook, else 0."""
    module = sys.modules.get(TORCH_OPTIMIZER)
    registry = getattr(module, "_global_optimizer_post_hooks", None)
    if registry is None or not any(hook is _after_step for hook in list(registry.values())):
        return 0
    return _armed["every"]


# --------------------------------------------------------------------------- the hooks
def _running(frame):
    """Whether ``frame`` is still on this thread's stack (its step has not ended)."""
    here = sys._getframe(2)
    while here is not None:
        if here is frame:
            return True
        here = here.f_back
    return False


def _before_step(optimizer, args, kwargs):
    """Note the outermost optimizer step running now (a noted step whose frame has left the stack ended in an
    exception -- torch runs no post-hook then -- and is forgotten, so the next step counts again). Before an
    optimizer's first update, compare: a difference there is how the replicas started."""
    outer = getattr(_outermost, "step", None)
    if outer is not None and _running(outer[1]):
        return  # a step inside another optimizer's step
    _outermost.step = (id(optimizer), sys._getframe(1))
    if _armed["every"]:
        entry = _counts.get(id(optimizer))
        if entry is None or entry[1][0] == 0:  # before the optimizer's first update
            _guarded(_first_check, optimizer)


def _after_step(optimizer, args, kwargs):
    """Count the step of the outermost optimizer; after its first step and every N-th one compare and act."""
    outer = getattr(_outermost, "step", None)
    if outer is None or outer[0] != id(optimizer) or outer[1] is not sys._getframe(1):
        return  # a step inside another optimizer's step: its outer optimizer counts
    _outermost.step = None
    if _armed["every"]:
        _guarded(_count_and_check, optimizer)


def _guarded(fn, optimizer):
    """Run one of the hook's actions; a divergence raised on purpose goes through, anything else disarms."""
    try:
        fn(optimizer)
    except ReplicaDivergenceError:
        raise
    except Exception as exc:  # never break training: say it once, disarm
        disarm()
        _say_once("failed", "tpu-closure-fix: the zero-code sync check failed (%s: %s) and is now off; "
                            "training goes on." % (type(exc).__name__, exc))


def group_made():
    """The job made its default process group: when armed, ready the check before the first optimizer step (the
    worker's thread started, :func:`.worker.ready`; the fingerprint's first-call costs paid on a small tensor,
    :func:`.fingerprint.warm`), so the first check holds the training thread about as long as a later one. The
    training thread communicates nothing (the worker makes the check's gloo group on a thread of its own). A
    failure here is said once and disarms, as any failure of the hook does."""
    if not _armed["every"]:
        return
    try:
        from . import fingerprint, worker

        if not isinstance(comm.channel(), comm.DistributedChannel):  # a world of one, or the host channel's
            return  # replicas (each its own worker, on its own thread): nothing to start for the process group
        worker.ready(comm.default_group_id())
        fingerprint.warm()
    except Exception as exc:  # never break training: say it once, disarm
        disarm()
        _say_once("failed", "tpu-closure-fix: the zero-code sync check failed (%s: %s) and is now off; "
                            "training goes on." % (type(exc).__name__, exc))


def _first_check(optimizer):
    with _lock:
        stream, steps = _entry(optimizer)
    if steps[0] == 0 and stream.checks == 0 and stream.stood_down is None:
        _check(optimizer, stream, 0)


def _count_and_check(optimizer):
    with _lock:  # steps[0] += 1 is a read and a write: two threads' steps could count as one
        stream, steps = _entry(optimizer)
        steps[0] += 1
        step = steps[0]
    _raise_if_due(stream, step)
    if compare.due(step, _armed["every"]) and stream.stood_down is None and not _raising(stream):
        _check(optimizer, stream, step)


def _stream_key(optimizer, calls=None):
    """A name for the optimizer that every rank gives the same optimizer: a digest of its parameters' shapes
    and dtypes and of the user's calls that first stepped it (``calls``: ``((file name, line), ...)`` from the
    innermost outwards, default :func:`_user_calls` now), and how many optimizers with that digest this replica
    stepped before it (counted per replica: where replicas are threads of one process, each names its own
    optimizers as a replica process would). The calls keep an optimizer stepped on some ranks only (a probe
    over a copy of the model: the same shapes, the same ``train_step`` helper, called from another line) from
    taking the name the other ranks give the model's optimizer; ranks that reach the same optimizer through
    other calls never agree on its checks (each stands down with one note) rather than pair two optimizers."""
    from . import groups
    from .fingerprint import _hash32

    shapes = [(groups.shape_on_every_rank(p), str(p.dtype)) for group in optimizer.param_groups
              for p in group["params"]]
    calls = _user_calls() if calls is None else calls
    # file names, not paths: the same script may sit at another path on another host
    digest = "%08x" % _hash32(repr((shapes, [(os.path.basename(name), line) for name, line in calls])))
    counted = (comm.replica_index(), digest)
    _digests[counted] = _digests.get(counted, 0) + 1
    return "optimizer-%s-%d" % (digest, _digests[counted])


#: Frames of the user's calls an optimizer's name covers, at most (innermost first).
MAX_CALLS = 32


def _user_calls():
    """``((filename, line), ...)`` of the frames on the training thread now that are the user's: outside torch,
    the frameworks, this package and Python's own library (whose lines are the same on every rank anyway)."""
    skipped = reports.library_dirs() + _python_library_dirs()
    calls, frame = [], sys._getframe(1)
    while frame is not None and len(calls) < MAX_CALLS:
        filename = frame.f_code.co_filename
        if not reports.code_path(filename).startswith(skipped):
            calls.append((filename, frame.f_lineno))
        frame = frame.f_back
    return tuple(calls)


_python_dirs = []  # Python's own library folders: the same for the interpreter's life


def _python_library_dirs():
    """The folders of Python's own library, read once (``sysconfig.get_paths()`` costs about 0.4 ms a call: at
    every new optimizer's first check it would hold the training thread that long)."""
    if not _python_dirs:
        import sysconfig

        paths = sysconfig.get_paths()
        _python_dirs.extend(os.path.abspath(paths[key]) + os.sep for key in ("stdlib", "platstdlib"))
    return tuple(_python_dirs)


_digests = {}  # (replica, digest) -> optimizers with that digest this replica named so far


def _entry(optimizer):
    """(stream, [steps]): the optimizer's check history and its count of completed steps."""
    key = id(optimizer)
    entry = _counts.get(key)
    if entry is None:
        entry = _counts[key] = (compare.Stream(_stream_key(optimizer), _armed["replicas"], first_look=True), [0])
        try:
            finalizer = weakref.finalize(optimizer, _counts.pop, key, None)
            finalizer.atexit = False
        except TypeError:  # not weak-referenceable: counted until the process ends
            pass
    return entry


def _check(optimizer, stream, step):
    channel = comm.channel()
    if channel is None:  # one process, or world size 1: nothing to compare, nothing entered
        return
    started = time.perf_counter()
    _name(optimizer, stream)  # found now, on the training thread, while the model is alive
    if isinstance(channel, (comm.DistributedChannel, comm.HostChannel)):
        _check_off_thread(optimizer, stream, step, channel)
        return
    where = reports.user_location()
    try:
        report = compare.run(optimizer, step, stream, channel=channel)
    except comm.StoodDown as exc:
        stream.stood_down = str(exc)
        if exc.broken:
            disarm()
        reports.stood_down(stream.label, step, exc, ("stood down", stream.key, str(exc)), where)
        return
    if report is not None:
        _delivered(report, stream, channel.rank, where, time.perf_counter() - started)


def _name(optimizer, stream):
    """Give ``stream`` the names its reports use (they are built complete, on the worker too): the optimizer as
    the user knows it (never by the stream's key) and its parameters' module paths."""
    if stream.label is None:
        stream.label = _label(optimizer, stream)


def _delivered(report, stream, rank, where, held):
    """What a check's report does once known: the count and the history here, the words through
    :func:`.report.act` (or nothing: the same divergence said already, :func:`.report.repeat_of`). ``held``: the
    seconds the check held the training thread."""
    if report.outcome == "out_of_step" or compare.nothing_left(report):
        # out of step, or every tensor set aside at its first look: no later check of this stream compares
        # anything; checks fingerprinted before this verdict was known say nothing more (stood down)
        stream.stood_down = report.reason
    _counted(report)
    reports.act(report, _armed["action"], rank=rank, where=where, stream=stream, held=held)


def _counted(report):
    seen["checks"] += 1
    seen["last_report"] = report


def _check_off_thread(optimizer, stream, step, channel):
    """Fingerprint now, on the training thread; the worker agrees, exchanges, decides and reports (see
    :mod:`.worker`): this rank never waits here for another."""
    from . import worker

    entry = _counts.get(id(optimizer))
    if entry is None or not _armed["every"]:
        return  # disarmed meanwhile (a broken channel, said by another replica thread of this process)
    steps = entry[1]
    group = comm.default_group_id() if isinstance(channel, comm.DistributedChannel) else None
    if group is not None and worker.stale(group):
        worker.release(answer=False)  # the old group is gone: its checks cannot be answered, none is waited for
    started = time.perf_counter()
    pending = compare.prepare(optimizer, step, stream, channel=channel)
    held = time.perf_counter() - started  # what the training thread gives the check: the fingerprint
    where = reports.user_location()

    def deliver(report, raise_at):
        try:
            _deliver(report, raise_at)
        except Exception as exc:  # a failure while saying it: the training thread raises it, not the worker
            stream.raise_at, stream.raising = 0, exc

    def _deliver(report, raise_at):
        if stream.stood_down is not None and stream.stood_down != "raised" and compare.nothing_left(report):
            return  # every tensor set aside: said once, at the check that set them aside
        if getattr(stream, "raising", None) is not None or stream.stood_down == "raised":
            return  # the first divergence to raise stands (every rank agreed on its step); later ones add nothing
        if raise_at is None:
            _delivered(report, stream, channel.rank, where, held)
            return
        error = ReplicaDivergenceError(raised_words(report, raise_at, raise_at), report)
        stream.raise_at, stream.raising = raise_at, error
        _unraised[id(stream)] = (error, channel.rank, report, raise_at)
        _counted(report)
        reports.agreed_raise(report, raise_at, channel.rank, where, held)  # said now: training may end before
        if stream.passed >= raise_at:  # its training read no raise at that step: it raises at its next one
            reports.learnt_late(raise_at, stream.passed, channel.rank, where)

    def stand_down(exc):
        try:
            _stand_down(exc)
        except Exception as error:  # a failure while saying it: raised on the training thread
            stream.raise_at, stream.raising = 0, error

    def _stand_down(exc):
        if stream.stood_down is not None or _raising(stream):
            return  # one message per stream: its later checks fall with the first, or with the agreed raise
        stream.stood_down = str(exc)
        if exc.broken:
            disarm()
        if worker.said_as_ending(exc):  # a peer closing its connection as this process ends too: no warning
            reports.logger.info("tpu-closure-fix: the job ended before the sync check at step %d completed (%s)",
                                step, exc)
            return
        reports.stood_down(stream.label, step, exc, ("stood down", str(exc) if exc.broken else stream.key), where)

    job = worker.Job(pending, deliver, stand_down, current_step=lambda: steps[0],
                     raising=_armed["action"] == "raise", group=group)
    if not worker.submit(job):
        if worker.failed():  # said once when it failed
            stream.stood_down = "the sync check's worker failed"
            return
        # the words say why this stream is over its quota: checks some rank has not reached, or too many to exchange
        stream.stood_down = worker.refusal_reason(job, _armed["every"], SYNC_CHECK_VAR)
        if _raising(stream):
            return  # the agreed raise (known meanwhile) is this stream's report
        reports.stood_down(stream.label, step, stream.stood_down, ("behind", stream.key), where)


def _raising(stream):
    """Whether the ranks agreed to raise this stream's divergence (not raised yet): the raise is its report, and
    its later checks are neither taken nor said."""
    return getattr(stream, "raising", None) is not None


def _raise_if_due(stream, step):
    """On the training thread: raise the divergence the worker found, at the optimizer step the ranks agreed."""
    from . import worker

    error = getattr(stream, "raising", None)
    if error is None or not worker.due_to_raise(step, stream.raise_at):
        stream.passed = step  # written after reading ``raising``: the worker reads it after writing ``raising``
        return
    stream.raising = None
    stream.stood_down = "raised"
    _unraised.pop(id(stream), None)
    if step != stream.raise_at and isinstance(error, ReplicaDivergenceError) and error.report is not None:
        error.args = (raised_words(error.report, stream.raise_at, step),)  # learnt late: the step it is raised at
    raise error


def raised_words(report, agreed, step):
    """The error's words when raised at optimizer ``step``: the step every rank agreed on, or, for a rank that
    learnt the agreed step only after passing it (its training thread ran ahead of its worker), both steps."""
    if step == agreed:
        return "%s Raised at optimizer step %d, the step every rank agreed on." % (report.message(), step)
    return ("%s Raised at optimizer step %d: the ranks agreed on step %d, which this rank had passed when it learnt "
            "it." % (report.message(), step, agreed))


def end_of_job(how):
    """The job ends (``how``: "destroy" -- its process group destroyed --, "exit" or "fork-exit") with a divergence
    the ranks agreed to raise and did not reach yet: under ``raise`` it must not end as a success. At destroy the
    error is raised from ``destroy_process_group``; at exit the process ends with status 1, said at ERROR level
    (rank 0; the others at debug level), after flushing the standard streams and logging."""
    if not _unraised:
        return
    error, rank, report, raise_at = next(iter(_unraised.values()))
    _unraised.clear()
    if how == "destroy":
        raise error
    reports.say("tpu-closure-fix: the job ended before optimizer step %d, where every rank was to raise "
                "ReplicaDivergenceError (%s=raise) for the check at step %s: this process exits with status 1. %s"
                % (raise_at, ON_DIVERGENCE_VAR, report.step, report.message()), speaker=rank == 0,
                level=logging.ERROR)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    logging.shutdown()
    os._exit(1)


def _label(optimizer, stream=None):
    """The optimizer as the user knows it: its class and its parameters' module paths, with the class of the
    module holding them (``SGD over generator.fc.weight, generator.fc.bias (in GAN)``)."""
    try:
        by_old, holders = _module_paths(optimizer, stream)
        paths = [by_old.get(name, name) for name, _ in _listed(optimizer)]
    except Exception:  # naming is a courtesy: the stream's key still says which one
        return type(optimizer).__name__
    shown = ", ".join(paths[:3]) + (", and %d more" % (len(paths) - 3) if len(paths) > 3 else "")
    within = " (in %s)" % ", ".join(sorted(holders)) if holders else ""
    return "%s over %s%s" % (type(optimizer).__name__, shown or "no parameters", within)


def _module_paths(optimizer, stream=None):
    """({``param_groups[g][i]``: module path}, {class names of the modules naming them}): the module holding
    most parameters (the model itself) names each parameter. Kept on ``stream`` for its later reports: looked
    for once per optimizer, at its first check, on the training thread (the stack holds the model then)."""
    paths = getattr(stream, "module_paths", None)
    if paths is None:
        paths = _search_module_paths(optimizer)
        if stream is not None:
            stream.module_paths = paths
    return paths


def _search_module_paths(optimizer):
    """The module paths of the optimizer's parameters, from the modules in reach of this thread's stack and the
    DDP / FSDP modules recorded when they were made (:func:`.evidence.holders`); a parameter no such module
    holds keeps its ``param_groups[g][i]`` name."""
    from . import evidence

    listed = _listed(optimizer)
    found = evidence.holders([p for _, p in listed], sys._getframe(1))
    by_old = {name: found[id(p)][0] for name, p in listed if id(p) in found}
    return by_old, {found[id(p)][2] for _, p in listed if id(p) in found}


def _listed(optimizer):
    return compare.listed(optimizer)


# Registered at arming, before the worker's own exit hook (the worker module is imported later, when torch.optim
# is): exit hooks run last-registered first, so this one runs after the worker answered the job's last checks,
# and a divergence to raise found then fails the process too.
atexit.register(end_of_job, "exit")

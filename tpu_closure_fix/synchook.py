"""Zero-code SyncCheck: compare the replicas every N optimizer steps, armed by an environment variable.

``TPU_CLOSURE_FIX_SYNC_CHECK=N`` (N optimizer steps; unset, empty or ``0``: off) and
``TPU_CLOSURE_FIX_SYNC_CHECK_ON_DIVERGENCE=warn|raise`` (default ``warn``) arm, in every process
where the activation path runs (``import tpu_closure_fix``, the start-up watcher, ``tpu-closure-fix
run``), a global optimizer step post-hook of torch
(``torch.optim.optimizer.register_optimizer_step_post_hook``, torch >= 2.0). The check is armed
also under ``TPU_CLOSURE_FIX=0``: with the fix off it is exactly the net one wants.

Why one torch hook and not a hook per framework: every framework's step -- the Lightning Trainer's
``optimizer.step(closure)`` inside ``xm.optimizer_step``, Lite/Fabric's, accelerate's, a plain loop's
``xm.optimizer_step`` with or without a closure -- ends in the optimizer's own ``step``, and torch runs
the global post-hooks after it. So one code path counts the same steps on every replica, and the
user's callback list, optimizer and loop are left exactly as they are.

Counting: per optimizer object (its ``id``; ``weakref.finalize`` forgets it when the optimizer
goes), only the outermost step counts: an optimizer whose ``step`` runs inside another optimizer's
(``ZeroRedundancyOptimizer``'s inner optimizer over this replica's shard, wrapper optimizers) is not
counted and not compared. At every N-th step of an optimizer all replicas compare that optimizer's
parameters with :func:`tpu_closure_fix.synccheck.compare_replicas` (one collective) and act: a
``TPUClosureFixWarning`` whose location is the first frame outside torch, the frameworks and this
package (the user's ``trainer.fit`` / ``optimizer.step`` line), or ``ReplicaDivergenceError``.

Limits, stated:

* Parameters that are legitimately different on every replica are left out of the comparison:
  torch_xla FSDP shards (``_is_sharded``), torch FSDP's ``FlatParameter`` shards and ``DTensor``
  parameters with a sharded placement.
* The replicas must call ``optimizer.step`` equally often (a collective runs at the N-th call):
  a replica that skips a step on its own (a gradient scaler that found an inf in its local
  gradients) shifts its checks and the collectives no longer pair up.
* Steps from several threads at once are not told apart from nested steps.

A failure inside the hook (anything but the divergence itself) is warned about once, disarms the
check, and leaves training running.
"""
import os
import sys
import warnings
import weakref

from .config import ASCII_WHITESPACE, SYNC_CHECK_VAR, TPUClosureFixWarning, quote_value

ON_DIVERGENCE_VAR = SYNC_CHECK_VAR + "_ON_DIVERGENCE"
ACTIONS = ("warn", "raise")
DEFAULT_ACTION = "warn"
#: More digits than any real step count; a longer value is refused before ``int()`` reads it.
MAX_DIGITS = 12
#: The torch module whose global hook registry arms the check.
TORCH_OPTIMIZER = "torch.optim.optimizer"
#: Top-level packages whose frames a warning's location skips, besides this package and every
#: integration's packages (the frameworks and torch_xla: ``sites.top_level_packages()``).
LIBRARY_PACKAGES = ("torch", "wrapt")

#: What is armed: steps between checks (0: off), the action, torch's hook handles.
_armed = {"every": 0, "action": DEFAULT_ACTION, "handles": None}
#: What the checks saw in this process: how many ran and the latest SyncReport (None on one device).
seen = {"checks": 0, "last_report": None}
#: id(optimizer) -> steps counted so far.
_counts = {}
#: id of the optimizer whose step is the outermost one running now (None: no step running).
_outermost = [None]
_warned = set()


# --------------------------------------------------------------------------- parsing
def parse_every(raw):
    """(every, problem) for a raw value of TPU_CLOSURE_FIX_SYNC_CHECK: unset/empty/0 -> (0, None) (off).

    Accepted: ASCII digits only (surrounding white space ignored). Anything else gives every 0 and a
    message naming the variable and the accepted values."""
    value = "" if raw is None else raw.strip(ASCII_WHITESPACE)
    if value == "":
        return 0, None
    if len(value) <= MAX_DIGITS and value.isascii() and value.isdigit():
        return int(value), None
    return 0, ("%s=%s is not an accepted value; accepted: a whole number of optimizer steps between checks "
               "(ASCII digits, e.g. 100), or 0 / unset (off). The zero-code sync check stays off."
               % (SYNC_CHECK_VAR, quote_value(raw)))


def parse_action(raw):
    """(action, problem) for a raw value of TPU_CLOSURE_FIX_SYNC_CHECK_ON_DIVERGENCE: unset/empty -> warn."""
    value = "" if raw is None else raw.strip(ASCII_WHITESPACE)
    if value == "":
        return DEFAULT_ACTION, None
    if value.isascii() and value.lower() in ACTIONS:
        return value.lower(), None
    return DEFAULT_ACTION, ("%s=%s is not an accepted value; accepted: warn (the default) or raise. Using warn."
                            % (ON_DIVERGENCE_VAR, quote_value(raw)))


def _warn_once(key, message):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, TPUClosureFixWarning, stacklevel=3)


# --------------------------------------------------------------------------- arming
def arm_from_environment(environ=None):
    """Arm the check as the two variables say (a bad value: one warning, then off / warn). Returns every."""
    environ = os.environ if environ is None else environ
    every, problem = parse_every(environ.get(SYNC_CHECK_VAR))
    if problem:
        _warn_once(("value", SYNC_CHECK_VAR, environ.get(SYNC_CHECK_VAR)), problem)
    if not every:
        return 0
    action, problem = parse_action(environ.get(ON_DIVERGENCE_VAR))
    if problem:
        _warn_once(("value", ON_DIVERGENCE_VAR, environ.get(ON_DIVERGENCE_VAR)), problem)
    arm(every, action)
    return every


def arm(every, action=DEFAULT_ACTION):
    """Check every ``every`` optimizer steps from now on; the hooks go in when torch.optim is imported."""
    _armed["every"], _armed["action"] = every, action
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

        _warn_once("torch", "tpu-closure-fix: %s needs torch >= 2.0 "
                            "(torch.optim.optimizer.register_optimizer_step_post_hook); torch %s has none, so the "
                            "zero-code sync check is off. Use SyncCheck or check_sync in the code instead."
                   % (SYNC_CHECK_VAR, getattr(torch, "__version__", "?")))
        return
    _armed["handles"] = (register_pre(_before_step), register_post(_after_step))


def disarm():
    """Take the hooks out of torch's registry and forget every count."""
    handles, _armed["handles"] = _armed["handles"], None
    _armed["every"] = 0
    for handle in handles or ():
        handle.remove()
    _counts.clear()
    _outermost[0] = None


def armed_every():
    """Steps between checks when torch's live registry holds this module's post-hook, else 0."""
    module = sys.modules.get(TORCH_OPTIMIZER)
    registry = getattr(module, "_global_optimizer_post_hooks", None)
    if registry is None or not any(hook is _after_step for hook in list(registry.values())):
        return 0
    return _armed["every"]


def status_line(environ=None):
    """One line for ``tpu-closure-fix status``: is the zero-code check armed in this process, and why."""
    environ = os.environ if environ is None else environ
    every = armed_every()
    if every:
        return ("zero-code sync check: armed, every %d optimizer steps, on divergence: %s (torch's optimizer "
                "step hook registry holds it)" % (every, _armed["action"]))
    raw = environ.get(SYNC_CHECK_VAR)
    wanted, problem = parse_every(raw)
    if problem:
        return "zero-code sync check: off (%s)" % problem.split(";")[0]
    if not wanted:
        return "zero-code sync check: off (%s unset or 0)" % SYNC_CHECK_VAR
    if TORCH_OPTIMIZER not in sys.modules:
        return ("zero-code sync check: not armed: torch.optim is not imported in this process (%s=%d arms it "
                "when it is)" % (SYNC_CHECK_VAR, wanted))
    return "zero-code sync check: NOT armed although %s=%d (see the warnings above)" % (SYNC_CHECK_VAR, wanted)


# --------------------------------------------------------------------------- the hooks
def _before_step(optimizer, args, kwargs):
    """Note the outermost optimizer step (a step already noted for this optimizer ended in an exception)."""
    outer = _outermost[0]
    if outer is None or outer == id(optimizer):
        _outermost[0] = id(optimizer)


def _after_step(optimizer, args, kwargs):
    """Count the step of the outermost optimizer; at every N-th one compare and act."""
    if _outermost[0] != id(optimizer):
        return  # a step inside another optimizer's step: its outer optimizer counts
    _outermost[0] = None
    every = _armed["every"]
    if not every:
        return
    from .synccheck import ReplicaDivergenceError

    try:
        step = _count(optimizer)
        if step % every == 0:
            _check(optimizer, step)
    except ReplicaDivergenceError:
        raise
    except Exception as exc:  # never break training: warn once, disarm
        disarm()
        _warn_once("failed", "tpu-closure-fix: the zero-code sync check failed (%s: %s) and is now off; "
                             "training goes on." % (type(exc).__name__, exc))


def _count(optimizer):
    key = id(optimizer)
    count = _counts.get(key)
    if count is None:
        count = 0
        try:
            finalizer = weakref.finalize(optimizer, _counts.pop, key, None)
            finalizer.atexit = False
        except TypeError:  # not weak-referenceable: counted until the process ends
            pass
    count += 1
    _counts[key] = count
    return count


def _check(optimizer, step):
    from . import synccheck

    named = compared_parameters(optimizer)
    report = synccheck.compare_replicas(named, step)
    seen["checks"] += 1
    seen["last_report"] = report
    synccheck._act(report, _armed["action"], stacklevel=_user_stacklevel())


def compared_parameters(optimizer):
    """[(name, tensor)] of the optimizer's parameters, shards left out (they differ per replica by design)."""
    out = []
    for g, group in enumerate(optimizer.param_groups):
        for i, param in enumerate(group["params"]):
            if not is_sharded(param):
                out.append(("param_groups[%d][%d] %s" % (g, i, "x".join(str(n) for n in param.shape)), param))
    return out


def is_sharded(param):
    """Whether a parameter holds only this replica's shard: torch_xla FSDP, torch FSDP, a sharded DTensor."""
    if getattr(param, "_is_sharded", False):
        return True
    names = {cls.__name__ for cls in type(param).__mro__}
    if "FlatParameter" in names:
        return True
    if "DTensor" in names:
        placements = getattr(param, "placements", ())
        return any(type(p).__name__ != "Replicate" for p in placements)
    return False


def _user_stacklevel():
    """The ``stacklevel`` for a warning issued in ``synccheck._act`` called by :func:`_check`: the first frame
    outside torch, the frameworks and this package (level 1 is ``_act``, 2 is ``_check``)."""
    prefixes = tuple(_library_dirs())
    frame, level = sys._getframe(1), 2  # _check's frame
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(prefixes):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 2


def _library_dirs():
    from .sites import top_level_packages

    yield os.path.dirname(os.path.abspath(__file__)) + os.sep
    for name in LIBRARY_PACKAGES + tuple(sorted(top_level_packages())):
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            yield os.path.dirname(os.path.abspath(path)) + os.sep

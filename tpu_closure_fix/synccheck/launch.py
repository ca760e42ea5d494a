"""The host channel handed over where torch_xla starts the replicas: a store only the job knows.

Replicas of torch_xla without a process group (``xmp.spawn``, ``torch_xla.launch``, Lightning's and
accelerate's XLA launchers: all end in ``torch_xla._internal.pjrt.run_multiprocess``; ``spawn_threads``
starts them as threads of the calling process) have no store in common. While the replicas run, the process
that starts them holds the check's store: a ``TCPStore`` listening on 127.0.0.1 only, at a port the kernel
picks (the socket is bound before any replica starts, so no other program can take it meanwhile), holding the
job's mark under a secret (``secrets.token_hex(16)``). Its channel, ``127.0.0.1:PORT:SECRET:made``, is put in
the process's environment, which the replicas inherit (:data:`.comm.CHANNEL_VAR`), and taken out again when
they end. The replicas of one such start are all on this host (across hosts each host starts its own, and
the check then stands down, saying so: :func:`.comm.world_is_local`).

A channel already in the environment (the user's, set alike on every host of a pod; or an outer start's)
stands as it is. Nothing here breaks the start: a store that cannot be made is said once, and the replicas'
checks stand down saying why.
"""
import contextlib
import os
import threading

from .. import settings
from . import comm

#: torch_xla's module whose functions start the replicas, and those functions.
PJRT = "torch_xla._internal.pjrt"
STARTERS = ("run_multiprocess", "spawn_threads")
_state = {"watching": False}
_lock = threading.Lock()


def watch():
    """Hand a channel over at every start of replicas by torch_xla in this process, from now on (once)."""
    with _lock:
        if _state["watching"]:
            return
        _state["watching"] = True
    import wrapt  # a runtime dependency

    wrapt.register_post_import_hook(_wrap_starters, PJRT)


def _wrap_starters(module):
    """Wrap ``module``'s starters (each once); a failure is said once and the starter is left as it is."""
    import wrapt

    for name in STARTERS:
        current = getattr(module, name, None)
        if current is None or isinstance(current, wrapt.FunctionWrapper):
            continue
        try:
            wrapt.wrap_function_wrapper(module, name, _starting)
        except Exception as exc:
            _say_once("wrap", "tpu-closure-fix: could not watch %s.%s (%s: %s): the sync check of replicas it "
                              "starts stands down." % (PJRT, name, type(exc).__name__, exc))


def _starting(wrapped, instance, args, kwargs):
    with handing_over():
        return wrapped(*args, **kwargs)


@contextlib.contextmanager
def handing_over(environ=None):
    """While the body runs (it starts the replicas): the check's store made here and its channel in
    ``environ`` (default ``os.environ``: the replicas' inheritance). A channel already set stands."""
    environ = os.environ if environ is None else environ
    if settings.of(environ).peek(comm.CHANNEL_VAR) != (None, None):  # any value, a bad one too: the replicas say it
        yield None
        return
    made = _make()
    if made is None:
        yield None
        return
    store, value = made
    # Read by each replica when it reaches the store (comm.handed_channel reads the variable then, not the settings
    # kept at activation): replica threads of this process and forked children hold settings read before this line.
    environ[comm.CHANNEL_VAR] = value
    try:
        yield value
    finally:
        if environ.get(comm.CHANNEL_VAR) == value:
            del environ[comm.CHANNEL_VAR]
        del store  # the replicas have ended: the store stops listening with its last reference


def _make():
    """(store, channel value) of a new store on loopback under a new secret; None when none can be made
    (said once)."""
    import secrets

    secret = secrets.token_hex(comm.SECRET_DIGITS // 2)
    try:
        store = comm.make_store("127.0.0.1", 0, secret, comm._timeout(None))
        return store, "127.0.0.1:%d:%s:%s" % (store.port, secret, comm.MADE)
    except Exception as exc:
        _say_once("make", "tpu-closure-fix: the sync check could not make its store for the replicas started here "
                          "(%s: %s): their checks stand down." % (type(exc).__name__, comm._short(str(exc))))
        return None


def _say_once(key, message):
    from .report import say_once

    say_once(("launch", key), message)

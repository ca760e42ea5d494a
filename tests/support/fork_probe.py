"""Fork while another thread holds the locks the shim takes; do the forked children hang?

``python -m support.fork_probe MODE``: imports tpu_closure_fix (the shim on), starts a thread that holds
the engine's lock and wrapt's post-import hook lock -- in the order ``enable()`` takes them, as a thread
inside ``enable()`` does -- and, while it holds them, forks 30 children at once.  Each child calls
``tpu_closure_fix.status()`` and registers a wrapt post-import hook (both take those locks) under a
20 s alarm.  Prints ``PROBE {"finished": n, "hung": n}``.

MODE ``shim``: as installed.  MODE ``handler-undone`` (the twin): each child first puts back the lock
objects the thread held, undoing what the shim's ``os.register_at_fork`` handler did.
"""
import json
import os
import signal
import sys
import threading

CHILDREN = 30
ALARM = 20


def child(held_locks, undo):
    signal.alarm(ALARM)  # SIGALRM's default action ends the child: the parent sees it as hung
    import wrapt.importer

    from tpu_closure_fix import engine

    if undo:
        engine._state.lock, wrapt.importer._post_import_hooks_lock = held_locks
    import tpu_closure_fix

    tpu_closure_fix.status()
    wrapt.register_post_import_hook(lambda module: None, "support_fork_probe_never_imported")
    os._exit(0)


def main(mode):
    import tpu_closure_fix  # noqa: F401 - the shim on, as in a training script
    import wrapt.importer

    from tpu_closure_fix import engine

    held_locks = (engine._state.lock, wrapt.importer._post_import_hooks_lock)
    holding, release = threading.Event(), threading.Event()

    def hold():
        with held_locks[0], held_locks[1]:
            holding.set()
            release.wait()

    thread = threading.Thread(target=hold)
    thread.start()
    holding.wait()
    pids = []
    for _ in range(CHILDREN):
        pid = os.fork()
        if pid == 0:
            try:
                child(held_locks, undo=(mode == "handler-undone"))
            finally:
                os._exit(1)
        pids.append(pid)
    release.set()
    thread.join()
    finished = hung = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM:
            hung += 1
        elif os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            finished += 1
    print("PROBE " + json.dumps({"finished": finished, "hung": hung, "children": CHILDREN}))


if __name__ == "__main__":
    main(sys.argv[1])

"""A thread-leak guard written as Lightning's ``thread_police`` fixture (tests/tests_pytorch/conftest.py): every
thread started since ``before`` must be gone, or be a daemon thread with a callable ``stop`` (or ``exit``), which
the guard calls and after which the thread must have ended."""
import threading


def zombies(before):
    """The names of the threads a guard like ``thread_police`` would fail on (after calling each daemon thread's
    ``stop``/``exit``)."""
    left = []
    for thread in set(threading.enumerate()) - set(before):
        stop = getattr(thread, "stop", None) or getattr(thread, "exit", None)
        if thread.daemon and callable(stop):
            stop()
            if thread.is_alive():
                left.append("%s (alive after stop)" % thread.name)
        elif thread.is_alive():
            left.append(thread.name)
    return sorted(left)

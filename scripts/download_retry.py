"""Retry a package download once: a transient index failure (a dropped connection, a hash mismatch of a file
being replaced on a mirror) should not end a run that a second try a few seconds later gets through.

Used by scripts/targets.py and scripts/pythons.py; scripts/retry.sh is the same rule for the shell scripts.
``TPU_CLOSURE_FIX_RETRY_PAUSE`` sets the seconds between the tries (default 10).
"""
import os
import sys
import time

#: Seconds between the failed try and the second one, unless TPU_CLOSURE_FIX_RETRY_PAUSE says otherwise.
PAUSE = 10.0


def pause_seconds():
    try:
        return max(0.0, float(os.environ.get("TPU_CLOSURE_FIX_RETRY_PAUSE", PAUSE)))
    except ValueError:
        return PAUSE


def retry_once(attempt, what, ok=lambda result: result.returncode == 0, log=None):
    """``attempt()``, and once more after a pause when ``ok(result)`` is false; the last result.

    ``what`` names the download in the one line said before the second try (on stderr, or ``log``)."""
    result = attempt()
    if ok(result):
        return result
    say = log or (lambda line: sys.stderr.write(line + "\n"))
    say("== %s failed; trying once more in %.0f s" % (what, pause_seconds()))
    time.sleep(pause_seconds())
    return attempt()

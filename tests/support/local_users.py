"""A second local user for the tests of what another user can do to the tool (plant files it may run).

The second user is uid/gid 65534 (``nobody``), reached through ``setpriv``: that needs root. Tests that
act as that user are marked :data:`second_user` and are skipped, with that reason, elsewhere.
"""
import os
import shlex
import shutil
import subprocess
import tempfile

import pytest

NOBODY = 65534
SETPRIV = shutil.which("setpriv")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0

second_user = pytest.mark.skipif(not (IS_ROOT and SETPRIV),
                                 reason="acting as a second local user needs root and setpriv (uid 65534)")


def as_nobody(script):
    """Run a shell script as the second local user; returns the CompletedProcess (failures are expected)."""
    return subprocess.run([SETPRIV, "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups", "--",
                           "/bin/sh", "-c", script], capture_output=True, text=True, timeout=60)


def shared_directory():
    """A new directory like /tmp (mode 1777: every user may create files in it); remove it when done."""
    path = tempfile.mkdtemp(prefix="tcf-shared-", dir="/tmp")
    os.chmod(path, 0o1777)
    return path


def plant(path, text):
    """As the second user: create the file ``path`` (and its missing directories) holding ``text``.

    Raises AssertionError when that user could not, so a test never passes on a file that is not there.
    """
    script = "umask 022; mkdir -p {d} && printf %s {text} > {f}".format(
        d=shlex.quote(os.path.dirname(path)), text=shlex.quote(text), f=shlex.quote(path))
    proc = as_nobody(script)
    assert proc.returncode == 0 and os.stat(path).st_uid == NOBODY, "uid %d could not plant %s: %s" % (
        NOBODY, path, proc.stderr)


#: What a planted module does: leave proof that it ran (as the victim), then fail its import.
MARKER_CODE = "open(%r, 'a').write(%r + '\\n')\nraise ImportError('planted module')\n"


def plant_markers(directory, module_names, marker):
    """As the second user, plant ``<name>.py`` in ``directory`` for each name: each appends its name to
    ``marker`` when it runs."""
    for name in module_names:
        plant(os.path.join(directory, name.replace(".", os.sep) + ".py"), MARKER_CODE % (marker, name))


def ran(marker):
    """The names of the planted modules that ran (in order), from the marker file."""
    if not os.path.exists(marker):
        return []
    with open(marker) as handle:
        return handle.read().split()

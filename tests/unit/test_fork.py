"""A fork while another thread holds the shim's locks (a thread inside ``enable()``): the children must
not hang in ``status()`` or at their next import hook.  ``os.register_at_fork`` re-creates the locks in
the child; the twin undoes that in each child and every child hangs (ended by its 20 s alarm)."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(REPO, "tests")

pytestmark = pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="os.fork is POSIX only")


def fork_probe(mode):
    env = {k: v for k, v in os.environ.items() if k != "TPU_CLOSURE_FIX"}
    env["PYTHONPATH"] = os.pathsep.join([REPO, TESTS])
    proc = subprocess.run([sys.executable, "-m", "support.fork_probe", mode], env=env, capture_output=True,
                          text=True, timeout=300, cwd=TESTS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("PROBE ")][-1][6:])


def test_children_forked_while_a_thread_holds_the_locks_never_hang():
    assert fork_probe("shim") == {"finished": 30, "hung": 0, "children": 30}


def test_children_keeping_the_held_locks_hang_twin():
    assert fork_probe("handler-undone") == {"finished": 0, "hung": 30, "children": 30}

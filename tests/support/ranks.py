"""One harness for N-rank replica tests: start ``world`` processes of a scenario, joined over gloo, and read
what each one did.

``run_ranks(scenario, world, tmp_path)`` starts, at once, ``world`` children of::

    python -m support.pod_scenarios --scenario NAME --rank R --world W --port P --out FILE [args...]

(rendezvous ``tcp://127.0.0.1:P``, P from :func:`support.ports.free_port`), each with one thread
(``OMP_NUM_THREADS=1``) and ``PYTHONPATH`` = the working tree, its start-up module, the tests folder (in
that order, so the working tree's ``tpu_closure_fix`` and ``_tpu_closure_fix_startup`` shadow any
installed copy), every inherited ``TPU_CLOSURE_FIX*`` variable removed (but the port block) and then
``env`` applied. All children share one hard deadline (``timeout`` seconds): at the deadline every
child still running is killed with its whole process group (:func:`tpu_closure_fix.verify.child.run_children`),
so a hung collective fails the test instead of stalling it.

Per rank it returns a :class:`Rank`: the return code, whether it timed out, the wall-clock seconds the
child measured itself (``payload["seconds"]``; None when it wrote nothing) and those the parent measured,
the stderr tail, and the JSON the child wrote (see :mod:`support.pod_scenarios`): ``warnings`` (every
``TPUClosureFixWarning`` with its message), ``reports`` (``SyncReport.as_dict()`` plus ``message``),
``hook`` (the zero-code check's counters), ``error`` (the exception the scenario ended with, or None),
``result`` (scenario facts).

Options: ``kill_rank``: that rank gets ``--kill`` (the scenario decides where it dies); ``args``: extra
arguments for every rank (``--variant twin``...); ``launcher``: an argv prefix that starts the child
(``[python, "-m", "tpu_closure_fix", "run", "--", ]``) -- the child is then started as a script
(``python .../support/pod_scenarios.py``) the way a user starts ``train.py``.
"""
import os
import sys
from collections import namedtuple

from support import ports

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
REPO = os.path.dirname(TESTS)
STARTUP = os.path.join(REPO, "startup")
SCENARIOS_FILE = os.path.join(HERE, "pod_scenarios.py")
DEFAULT_TIMEOUT = 180


class Rank(namedtuple("Rank", "rank returncode timed_out seconds parent_seconds stderr payload error")):
    """What one rank did; ``payload`` is its JSON result (None when it wrote none)."""

    __slots__ = ()

    @property
    def warnings(self):
        return (self.payload or {}).get("warnings", [])

    @property
    def messages(self):
        return [w["message"] for w in self.warnings]

    @property
    def reports(self):
        return (self.payload or {}).get("reports", [])

    @property
    def hook(self):
        return (self.payload or {}).get("hook", {})

    @property
    def result(self):
        return (self.payload or {}).get("result", {})

    @property
    def failure(self):
        return (self.payload or {}).get("error")

    def stderr_tail(self, chars=3000):
        return (self.stderr or "")[-chars:]

    def describe(self):
        return "rank %d: rc=%s timed_out=%s error=%s\n%s" % (self.rank, self.returncode, self.timed_out, self.error,
                                                           self.stderr_tail())


def child_environment(env=None):
    """The environment every rank starts with (see the module docstring)."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("TPU_CLOSURE_FIX") or k == ports.BLOCK_VARIABLE}
    base.pop("PYTHONWARNINGS", None)
    base.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([REPO, STARTUP, TESTS]))
    base.update(env or {})
    return base


def run_ranks(scenario, world, tmp_path, env=None, timeout=DEFAULT_TIMEOUT, kill_rank=None, args=None,
              launcher=None):
    """Run ``scenario`` on ``world`` ranks; a list of :class:`Rank`, by rank (see the module docstring)."""
    from tpu_closure_fix.verify.child import run_children

    port = ports.free_port()
    tag = "%s-%d-%d" % (scenario, world, port)
    outs = [str(tmp_path / ("%s-rank%d.json" % (tag, rank))) for rank in range(world)]
    start = [sys.executable, "-m", "support.pod_scenarios"] if launcher is None else \
        list(launcher) + [sys.executable, SCENARIOS_FILE]
    commands = []
    for rank, out in enumerate(outs):
        command = start + ["--scenario", scenario, "--rank", str(rank), "--world", str(world), "--port", str(port),
                           "--out", out] + [str(a) for a in (args or [])]
        if kill_rank is not None and rank == kill_rank:
            command.append("--kill")
        commands.append(command)
    runs = run_children(commands, timeout, env=child_environment(env), cwd=str(tmp_path), result_files=outs)
    return [Rank(rank, run.returncode, run.timed_out, (run.payload or {}).get("seconds"), run.seconds, run.stderr,
                 run.payload, run.error) for rank, run in enumerate(runs)]


def assert_all_ok(ranks):
    """Every rank exited 0, in time, with its result written and no scenario error."""
    for r in ranks:
        assert r.returncode == 0 and not r.timed_out and r.payload is not None and r.failure is None, r.describe()

"""One harness for N-rank replica tests: start ``world`` processes, joined over gloo, and read what each one did.

The parent's side
-----------------

:func:`launch` starts, at once, ``world`` children of::

    START... --rank R --world W --port P --out FILE [arguments...]

(rendezvous ``tcp://127.0.0.1:P``, P from :func:`support.ports.free_port`; one result file per rank). All
children share one hard deadline (``timeout`` seconds): at the deadline every child still running is killed
with its whole process group (:func:`tpu_closure_fix.verify.child.run_children`), so a hung collective fails
the test instead of stalling it. Per rank it returns a :class:`Rank`: the return code, whether it timed out,
the wall-clock seconds the child measured itself (``payload["seconds"]``; None when it wrote nothing) and
those the parent measured, stdout and stderr, and the JSON the child wrote (``payload``).

Two ways in:

* :func:`run_ranks` runs one SyncCheck pod scenario (``python -m support.pod_scenarios --scenario NAME``),
  each child with one thread (``OMP_NUM_THREADS=1``) and ``PYTHONPATH`` = the working tree, its start-up
  module, the tests folder (in that order, so the working tree's ``tpu_closure_fix`` and
  ``_tpu_closure_fix_startup`` shadow any installed copy), every inherited ``TPU_CLOSURE_FIX*`` variable
  removed (but the port block) and then ``env`` applied. Options: ``kill_rank``: that rank gets ``--kill``
  (the scenario decides where it dies); ``args``: extra arguments for every rank (``--variant twin``...);
  ``launcher``: an argv prefix that starts the child (``[python, "-m", "tpu_closure_fix", "run", "--", ]``)
  -- the child is then started as a script (``python .../support/pod_scenarios.py``) the way a user starts
  ``train.py``. The payload's keys (see :mod:`support.pod_scenarios`) are read by the :class:`Rank`
  properties: ``warnings``, ``reports``, ``hook``, ``error`` (:attr:`Rank.failure`), ``result``.
* :func:`run_replicas` runs an integration's replica module (``python -m support.replica --scenarios
  JSON``, :mod:`support.accelerate_replica`...) in the environment the caller gives (the target's path, the
  shim on or off) and returns rank -> payload once every rank has finished.

The child's side
----------------

:class:`Replica` is one rank of an integration's replica module: it reads the command line above
(``--scenarios`` JSON), joins the gloo group, lets the integration import its framework and the torch_xla
stand-in, trains every scenario, writes the JSON result and leaves without interpreter teardown. An
integration subclasses it and adds only what differs: ``setup`` (what it imports, in which order),
``train`` (its model wrapper and its step call), ``reference`` (rank 0's plain-PyTorch trajectory) and
``sites`` (its call sites' state).
"""
import argparse
import json
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


class Rank(namedtuple("Rank", "rank returncode timed_out seconds parent_seconds stderr payload error stdout")):
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
        return "rank %d: rc=%s timed_out=%s error=%s\n%s%s" % (self.rank, self.returncode, self.timed_out, self.error,
                                                             (self.stdout or "")[-2000:], self.stderr_tail())


# --------------------------------------------------------------------------- the parent's side
def child_environment(env=None):
    """The environment every pod rank starts with (see the module docstring)."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("TPU_CLOSURE_FIX") or k == ports.BLOCK_VARIABLE}
    base.pop("PYTHONWARNINGS", None)
    base.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([REPO, STARTUP, TESTS]))
    base.update(env or {})
    return base


def launch(start, world, tmp_path, arguments, environment, timeout=DEFAULT_TIMEOUT, cwd=None, tag="rank",
           kill_rank=None):
    """Start ``world`` ranks of ``start`` (an argv prefix) at once; a list of :class:`Rank`, by rank.

    Every rank gets ``--rank R --world W --port P --out FILE`` (one port, one result file each under
    ``tmp_path``, named after ``tag``), then ``arguments``; the rank ``kill_rank`` also gets ``--kill``.
    ``cwd`` defaults to ``tmp_path``."""
    from tpu_closure_fix.verify.child import run_children

    port = ports.free_port()
    outs = [str(tmp_path / ("%s-%d-%d-rank%d.json" % (tag, world, port, rank))) for rank in range(world)]
    commands = []
    for rank, out in enumerate(outs):
        command = list(start) + ["--rank", str(rank), "--world", str(world), "--port", str(port), "--out", out]
        command += [str(a) for a in arguments]
        if kill_rank is not None and rank == kill_rank:
            command.append("--kill")
        commands.append(command)
    runs = run_children(commands, timeout, env=environment, cwd=str(cwd or tmp_path), result_files=outs)
    return [Rank(rank, run.returncode, run.timed_out, (run.payload or {}).get("seconds"), run.seconds, run.stderr,
                 run.payload, run.error, run.stdout) for rank, run in enumerate(runs)]


def run_ranks(scenario, world, tmp_path, env=None, timeout=DEFAULT_TIMEOUT, kill_rank=None, args=None,
              launcher=None):
    """Run the pod ``scenario`` on ``world`` ranks; a list of :class:`Rank`, by rank (see the module docstring)."""
    start = [sys.executable, "-m", "support.pod_scenarios"] if launcher is None else \
        list(launcher) + [sys.executable, SCENARIOS_FILE]
    return launch(start, world, tmp_path, ["--scenario", scenario] + list(args or []), child_environment(env),
                  timeout, tag=scenario, kill_rank=kill_rank)


def run_replicas(module, scenarios, world, tmp_path, environment, timeout=DEFAULT_TIMEOUT, python=None):
    """Run ``python -m module --scenarios JSON`` on ``world`` ranks from the tests folder; rank -> its JSON
    result. Fails, with every rank's output, unless each rank exited 0 in time with its result written."""
    start = [python or sys.executable, "-m", module]
    runs = launch(start, world, tmp_path, ["--scenarios", json.dumps(scenarios)], environment, timeout, cwd=TESTS,
                  tag=module.rsplit(".", 1)[-1])
    assert_all_finished(runs)
    return {run.rank: run.payload for run in runs}


def assert_all_finished(ranks):
    """Every rank exited 0, in time, with its result written (what the result says is the test's to judge)."""
    for r in ranks:
        assert r.error is None, r.describe()


def assert_all_ok(ranks):
    """Every rank exited 0, in time, with its result written and no scenario error."""
    assert_all_finished(ranks)
    for r in ranks:
        assert r.failure is None, r.describe()


# --------------------------------------------------------------------------- the child's side
def join_gloo(rank, world, port, timeout=None):
    """Join the ranks' process group (rendezvous on 127.0.0.1:``port``); ``timeout`` in seconds bounds how
    long a collective waits for a partner (None: torch's default)."""
    import datetime

    import torch.distributed as dist

    options = {} if timeout is None else {"timeout": datetime.timedelta(seconds=timeout)}
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world, **options)


def write_result(path, payload, default=None):
    """Write the rank's JSON result: to a side file first, renamed at the end, so the parent never reads
    half a file (``default``: json.dump's, for values JSON has no type for)."""
    with open(path + ".part", "w") as handle:
        json.dump(payload, handle, default=default)
    os.replace(path + ".part", path)


def leave(code=0):
    """End the rank now: its result is written. No interpreter teardown: gloo's background threads can abort
    it ("terminate called without an active exception", exit -6) when a peer is already gone."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Replica(object):
    """One rank of an integration's replica module: ``python -m support.<module> --rank R --world W --port P
    --scenarios JSON --out FILE``; :meth:`main` runs it.

    The default :meth:`run` imports through :meth:`setup`, then for each scenario clears the torch_xla
    stand-in's event log, calls :meth:`train` and adds the events it recorded and (rank 0) the
    :meth:`reference` trajectory; the result is ``setup``'s header, ``scenarios`` (name -> entry) and
    :meth:`sites`. Modules whose result has another shape override :meth:`run`.
    """

    #: ``--world`` when not given.
    default_world = 1
    #: Seconds a collective waits for a partner (None: torch's default).
    join_timeout = None
    #: Wait for every rank before leaving; off where a rank may have no partner left to wait with.
    final_barrier = True

    def __init__(self, args):
        self.rank, self.world, self.port = args.rank, args.world, args.port

    @classmethod
    def arguments(cls, argv=None):
        parser = argparse.ArgumentParser(description=cls.__doc__.splitlines()[0] if cls.__doc__ else None)
        parser.add_argument("--rank", type=int, default=0)
        parser.add_argument("--world", type=int, default=cls.default_world)
        parser.add_argument("--port", type=int, default=0)
        parser.add_argument("--scenarios", required=True, help="JSON: the scenarios this rank runs")
        parser.add_argument("--out", required=True)
        return parser.parse_args(argv)

    @classmethod
    def main(cls, argv=None):
        args = cls.arguments(argv)
        replica = cls(args)
        replica.join()
        write_result(args.out, replica.run(json.loads(args.scenarios)))
        replica.finish()

    def join(self):
        if self.world > 1:
            join_gloo(self.rank, self.world, self.port, self.join_timeout)

    def finish(self):
        if self.world > 1 and self.final_barrier:
            import torch.distributed as dist

            dist.barrier()
        leave(0)

    # ------------------------------------------------------------------ what an integration says
    def setup(self):
        """Make the framework and the torch_xla stand-in importable, in the integration's order, then import
        ``tpu_closure_fix`` (``TPU_CLOSURE_FIX`` decides, as for a user); the result's header."""
        raise NotImplementedError

    def train(self, scenario):
        """Train one scenario on this rank; its entry of the result (``params`` after every step...)."""
        raise NotImplementedError

    def reference(self, scenario):
        """Rank 0 only: the plain-PyTorch trajectory the replicas must match (None: none)."""
        return None

    def sites(self):
        """What the integration's call sites look like after training, merged into the result."""
        return {}

    def run(self, scenarios):
        from support import xla_standin

        results = dict(self.setup(), scenarios={})
        for scenario in scenarios:
            xla_standin.clear()
            entry = self.train(scenario)
            entry["events"] = [[name, info] for name, info in xla_standin.events]
            if self.rank == 0:
                entry["reference"] = self.reference(scenario)
            results["scenarios"][scenario["name"]] = entry
        results.update(self.sites())
        return results


def call_site(key, *fields):
    """One call site's state in this process: ``wrapped`` (is the attribute our wrapper) and the finding's
    ``fields`` (``verdict``, ``reason``, ``variant``, ``release``); None when its module is not loaded."""
    from tpu_closure_fix import engine

    module = sys.modules.get(key[0])
    if module is None:
        return None
    class_name, attr = engine.split_qualname(key[1])
    owner = module if class_name is None else getattr(module, class_name, None)
    if class_name is not None and not isinstance(owner, type):
        return None
    finding = engine.examine(key)
    known = {"verdict": finding.verdict, "reason": finding.reason, "release": finding.release,
             "variant": finding.site.variant if finding.site else None}
    state = {"wrapped": engine.is_ours(vars(owner).get(attr))}
    state.update((name, known[name]) for name in fields)
    return state

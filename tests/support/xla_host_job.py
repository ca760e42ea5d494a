"""A torch_xla job without a process group, started the way ``xmp.spawn`` starts one: a launcher process calls
``torch_xla._internal.pjrt.run_multiprocess``, which starts one replica process per rank; the zero-code check
armed in every process. What the check's host channel makes of it when other programs share the host.

``python -m support.xla_host_job launch --world W --scenario same|different --steps N --out-dir DIR
[--hold FILE] [--direct] [--hosts H]`` (and ``plain --rank R --world W --out-dir DIR``: :func:`plain`):

* the launcher installs a stand-in ``torch_xla._internal.pjrt`` (its ``run_multiprocess`` starts the replica
  processes with the launcher's environment at that moment, as torch_xla's process pool does, and waits for
  them), then calls it through the module, as ``xmp.spawn`` does; ``--direct``: the replicas are started
  without it (a job started another way: nothing handed over);
* each replica (``replica --rank R ...``) configures the torch_xla test double (support.xla_standin) as
  replica R of W, one replica per process, on ``--hosts`` hosts, trains ``--steps`` plain optimizer steps on
  its own data (``different``) or on the same data (``same``) and writes ``DIR/rank-R.json``: its steps and
  error, every message the check said, the checks it answered, the port of the channel it was handed (never
  the secret). With ``--hold FILE`` rank 0 writes ``DIR/ready`` (that port) after its third step and every
  replica waits there until FILE exists (another program runs meanwhile).
"""
import argparse
import json
import os
import subprocess
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
HOLD_WAIT = 120


def _stand_in_pjrt(args):
    """Install ``torch_xla._internal.pjrt`` whose ``run_multiprocess`` starts the replica processes; the
    post-import hooks registered for it run, as for a real import."""
    module = types.ModuleType("torch_xla._internal.pjrt")

    def run_multiprocess(fn, *fn_args, **kwargs):
        return fn(*fn_args)

    module.run_multiprocess = run_multiprocess
    module.spawn_threads = run_multiprocess
    sys.modules["torch_xla._internal.pjrt"] = module
    import wrapt

    wrapt.notify_module_loaded(module)
    return module


def _start_replicas(args):
    """The replica processes, with this process's environment now; their exit codes."""
    command = [sys.executable, "-m", "support.xla_host_job", "replica", "--world", str(args.world), "--scenario",
               args.scenario, "--steps", str(args.steps), "--out-dir", args.out_dir, "--hosts", str(args.hosts)]
    if args.hold:
        command += ["--hold", args.hold]
    children = [subprocess.Popen(command + ["--rank", str(rank)], cwd=TESTS, env=dict(os.environ))
                for rank in range(args.world)]
    return [child.wait() for child in children]


def launch(args):
    import tpu_closure_fix  # noqa: F401  (arms the check, as the start-up hook does on a user's launcher)
    import torch  # noqa: F401

    if args.direct:
        codes = _start_replicas(args)
    else:
        pjrt = _stand_in_pjrt(args)
        codes = pjrt.run_multiprocess(_start_replicas, args)
    return 0 if all(code == 0 for code in codes) else 1


def replica(args):
    from support import xla_standin
    from support.said import record_into

    xla_standin.configure(args.world, args.rank, hosts=args.hosts)
    xm = xla_standin.install()
    said = []

    class Messages(list):
        def append(self, entry):
            said.append(entry["message"])

    record_into(Messages())
    import torch

    torch.set_num_threads(1)
    import tpu_closure_fix  # noqa: F401  (arms the zero-code check from the environment)
    from support.xla_host_replicas import train
    from tpu_closure_fix.synccheck import comm, hook, worker

    handed = comm.parse_channel(os.environ.get(comm.CHANNEL_VAR))[0]
    steps = {"done": 0}

    def sync():
        steps["done"] += 1
        if args.hold and steps["done"] == 3:
            _hold(args, handed)

    result = {"steps": 0, "error": None}
    try:
        result["steps"] = train(args.rank, args.scenario, args.steps, torch.device("cpu"), sync)
    except Exception as exc:
        result["error"] = "%s: %s" % (type(exc).__name__, exc)
    drained = worker.drain(60)
    result.update(said=said, checks=hook.seen["checks"], drained=drained, xm_collectives=[],
                  port=None if handed is None else handed.port, made=None if handed is None else handed.made)
    del xm
    _leave(args, result, 0)


def _hold(args, handed):
    """Rank 0 says the channel's port; every replica waits until the other program has run."""
    if args.rank == 0:
        with open(os.path.join(args.out_dir, "ready.part"), "w") as handle:
            json.dump({"port": None if handed is None else handed.port}, handle)
        os.replace(os.path.join(args.out_dir, "ready.part"), os.path.join(args.out_dir, "ready"))
    deadline = time.monotonic() + HOLD_WAIT
    while not os.path.exists(args.hold) and time.monotonic() < deadline:
        time.sleep(0.05)


def plain(args):
    """One rank of another job on the host: a plain torch.distributed gloo job (``env://``: ``MASTER_ADDR``,
    ``MASTER_PORT``) that all-reduces once; writes ``DIR/rank-R.json`` (ok, or its error) and exits 0 when ok."""
    import datetime

    import torch
    import torch.distributed as dist

    result = {"ok": False, "error": None}
    try:
        dist.init_process_group("gloo", init_method="env://", rank=args.rank, world_size=args.world,
                                timeout=datetime.timedelta(seconds=args.timeout))
        total = torch.ones(1)
        dist.all_reduce(total)
        result["ok"] = total.item() == args.world
    except Exception as exc:
        result["error"] = "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    _leave(args, result, 0 if result["ok"] else 1)


def _leave(args, result, code):
    """Write ``DIR/rank-R.json`` and end the rank now (see :func:`support.ranks.leave`)."""
    from support import ranks

    ranks.write_result(os.path.join(args.out_dir, "rank-%d.json" % args.rank), result)
    ranks.leave(code)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("launch", "replica", "plain"))
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--scenario", choices=("same", "different"), default="same")
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--hold", default=None)
    parser.add_argument("--direct", action="store_true")
    parser.add_argument("--hosts", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=10, help="plain: the process group's timeout (s)")
    args = parser.parse_args(argv)
    if args.role == "launch":
        sys.exit(launch(args))
    (plain if args.role == "plain" else replica)(args)


if __name__ == "__main__":
    main()

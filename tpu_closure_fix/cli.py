"""Command line: ``tpu-closure-fix`` / ``python -m tpu_closure_fix``."""
import argparse
import json
import sys


def _cmd_status(args):
    """Every verdict about a fresh interpreter (this one, or ``--python``), started with the caller's
    environment and flags: what a training script started there gets (:mod:`.verify.fresh`)."""
    from .outcome import decide, payload, render
    from .verify import fresh

    if args.here:
        evidence = payload.receive(payload.build(fresh.facts_here()))
    else:
        evidence = payload.receive(*fresh.run_status(python=args.python, script=args.script, timeout=args.timeout),
                                   asked=args.python)
    outcome = decide.decide(evidence)
    if args.json:
        print(json.dumps(render.json_object(evidence, outcome), indent=2, sort_keys=True))
    else:
        print(render.text(evidence, outcome, show_all=args.all))
    return outcome.exit_code


def build_parser():
    from .arguments import TIMEOUT_HELP, FittedParser, existing_python, positive_seconds

    parser = FittedParser(
        prog="tpu-closure-fix",
        description="Fix the gradient all-reduce order of closure-based optimizer steps on torch_xla (Lightning "
                    "Trainer, Lite/Fabric, Hugging Face accelerate, optimum-neuron on AWS Trainium, plain "
                    "torch_xla loops) at run time; report and check it.",
    )
    from .__about__ import __version__

    parser.add_argument("--version", action="version", version="tpu-closure-fix %s" % __version__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    status = sub.add_parser("status", help="what a fresh interpreter gets: start-up hook, one line per known call "
                                          "site with its release and verdict; exit 0 protected or nothing to "
                                          "protect, 1 unprotected, 3 could not verify")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.add_argument("--all", action="store_true", help="also list sites that are not installed")
    status.add_argument("--python", metavar="PATH", type=existing_python,
                        help="ask about another interpreter (e.g. the venv a job uses; default: this one)")
    from .verify.script_dir import SCRIPT_HELP, script_argument

    status.add_argument("--script", metavar="PATH", type=script_argument, help=SCRIPT_HELP)
    status.add_argument("--timeout", metavar="SECONDS", type=positive_seconds, default=600, help=TIMEOUT_HELP)
    status.add_argument("--here", action="store_true", help=argparse.SUPPRESS)  # this process (test doubles)
    status.set_defaults(func=_cmd_status)
    from . import check, launcher
    from .integrations.lightning import demo

    check.add_parser(sub)
    launcher.add_parser(sub)
    demo.add_parser(sub)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    import tpu_closure_fix  # noqa: F401  (importing it activates the shim, as in a user's script)

    if args.command not in ("status", "check"):
        return args.func(args)
    _sigterm_unwinds()
    try:
        return args.func(args)
    except KeyboardInterrupt:  # the children are ended on the way out (verify.child.run_children)
        sys.stderr.write("tpu-closure-fix %s: interrupted\n" % args.command)
        return 130
    except BrokenPipeError:  # the reader left (`status | head`): no traceback; the exit a shell gives on SIGPIPE
        _stdout_to_devnull()
        return 128 + 13


def _stdout_to_devnull():
    """Point stdout at /dev/null, so that flushing it at interpreter exit raises no second BrokenPipeError."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (a replaced stdout): nothing left to flush to a pipe
        pass


def _sigterm_unwinds():
    """SIGTERM raises SystemExit(143) in ``status`` and ``check``, so the children they started are ended
    on the way out, as on Ctrl-C (by default SIGTERM kills the process where it stands)."""
    import signal

    def unwind(signum, frame):
        raise SystemExit(128 + signum)

    try:
        signal.signal(signal.SIGTERM, unwind)
    except ValueError:  # not the main thread: leave it
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

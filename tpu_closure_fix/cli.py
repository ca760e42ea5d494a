"""Command line: ``tpu-closure-fix`` / ``python -m tpu_closure_fix``."""
import argparse
import sys


def _cmd_status(args):
    from . import report

    failures = report.import_installed_sites() if not args.no_import else {}
    records = report.status(import_errors=failures)
    if args.json:
        print(report.render_json(records))
    else:
        print(report.render_table(records, show_all=args.all))
        bad = report.unprotected(records)
        if bad:
            print("\nUNPROTECTED: %d installed affected site(s) run the buggy code." % len(bad))
        else:
            print("\nOK: every installed affected site is patched, guarded or fixed upstream.")
        print(_sync_check_line())
    return 1 if report.unprotected(records) else 0


def _sync_check_line():
    """Whether the zero-code SyncCheck is armed here; its module is only imported when its variable is set."""
    import os

    from .config import SYNC_CHECK_VAR

    if not os.environ.get(SYNC_CHECK_VAR):
        return "zero-code sync check: off (%s unset)" % SYNC_CHECK_VAR
    from .synccheck import hook

    return hook.status_line()


def build_parser():
    parser = argparse.ArgumentParser(
        prog="tpu-closure-fix",
        description="Fix the gradient all-reduce order of closure-based optimizer steps on torch_xla (Lightning "
                    "Trainer, Lite/Fabric, Hugging Face accelerate, optimum-neuron on AWS Trainium, plain "
                    "torch_xla loops) at run time; report and check it.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    status = sub.add_parser("status", help="one line per known call site: release and verdict "
                                          "(exit 1 if an installed affected site is unpatched)")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.add_argument("--all", action="store_true", help="also list sites that are not installed")
    status.add_argument("--no-import", action="store_true",
                        help="do not import the installed call-site modules first (report what is loaded)")
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

    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

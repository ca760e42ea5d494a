"""How far the shim activated in this interpreter (tests/target/test_activation.py).

Run as ``python -m support.activation_probe MODE`` in the interpreter whose
activation mode is under test (a fresh venv with the wheel's .pth, autowrapt,
sitecustomize, PYTHONSTARTUP...). The call sites to look at come in the
environment variable ``TCF_SITES`` (JSON list of ``[module, "Class.method"]``):
importing ``tpu_closure_fix`` to read its table would activate it, which is
what is being observed. Prints one ``PROBE {json}`` line: ``before`` (which of
tpu_closure_fix / wrapt were loaded before any framework import) and
``patched`` (the wrapper depth of every installed site after importing it).

Modes: ``probe`` (import the sites, nothing else), ``import-after`` (import
the sites, then ``import tpu_closure_fix``), ``import-before`` (the other way
round), ``enable-twice`` (the sites, then the import and ``enable()`` twice).
``idle`` imports nothing: it lists the modules of the shim, wrapt, torch and
Lightning that interpreter start-up loaded (``loaded``).
``--warnings-always`` shows every warning (the filter ``always``) from the start; DeprecationWarnings
are always ignored.
"""
import argparse
import json
import os
import sys

from support.layers import depth
from support.site_classes import defining_classes


#: Modules an interpreter that never imports a framework must not load at start-up.
IDLE_PREFIXES = ("tpu_closure_fix", "wrapt", "torch", "pytorch_lightning", "lightning")


def import_all():
    """{"module:Class.method": wrapper depth} of every site the interpreter can import."""
    return {module_name + ":" + qualname: depth(vars(cls)[attr])
            for module_name, qualname, cls, attr in defining_classes(json.loads(os.environ["TCF_SITES"]))}


def emit(before, patched):
    print("PROBE " + json.dumps({"before": before, "patched": patched}))
    sys.stdout.flush()


def interactive():
    """For an interactive session (``python -i``): print the depths on a ``RESULT`` line."""
    print("RESULT", json.dumps(import_all()))
    sys.stdout.flush()


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", nargs="?", default="probe",
                        choices=("probe", "import-after", "import-before", "enable-twice", "idle"))
    parser.add_argument("--warnings-always", action="store_true")
    args = parser.parse_args(argv)
    if args.mode == "idle":
        print("PROBE " + json.dumps({"loaded": sorted(m for m in sys.modules if m.startswith(IDLE_PREFIXES))}))
        return 0
    import warnings

    if args.warnings_always:
        warnings.simplefilter("always")
    warnings.simplefilter("ignore", DeprecationWarning)
    before = sorted(m for m in ("tpu_closure_fix", "wrapt") if m in sys.modules)
    if args.mode == "import-before":
        import tpu_closure_fix  # noqa: F401
    patched = import_all()
    if args.mode in ("import-after", "enable-twice"):
        import tpu_closure_fix  # noqa: F401

        if args.mode == "enable-twice":
            tpu_closure_fix.enable()
            tpu_closure_fix.enable()
        patched = import_all()
    emit(before, patched)
    return 0


if __name__ == "__main__":
    sys.exit(main())

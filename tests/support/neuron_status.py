"""``tpu-closure-fix status`` in a process that has imported optimum-neuron's optimizer module.

On a machine without the Neuron SDK, ``optimum.neuron.accelerate.optimizer``
cannot be imported, so a plain ``status`` reports its import failure. This
runs the same command after installing the stand-ins for torch_xla and the SDK
(:mod:`support.neuron_sdk`) and importing the released module through them, as
on a Trainium host, and reports this process (``status --here``: a fresh interpreter would not have the
stand-ins). Arguments are ``status``'s; the exit status is status's.
Used by the release matrix (scripts/matrix.py) and tests/target/test_optimum_neuron.py.
"""
import sys
import warnings


def main(argv=None):
    warnings.simplefilter("ignore")
    from support import neuron_sdk

    neuron_sdk.install(1, 0)
    import tpu_closure_fix  # noqa: F401  (TPU_CLOSURE_FIX decides, as for a user)

    neuron_sdk.load_optimizer_module()
    from tpu_closure_fix.cli import main as cli

    return cli(["status", "--here"] + list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())

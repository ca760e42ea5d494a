"""Cost of the shim on ``import pytorch_lightning`` (pytorch-lightning 1.8.6 target): enabled vs disabled.

Each pair starts two interpreters of the base venv (.cache/venv, where the wheel's
.pth auto-enable is installed) with the 1.8.6 target on PYTHONPATH, one with
``TPU_CLOSURE_FIX=1`` and one with ``TPU_CLOSURE_FIX=0`` (order alternating), and
times ``import pytorch_lightning`` inside the process (start-up excluded). The
enabled arm includes the shim's whole activation: wrapt, the engine, the post-import
hooks and patching the call sites. Goal: <= 2 % added.

    python benchmarks/bench_import.py            # 30 pairs (after 1 warm-up pair)
    python benchmarks/bench_import.py --smoke    # 2 pairs (CI)
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _stats import summary  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(REPO, ".cache", "targets", "pytorch-lightning-1.8.6")
CODE = ("import time, warnings; warnings.simplefilter('ignore'); t = time.perf_counter(); import pytorch_lightning; "
        "t = time.perf_counter() - t; import sys; "
        "m = sys.modules.get('pytorch_lightning.plugins.precision.tpu'); "
        "print(t, type(vars(m.TPUPrecisionPlugin)['optimizer_step']).__name__)")


def once(python, enabled):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["PYTHONPATH"] = TARGET
    env["TPU_CLOSURE_FIX"] = "1" if enabled else "0"
    out = subprocess.run([python, "-c", CODE], env=env, capture_output=True, text=True, check=True).stdout.split()
    assert (out[1] == "FunctionWrapper") == enabled, out  # the arm really is what it claims
    return float(out[0])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--python", default=os.path.join(REPO, ".cache", "venv", "bin", "python"))
    parser.add_argument("--smoke", action="store_true", help="2 pairs, for CI (figures not meaningful)")
    args = parser.parse_args(argv)
    if not os.path.isdir(TARGET):
        sys.exit("install the target first: python scripts/targets.py install pytorch-lightning==1.8.6")
    pairs = 2 if args.smoke else args.pairs
    off, on = [], []
    for i in range(pairs + 1):
        results = {}
        for arm in ((True, False) if i % 2 else (False, True)):
            results[arm] = once(args.python, arm)
        if i >= 1:
            off.append(results[False])
            on.append(results[True])
    print("%d pairs" % pairs)
    summary("import pytorch_lightning 1.8.6", off, on, "ms", scale=1e3, goal=None if args.smoke else 2.0,
            relative=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

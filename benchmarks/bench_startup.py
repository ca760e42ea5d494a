"""Interpreter start-up cost of the auto-enable (.pth) for a process that never imports Lightning.

A fresh venv gets the wheel built from this checkout (unpacked into site-packages
and byte-compiled, which is what pip does for this pure wheel). Each pair runs ``python -c pass``
once with ``tpu_closure_fix.pth`` present and once with it renamed away (the order
alternates between pairs), timing the whole process from the parent; then
``-X importtime`` gives the in-process share of the startup module (cumulative
import time, which includes install()). Goal: <= 0.5 ms added.

    python benchmarks/bench_startup.py            # 100 pairs (after 3 warm-up pairs)
    python benchmarks/bench_startup.py --smoke    # 5 pairs, a few seconds (CI)
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _stats import summary  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_venv(root):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", os.path.join(root, "venv")], check=True)
    python = os.path.join(root, "venv", "bin", "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", os.path.join(root, "wheel"), REPO],
                   check=True)
    (wheel,) = glob.glob(os.path.join(root, "wheel", "tpu_closure_fix-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    # pip byte-compiles what it installs (and PYTHONDONTWRITEBYTECODE may forbid doing it lazily): do the same.
    subprocess.run([python, "-m", "compileall", "-q", site], check=True, stdout=subprocess.DEVNULL)
    return python, site


def once(python, env):
    start = time.perf_counter()
    subprocess.run([python, "-c", "pass"], env=env, check=True)
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--smoke", action="store_true", help="5 pairs, for CI (figures not meaningful)")
    args = parser.parse_args(argv)
    pairs = 5 if args.smoke else args.pairs
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TPU_CLOSURE_FIX", "PYTHONSTARTUP")}
    with tempfile.TemporaryDirectory(prefix="tcf-bench-startup-") as root:
        python, site = make_venv(root)
        pth = os.path.join(site, "tpu_closure_fix.pth")
        off = pth + ".off"
        check = subprocess.run([python, "-c", "import sys; print(any(type(f).__name__ == 'ImportWatcher' "
                                              "for f in sys.meta_path))"], env=env, capture_output=True, text=True)
        assert check.stdout.strip() == "True", "the .pth did not arm the watcher"
        without, with_pth = [], []
        for i in range(pairs + 3):
            results = {}
            for arm in ((True, False) if i % 2 else (False, True)):
                if arm:
                    if os.path.exists(off):
                        os.rename(off, pth)
                else:
                    if os.path.exists(pth):
                        os.rename(pth, off)
                results[arm] = once(python, env)
            if os.path.exists(off):
                os.rename(off, pth)
            if i >= 3:  # warm-up pairs (page cache, pyc files) are not counted
                without.append(results[False])
                with_pth.append(results[True])
        # In-process figure, immune to process-creation noise: what -X importtime charges to the .pth's import.
        own = []
        for _ in range(pairs):
            err = subprocess.run([python, "-X", "importtime", "-c", "pass"], env=env, capture_output=True,
                                 text=True).stderr
            line = [l for l in err.splitlines() if l.rstrip().endswith("_tpu_closure_fix_startup")]
            own.append(int(line[0].split("|")[1]) if line else 0)
    print("python %s; %d pairs" % (sys.version.split()[0], pairs))
    summary("start-up, `python -c pass`", without, with_pth, "ms", scale=1e3, goal=None if args.smoke else 0.5)
    own.sort()
    print("%-34s n=%-3d median %.3f ms (min %.3f, max %.3f): -X importtime of _tpu_closure_fix_startup"
          % ("start-up, in-process share", len(own), own[len(own) // 2] / 1e3, own[0] / 1e3, own[-1] / 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())

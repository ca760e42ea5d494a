"""Interpreter start-up cost of the auto-enable (.pth) for a process that never imports Lightning.

A fresh venv gets the wheel built from this checkout (unpacked into site-packages
and byte-compiled, which is what pip does for this pure wheel). Each round runs
``python -c pass`` three times, in rotating order: with ``tpu_closure_fix.pth``,
with it renamed away, and with a *floor* .pth instead that imports an empty module
from site-packages and calls its empty ``install()`` -- the least any .pth that
imports a module can cost on this machine. Figures are paired medians over rounds
of the per-round differences: the shim against nothing (the goal: <= 0.5 ms
added), the floor against nothing, and the shim against the floor (the startup
module's own work). Then ``-X importtime`` gives the in-process time charged to
the startup module; it includes the directory listings of lib-dynload and
site-packages that the interpreter's own ``sitecustomize`` lookup would otherwise
make a moment later, so it overstates what is added.

    python benchmarks/bench_startup.py            # 100 rounds (after 3 warm-up rounds)
    python benchmarks/bench_startup.py --smoke    # 5 rounds, a few seconds (CI)
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


def _arrange(arm, pth, off, floor_pth):
    """Put the .pth files in place for ``arm``: "with" (the shim's), "without" (none), "floor" (the empty one)."""
    if arm == "with":
        if os.path.exists(off):
            os.rename(off, pth)
    elif os.path.exists(pth):
        os.rename(pth, off)
    if arm == "floor":
        with open(floor_pth, "w") as handle:
            handle.write("import tcf_bench_floor; tcf_bench_floor.install()\n")
    elif os.path.exists(floor_pth):
        os.remove(floor_pth)


def once(python, env):
    start = time.perf_counter()
    subprocess.run([python, "-c", "pass"], env=env, check=True)
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=100, help="rounds of three runs")
    parser.add_argument("--smoke", action="store_true", help="5 rounds, for CI (figures not meaningful)")
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
        floor_pth = os.path.join(site, "tcf_bench_floor.pth")
        with open(os.path.join(site, "tcf_bench_floor.py"), "w") as module:
            module.write("def install():\n    pass\n")
        subprocess.run([python, "-m", "compileall", "-q", site], check=True, stdout=subprocess.DEVNULL)
        arms = ("without", "with", "floor")
        times = {arm: [] for arm in arms}
        for i in range(pairs + 3):
            results = {}
            for k in range(3):
                arm = arms[(i + k) % 3]  # rotating order: each arm runs first, second and third equally
                _arrange(arm, pth, off, floor_pth)
                results[arm] = once(python, env)
            _arrange("with", pth, off, floor_pth)
            if i >= 3:  # warm-up rounds (page cache, pyc files) are not counted
                for arm in arms:
                    times[arm].append(results[arm])
        # In-process figure, immune to process-creation noise: what -X importtime charges to the .pth's import.
        own = []
        for _ in range(pairs):
            err = subprocess.run([python, "-X", "importtime", "-c", "pass"], env=env, capture_output=True,
                                 text=True).stderr
            line = [l for l in err.splitlines() if l.rstrip().endswith("_tpu_closure_fix_startup")]
            own.append(int(line[0].split("|")[1]) if line else 0)
    print("python %s; %d rounds" % (sys.version.split()[0], pairs))
    summary("start-up, `python -c pass`", times["without"], times["with"], "ms", scale=1e3,
            goal=None if args.smoke else 0.5)
    summary("floor: .pth importing an empty module", times["without"], times["floor"], "ms", scale=1e3)
    summary("the startup module over the floor", times["floor"], times["with"], "ms", scale=1e3)
    own.sort()
    print("%-34s n=%-3d median %.3f ms (min %.3f, max %.3f): -X importtime of _tpu_closure_fix_startup"
          % ("start-up, in-process share", len(own), own[len(own) // 2] / 1e3, own[0] / 1e3, own[-1] / 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())

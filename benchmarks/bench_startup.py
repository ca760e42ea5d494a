"""Interpreter start-up cost of the auto-enable (.pth) for a process that never imports a watched package.

One fresh venv per arm, each with the wheel built from this checkout unpacked into
site-packages and byte-compiled (what pip does for this pure wheel); the arms differ
only in the .pth file:

* ``none``: no .pth (the wheel's removed);
* ``pth``: a .pth whose line is ``import sys`` -- what any .pth with an import line costs;
* ``floor``: a .pth importing an *empty* module -- the least a .pth that imports a module costs;
* ``shim``: the wheel's own ``tpu_closure_fix.pth``, as installed;
* ``shim@REF`` (``--baseline-ref REF``): the wheel built from git commit REF, for an A/B.

Each round starts ``python -c pass`` once per arm, in rotating order (``os.posix_spawn``;
wall time of spawn to exit). Figures are the paired median of the per-round differences
against ``none`` with a distribution-free 95 % confidence interval of that median (order
statistics), and the same for the shim against the floor. The goal is <= 0.5 ms added for
``shim``.

Where valgrind is installed, callgrind then counts the instructions of one
``python -c pass`` per arm (``PYTHONHASHSEED=0``): exact and repeatable whatever
else the machine does, but blind to system calls and page faults.

    python benchmarks/bench_startup.py                 # 3000 rounds (after 5 warm-up rounds)
    python benchmarks/bench_startup.py --baseline-ref HEAD~3
    python benchmarks/bench_startup.py --smoke         # 5 rounds, a few seconds (CI)
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOAL_MS = 0.5
WARM_UP = 5
FLOOR_MODULE = "tcf_bench_floor"


def build_wheel(source, out):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, source], check=True)
    (wheel,) = glob.glob(os.path.join(out, "tpu_closure_fix-*.whl"))
    return wheel


def source_at(ref, root):
    """A copy of the repository's files at git commit ``ref`` (``git archive``), for a baseline wheel."""
    archive = os.path.join(root, "baseline.tar")
    subprocess.run(["git", "-C", REPO, "archive", "--format=tar", "-o", archive, ref], check=True)
    tree = os.path.join(root, "baseline-src")
    with tarfile.open(archive) as handle:
        handle.extractall(tree)
    return tree


def make_venv(path, wheel, pth_text):
    """A venv with ``wheel`` unpacked, its .pth replaced by ``pth_text`` (None: no .pth), byte-compiled."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", path], check=True)
    python = os.path.join(path, "bin", "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with zipfile.ZipFile(wheel) as handle:
        handle.extractall(site)
    if pth_text != "wheel":
        for name in ("tpu_closure_fix.pth", "tpu_closure_fix.start"):
            os.remove(os.path.join(site, name))
        if pth_text is not None:
            with open(os.path.join(site, "tpu_closure_fix.pth"), "w") as handle:
                handle.write(pth_text)
    with open(os.path.join(site, FLOOR_MODULE + ".py"), "w") as handle:
        handle.write("")
    # pip byte-compiles what it installs (and PYTHONDONTWRITEBYTECODE may forbid doing it lazily): do the same.
    subprocess.run([python, "-m", "compileall", "-q", site], check=True, stdout=subprocess.DEVNULL)
    return python


def spawn_ms(python, env):
    start = time.perf_counter()
    pid = os.posix_spawn(python, [python, "-c", "pass"], env)
    _, status, _ = os.wait4(pid, 0)
    elapsed = (time.perf_counter() - start) * 1e3
    if status != 0:
        raise SystemExit("%s -c pass failed (status %d)" % (python, status))
    return elapsed


def median_with_ci(values):
    """Median and a distribution-free 95 % confidence interval of it (order statistics n/2 -+ 0.98 sqrt(n))."""
    values = sorted(values)
    n = len(values)
    mid = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
    half = 0.98 * n ** 0.5
    return mid, values[max(0, int(n / 2 - half))], values[min(n - 1, int(n / 2 + half))]


def report(label, base, arm, goal=None):
    added, low, high = median_with_ci([t - b for b, t in zip(base, arm)])
    line = "%-36s n=%-5d added (paired median) %+.3f ms  95%% CI %+.3f .. %+.3f" % (label, len(arm), added, low, high)
    if goal is not None:
        line += "  goal <= %s ms: %s" % (goal, "met" if added <= goal else "NOT met")
        if added <= goal < high or low <= goal < added:
            line += " (the goal is inside the CI)"
    print(line, flush=True)


def instructions(python, env):
    """Instructions of one ``python -c pass`` (callgrind, PYTHONHASHSEED=0), or None without valgrind."""
    if shutil.which("valgrind") is None:
        return None
    proc = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", python, "-c", "pass"],
                          env=dict(env, PYTHONHASHSEED="0"), capture_output=True, text=True)
    found = re.search(r"Collected : (\d+)", proc.stderr)
    return int(found.group(1)) if found else None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3000, help="rounds of one run per arm")
    parser.add_argument("--baseline-ref", help="also measure the wheel built from this git commit")
    parser.add_argument("--no-callgrind", action="store_true", help="skip the instruction counts")
    parser.add_argument("--smoke", action="store_true", help="5 rounds, for CI (figures not meaningful)")
    args = parser.parse_args(argv)
    rounds = 5 if args.smoke else args.rounds
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TPU_CLOSURE_FIX", "PYTHONSTARTUP")}
    with tempfile.TemporaryDirectory(prefix="tcf-bench-startup-") as root:
        wheel = build_wheel(REPO, os.path.join(root, "wheel"))
        arms = {"none": (wheel, None), "pth": (wheel, "import sys\n"),
                "floor": (wheel, "import %s\n" % FLOOR_MODULE), "shim": (wheel, "wheel")}
        if args.baseline_ref:
            baseline = build_wheel(source_at(args.baseline_ref, root), os.path.join(root, "baseline-wheel"))
            arms["shim@" + args.baseline_ref] = (baseline, "wheel")
        pythons = {name: make_venv(os.path.join(root, "venv-" + str(i)), *spec)
                   for i, (name, spec) in enumerate(arms.items())}
        check = subprocess.run([pythons["shim"], "-c", "import sys; m = sys.modules.get('_tpu_closure_fix_startup'); "
                                                       "print(m is not None and m in sys.meta_path)"],
                               env=env, capture_output=True, text=True)
        assert check.stdout.strip() == "True", "the .pth did not arm the watcher: %r" % (check.stdout + check.stderr)
        names = list(pythons)
        times = {name: [] for name in names}
        for i in range(rounds + WARM_UP):
            for k in range(len(names)):
                name = names[(i + k) % len(names)]  # rotating order: every arm runs in every position
                elapsed = spawn_ms(pythons[name], env)
                if i >= WARM_UP:  # warm-up rounds (page cache, pyc files) are not counted
                    times[name].append(elapsed)
        counts = {} if args.no_callgrind else {name: instructions(pythons[name], env) for name in names}
    print("python %s; %d rounds; `python -c pass` takes %.2f ms (median, no .pth)"
          % (sys.version.split()[0], rounds, sorted(times["none"])[len(times["none"]) // 2]))
    report("pth: a .pth with `import sys`", times["none"], times["pth"])
    report("floor: .pth importing empty module", times["none"], times["floor"])
    report("shim: tpu_closure_fix.pth", times["none"], times["shim"], goal=None if args.smoke else GOAL_MS)
    report("shim over the floor", times["floor"], times["shim"])
    for name in names[4:]:
        report(name, times["none"], times[name])
        report("shim against " + name, times[name], times["shim"])
    if counts.get("none"):
        print("instructions (callgrind, one run each): none %d; added: %s" % (counts["none"], ", ".join(
            "%s %+d" % (name, counts[name] - counts["none"]) for name in names[1:] if counts.get(name))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

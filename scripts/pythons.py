#!/usr/bin/env python
"""The multi-interpreter stage: tests/unit on every CPython 3.8-3.13 this machine has, and a
real-framework target at each end of that range (each test module holds its TPU_CLOSURE_FIX=0 twins).

    python scripts/pythons.py build [--results DIR] [--skip-minor 3.11]   # the venvs only (pip: mostly waiting)
    python scripts/pythons.py test  [--results DIR] [--skip-minor 3.11]   # build what is missing, then test

``build`` makes one venv per interpreter under .cache/pythons/<minor>/venv with pytest, hypothesis, wrapt,
packaging, xxhash (not on 3.13, whose unit suite runs without it) and the torch of PLANS (none where the
interpreter has no torch to test with), then installs this checkout's wheel into it (not editable: the .pth
and the start-up module are installed as a user gets them). A venv is kept while its stamp (the plan and the
interpreter's full version) matches, so a second run only refreshes the wheel. ``test`` builds what is
missing, then runs tests/unit in each venv (JUnit report results/junit-py<minor>-unit.xml; the cases marked
``many_ranks``, four or more processes, run in the base interpreter only) and the plan's targets
(scripts/targets.py installs them into .cache/pythons/<minor>/targets with that interpreter; reports
results/junit-py<minor>-<target>.xml). ``--skip-minor`` leaves out an interpreter whose unit tests another
stage ran (scripts/test.sh: the base venv's); it is listed as such.

Interpreters are looked up in pyenv (~/.pyenv/versions/<minor>.*, the newest patch) and then on
PATH (python<minor>). An interpreter that is absent is listed as absent and runs nothing: it is
never counted as passed. Tests that need torch where the plan installs none skip with that reason,
and junit_summary.py counts those skips as skips. Exit 1 when a build or a test run fails.

Python 3.8+, standard library only.
"""
import argparse
import concurrent.futures
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling download_retry.py, however loaded
from download_retry import retry_once  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.join(REPO, ".cache", "pythons")
MINORS = ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13")
TEST_TOOLS = ("pytest", "hypothesis", "wrapt", "packaging", "xxhash", "typing_extensions")  # test_identity decorates with its override

#: What each interpreter gets besides the test tools.  torch: the CPU build 2.13.0 exists for 3.11
#: only (the machine's local wheel); 3.8 gets 1.12.1, the last torch whose PyPI wheel carries its
#: CUDA libraries inside (776 MB, nothing else to download; pytorch-lightning 1.8.6 supported it);
#: 3.13 gets 2.14.1, whose CUDA libraries (about 3 GB) are on this machine's local index.  The other
#: interpreters run the unit tests that need no torch; the rest skip and say so.
#: targets: (scripts/targets.py target, its test modules under tests/target).  without: test tools left out of
#: the venv: 3.13 runs without xxhash (this package is installed --no-deps), so SyncCheck's elementwise hash, the
#: configuration docs/synccheck.md supports where xxhash does not import, is what its unit suite tests.
PLANS = {
    "3.8": {"torch": "torch==1.12.1", "extra": (),
            "targets": (("pytorch-lightning==1.8.6",
                         ("test_activation.py", "test_event_order.py", "test_replicas.py", "test_check.py")),)},
    "3.9": {"torch": None, "extra": (), "targets": ()},
    "3.10": {"torch": None, "extra": (), "targets": ()},
    "3.11": {"torch": "torch==2.13.0", "extra": (), "targets": ()},
    "3.12": {"torch": None, "extra": (), "targets": ()},
    "3.13": {"torch": "torch==2.14.1", "extra": (), "without": ("xxhash",),
             "targets": (("lightning-fabric==2.6.6",
                          ("test_activation.py", "test_event_order.py", "test_replicas.py")),
                         ("accelerate==1.15.0", ("test_accelerate.py",)))},
}
STAMP_FORMAT = 1
#: venvs built at once (downloads and unpacking)
BUILDERS = 2
#: Unit test modules the base interpreter alone runs, as it runs the four-or-more-process cases (marked many_ranks):
#: jobs of gloo replica processes whose layouts, reports and channels run the same code on every interpreter, and
#: the benchmarks' smoke runs. What a job does at its ends, where interpreters differ (exit hooks, a forked child's
#: os._exit, SIGTERM, the worker thread at shutdown), is in test_synccheck_word.py and test_synccheck_threads.py,
#: which every interpreter with torch runs.
BASE_ONLY = ("test_synccheck_pod.py", "test_synccheck_layouts.py", "test_synccheck_replicas.py",
             "test_synccheck_host_threads.py", "test_synccheck_host_jobs.py", "test_synccheck_anchors_bench.py",
             "test_synccheck_probe_wall_bench.py", "test_synccheck_loop_bench.py",
             "test_synccheck_first_check_bench.py")


def log(message):
    print(message, flush=True)


def version_key(path):
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", path)
    return tuple(int(part) for part in match.groups()) if match else (0, 0, 0)


def find_interpreter(minor):
    """The newest pyenv CPython <minor>.x, else python<minor> on PATH, else None."""
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = [p for p in glob.glob(os.path.join(pyenv, "versions", minor + ".*", "bin", "python"))
             if re.search(r"/%s\.\d+/bin/python$" % re.escape(minor), p) and os.access(p, os.X_OK)]
    if found:
        return max(found, key=version_key)
    return shutil.which("python" + minor)


def full_version(python):
    out = subprocess.run([python, "-c", "import platform, sys; print(platform.python_implementation(),"
                          " '%d.%d.%d' % sys.version_info[:3])"], stdout=subprocess.PIPE,
                         universal_newlines=True, timeout=60).stdout.split()
    return out if len(out) == 2 else (None, None)


def venv_dir(minor):
    return os.path.join(ROOT, minor, "venv")


def venv_python(minor):
    return os.path.join(venv_dir(minor), "bin", "python")


def test_tools(minor):
    """The test tools the venv of ``minor`` gets: :data:`TEST_TOOLS` but its plan's ``without``."""
    return tuple(tool for tool in TEST_TOOLS if tool not in PLANS[minor].get("without", ()))


def stamp_text(minor, version):
    plan = PLANS[minor]
    return json.dumps({"format": STAMP_FORMAT, "python": version, "tools": test_tools(minor), "torch": plan["torch"],
                       "extra": plan["extra"]}, sort_keys=True)


def pip(python, args, timeout=3600):
    """pip in ``python`` quietly, tried once more when it fails (a transient download error); (ok, output)
    with pip's harmless find-links noise left out."""
    proc = retry_once(lambda: subprocess.run([python, "-m", "pip", "--disable-pip-version-check", "--no-input"]
                                             + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                             universal_newlines=True, timeout=timeout),
                      "pip %s" % " ".join(args[:1]), log=log)
    out = "\n".join(line for line in proc.stdout.splitlines() if "it is neither a file nor a directory" not in line)
    return proc.returncode == 0, out


def wheel_links():
    """pip options that add the shared wheel cache as a find-links folder, where it exists."""
    wheels = os.environ.get("TPU_CLOSURE_FIX_WHEELS")
    return ["--find-links", wheels] if wheels and os.path.isdir(wheels) else []


def build_venv(minor, interpreter, version):
    """Create (or keep, when its stamp matches) the venv of ``minor``; True when it is ready."""
    stamp = os.path.join(ROOT, minor, "stamp.json")
    wanted = stamp_text(minor, version)
    if os.path.exists(venv_python(minor)) and os.path.exists(stamp) and open(stamp).read() == wanted:
        return True
    shutil.rmtree(os.path.join(ROOT, minor), ignore_errors=True)
    os.makedirs(os.path.join(ROOT, minor))
    started = time.time()
    proc = subprocess.run([interpreter, "-m", "venv", venv_dir(minor)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, timeout=600)
    if proc.returncode != 0:
        log("!! %s: creating the venv failed:\n%s" % (minor, proc.stdout[-2000:]))
        return False
    plan = PLANS[minor]
    wants = list(test_tools(minor)) + list(plan["extra"]) + ([plan["torch"]] if plan["torch"] else [])
    ok, out = pip(venv_python(minor), ["install", "-q"] + wheel_links() + wants)
    if not ok:
        log("!! %s: pip install %s failed:\n%s" % (minor, " ".join(wants), out[-3000:]))
        return False
    with open(stamp, "w") as handle:
        handle.write(wanted)
    log("   %s: venv built in %.0f s (%s)" % (minor, time.time() - started, " ".join(wants)))
    return True


def build_wheel(folder):
    """This checkout's wheel, built once with the running interpreter, for every venv."""
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
                           "-w", folder, REPO], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=900)
    wheels = glob.glob(os.path.join(folder, "tpu_closure_fix-*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        log("!! building this checkout's wheel failed:\n%s" % proc.stdout[-3000:])
        return None
    return wheels[0]


def install_wheel(minor, wheel):
    ok, out = pip(venv_python(minor), ["install", "-q", "--no-deps", "--force-reinstall", wheel])
    if not ok:
        log("!! %s: installing %s failed:\n%s" % (minor, os.path.basename(wheel), out[-3000:]))
    return ok


def junit_name(minor, what):
    return "junit-py%s-%s.xml" % (minor, re.sub(r"[^A-Za-z0-9.]+", "-", what))


def run_pytest(minor, args, junit, env, label):
    """pytest in the venv of ``minor``; True when it exited 0."""
    basetemp = tempfile.mkdtemp(prefix="tcf-py%s-" % minor)
    command = [venv_python(minor), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "--junitxml=" + junit,
               "--basetemp", os.path.join(basetemp, "pytest")] + list(args)
    started = time.time()
    try:
        proc = subprocess.run(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=3600)
    finally:
        shutil.rmtree(basetemp, ignore_errors=True)
    lines = proc.stdout.rstrip().splitlines()
    log("   %s %s: %s (%.0f s)" % (minor, label, lines[-1] if lines else "no output", time.time() - started))
    if proc.returncode == 5:
        log("!! %s %s: no tests were collected" % (minor, label))
    if proc.returncode != 0:
        log("\n".join(lines[-60:]))
    return proc.returncode == 0


def base_env():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TPU_CLOSURE_FIX", "PYTHONHOME",
                                                            "TPU_CLOSURE_FIX_TARGET")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def run_targets(minor, results):
    """Install and test the plan's targets with this interpreter; True when all passed."""
    ok = True
    root = os.path.join(ROOT, minor, "targets")
    for target, modules in PLANS[minor]["targets"]:
        started = time.time()
        proc = subprocess.run([venv_python(minor), os.path.join(REPO, "scripts", "targets.py"), "install", target,
                               "--root", root], env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=3600)
        if proc.returncode != 0:
            log("!! %s: installing target %s failed:\n%s" % (minor, target, proc.stdout[-3000:]))
            ok = False
            continue
        log("   %s: target %s ready (%.0f s)" % (minor, target, time.time() - started))
        path = subprocess.run([venv_python(minor), os.path.join(REPO, "scripts", "targets.py"), "path", target,
                               "--root", root], stdout=subprocess.PIPE, universal_newlines=True).stdout.strip()
        env = base_env()
        env.update(PYTHONPATH=path, TPU_CLOSURE_FIX_TARGET=target)
        env.setdefault("TPU_CLOSURE_FIX_PORT_BLOCK", "0")
        tests = [os.path.join("tests", "target", module) for module in modules]
        ok = run_pytest(minor, tests, os.path.join(results, junit_name(minor, target)), env, target) and ok
    return ok


def interpreters():
    """[(minor, path or None, full version or None)] for every minor of MINORS."""
    found = []
    for minor in MINORS:
        path = find_interpreter(minor)
        implementation, version = full_version(path) if path else (None, None)
        if path and (implementation != "CPython" or not (version or "").startswith(minor + ".")):
            log("   %s: %s is %s %s, not CPython %s: left out" % (minor, path, implementation, version, minor))
            path = version = None
        found.append((minor, path, version))
    return found


def _test_each(present, builds, args, results):
    """Each interpreter's tests, in order, as soon as its venv is ready; True when every build and test passed."""
    ok = True
    for (minor, _, _), build in zip(present, builds):
        ready = build.result()
        ok = ok and ready
        if not ready or args.action == "build":
            continue
        unit = os.path.join(results, junit_name(minor, "unit"))
        ignored = ["--ignore=tests/unit/%s" % module for module in ("test_properties.py",) + BASE_ONLY]
        ok = run_pytest(minor, ["tests/unit"] + ignored + ["-m", "not many_ranks"], unit, base_env(),
                        "tests/unit") and ok
        ok = run_targets(minor, results) and ok
    return ok


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("build", "test"), help="build the venvs, or build and test")
    parser.add_argument("--results", default=os.path.join(REPO, "results"), help="JUnit folder (default results/)")
    parser.add_argument("--skip-minor", action="append", default=[], choices=MINORS, metavar="MINOR",
                        help="leave out this interpreter's tests (another stage ran them); repeatable")
    args = parser.parse_args(argv)
    results = os.path.abspath(args.results)
    os.makedirs(results, exist_ok=True)
    os.makedirs(ROOT, exist_ok=True)
    ok = True
    found = interpreters()
    for minor, path, version in found:
        log("   %s: %s" % (minor, "CPython %s at %s" % (version, path) if path else "absent (not in pyenv, not on PATH)"))
    present = [(minor, path, version) for minor, path, version in found if path and minor not in args.skip_minor]
    wheel_folder = tempfile.mkdtemp(prefix="tcf-wheel-")
    try:
        wheel = build_wheel(wheel_folder)
        ok = wheel is not None
        # Every venv is built from the start, two at a time, while the interpreters before it test: a build mostly
        # waits on downloads, so building them one after the other left the lane idle for minutes.
        with concurrent.futures.ThreadPoolExecutor(max_workers=BUILDERS) as builders:
            builds = [builders.submit(lambda m=minor, p=path, v=version: build_venv(m, p, v)
                                      and wheel is not None and install_wheel(m, wheel))
                      for minor, path, version in present]
            ok = _test_each(present, builds, args, results) and ok
    finally:
        shutil.rmtree(wheel_folder, ignore_errors=True)
    absent = [minor for minor, path, _ in found if not path]
    skipped = [minor for minor in args.skip_minor if any(m == minor and p for m, p, _ in found)]
    log("   interpreters: %d %s (%s), %d absent%s, %d left to another stage%s" % (
        len(present), "built" if args.action == "build" else "tested", " ".join(m for m, _, _ in present), len(absent), " (%s)" % " ".join(absent) if absent else "",
        len(skipped), " (%s)" % " ".join(skipped) if skipped else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Run the release matrix: every target's installed Lightning against tests/target.

Usage::

    python scripts/matrix.py [--targets A,B] [--smoke] [--jobs N] [--install-jobs N] [--results DIR] [--prune]
                             [--fetch-only]

First the wheels of every target are fetched into the local wheel cache
(scripts/targets.py ``fetch``, in parallel, ``--install-jobs``).  Then each target, in
``--jobs`` workers (default 2; the slowest targets first, see SLOWEST):

1. install it offline from the wheel cache (scripts/targets.py ``install``, a few seconds);
   a target that cannot fetch or install FAILS, with pip's error;
2. run ``tpu-closure-fix status --json`` under it (``python -m tpu_closure_fix``
   with the target folder on PYTHONPATH) and count the call sites it reports
   patched / fixed upstream;
3. run ``python -m pytest tests/target -q`` with ``PYTHONPATH=<target dir>``,
   ``TPU_CLOSURE_FIX_TARGET=<name>``, its own private ``--basetemp`` and its worker's
   ``TPU_CLOSURE_FIX_PORT_BLOCK`` (the replicas' rendezvous ports of two workers never
   meet: tests/support/ports.py); exit code 5 (no tests collected) is a failure.
   The tests write ``<results>/<slug>.json`` (steps compared, divergences...);
   pytest's output goes to ``<results>/<slug>.pytest.log``;
4. with ``--prune``, delete the target's folder (its wheels stay cached), so the
   matrix needs the disk of ``--jobs`` targets instead of all of them (about 2.3 GiB).

Then it prints one line per target and writes ``<results>/matrix.json``
(default ``results/``, gitignored). Exit status 1 if any target failed.

``--smoke``: one target per call-site family instead of all of them (see SMOKE).
Two workers on 2 cores: one target's tests keep about 1.1 cores busy on average
(most of a run is one subprocess at a time; only the replica runs use both cores).

Python 3.8+, standard library only.
"""
from __future__ import print_function

import argparse
import concurrent.futures
import datetime
import importlib.util
import json
import os
import platform
import queue
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_RESULTS = os.path.join(REPO, "results")
PYTEST_TIMEOUT = 2400
#: Verdicts under which a site's training is protected (what ``status`` exits 0 on).
PROTECTED = ("patched", "fixed upstream", "guarded")

#: --smoke: one target per call-site family (the 1.0 module hook, the 1.1 LightningOptimizer, accelerator,
#: Trainer plugin + Lite, fixed Trainer + Fabric TPUPrecision, Fabric XLAPrecision, accelerate's XLA step,
#: optimum-neuron's step).
SMOKE = ("pytorch-lightning==1.0.8", "pytorch-lightning==1.1.8", "pytorch-lightning==1.4.9",
         "pytorch-lightning==1.8.6", "pytorch-lightning==1.9.5",
         "lightning-fabric==2.6.6", "accelerate==1.15.0", "optimum-neuron==0.4.5")

#: Started first, so that no long target is left running alone at the end: the targets that run the
#: most target tests (tests/target/conftest.py ONLY_ON), in that order of duration: in a fresh-clone run of
#: scripts/test.sh, with its other stages running beside the matrix, about 24, 13 and 3 min.
SLOWEST = ("pytorch-lightning==1.8.6", "lightning-fabric==2.6.6", "pytorch-lightning==1.8.6+wrapt==1.14.1")


def load_targets():
    spec = importlib.util.spec_from_file_location("tpu_closure_fix_targets", os.path.join(HERE, "targets.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(cmd, env, timeout, cwd=REPO):
    start = time.time()
    try:
        proc = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=timeout)
        return proc.returncode, proc.stdout, time.time() - start
    except subprocess.TimeoutExpired as exc:
        out = exc.output or ""
        if isinstance(out, bytes):
            out = out.decode("utf-8", "replace")
        return None, out + "\n[timed out after %ds]" % timeout, time.time() - start


def target_env(path, name, results, slot=0):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(path)
    env["PYTHONNOUSERSITE"] = "1"
    env["TPU_CLOSURE_FIX_TARGET"] = name
    env["TPU_CLOSURE_FIX_RESULTS"] = results
    env["TPU_CLOSURE_FIX_PORT_BLOCK"] = str(slot)
    env.pop("TPU_CLOSURE_FIX", None)  # status runs as a user would: shim on by default
    return env


#: Targets whose call-site module imports only with a test double in place (optimum-neuron's optimizer
#: needs the Neuron SDK): status runs through the tests' module that installs it first, then the CLI.
STATUS_WITH_DOUBLES = {"optimum-neuron==": "support.neuron_status"}


def status_command(name):
    module = next((m for prefix, m in STATUS_WITH_DOUBLES.items() if name.startswith(prefix)), None)
    if module is None:
        return [sys.executable, "-W", "ignore", "-m", "tpu_closure_fix", "status", "--json"], REPO
    return [sys.executable, "-W", "ignore", "-m", module, "--json"], os.path.join(REPO, "tests")


def status(path, name, results):
    """(records, wrapt version, error) from ``tpu-closure-fix status --json`` under the target."""
    env = target_env(path, name, results)
    # The status child imports the target as the tests' children do (through the test doubles where
    # they are needed): let it write the compiled files of what it imports that the install's import
    # check did not (scripts/targets.py verify_imports), so that no test child compiles them again.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    command, cwd = status_command(name)
    if cwd != REPO:  # the tests' support package, and this checkout's tpu_closure_fix before the venv's
        env["PYTHONPATH"] = os.pathsep.join([REPO, cwd, env["PYTHONPATH"]])
    code, out, _ = run(command, env, 600, cwd=cwd)
    records, error = None, None
    try:
        records = json.loads(out[out.index("{"):])["sites"]
    except (ValueError, KeyError, TypeError):
        error = "status failed (exit %s): %s" % (code, out[-2000:])
    code, out, _ = run([sys.executable, "-c", "import wrapt; print(wrapt.__version__)"], env, 120)
    wrapt_version = out.strip().splitlines()[-1] if code == 0 and out.strip() else None
    return records, wrapt_version, error


def pytest_target(path, name, results, slot):
    env = target_env(path, name, results, slot)
    junit = os.path.join(results, "junit-target-%s.xml" % "".join(c if c.isalnum() or c in ".-" else "-" for c in name))
    # a private base folder per run: pytest's shared default (pytest-of-<user>) prunes the
    # folders of other runs, which two concurrent runs must not do to each other
    basetemp = tempfile.mkdtemp(prefix="tcf-matrix-")
    # no test here uses hypothesis: its plugin would cost every target's session about 1 CPU-s of imports
    cmd = [sys.executable, "-m", "pytest", "tests/target", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
           "--junitxml=" + junit, "--basetemp", os.path.join(basetemp, "pytest")]
    try:
        return run(cmd, env, PYTEST_TIMEOUT)
    finally:
        shutil.rmtree(basetemp, ignore_errors=True)


def fmt(value):
    if value is None:
        return "-"
    if value == 0:
        return "0"
    return "%.3g" % value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", help="comma-separated target names (default: all)")
    parser.add_argument("--smoke", action="store_true", help="one target per call-site family: %s" % ", ".join(SMOKE))
    parser.add_argument("--install-jobs", type=int, default=3, help="parallel wheel fetches (default 3)")
    parser.add_argument("--jobs", type=int, default=2, choices=range(1, 9), metavar="{1..8}",
                        help="targets tested at the same time (default 2)")
    parser.add_argument("--results", default=DEFAULT_RESULTS, help="results folder (default results/)")
    parser.add_argument("--prune", action="store_true",
                        help="delete each target's folder after its tests (its wheels stay cached): "
                             "at most two target folders on disk at a time instead of all of them")
    parser.add_argument("--no-prune", dest="prune", action="store_false", help="keep target folders (default)")
    parser.add_argument("--fetch-only", action="store_true",
                        help="only fetch the targets' wheels into the cache (a later run skips the fetch)")
    args = parser.parse_args(argv)

    targets_mod = load_targets()
    known = list(targets_mod.TARGETS)
    if args.targets:
        names = [n.strip() for n in args.targets.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown:
            print("unknown target(s): %s\nknown: %s" % (", ".join(unknown), ", ".join(known)), file=sys.stderr)
            return 2
    elif args.smoke:
        names = [n for n in SMOKE if n in known]
    else:
        names = known
    results = os.path.abspath(args.results)
    os.makedirs(results, exist_ok=True)
    started = time.time()

    # 1. wheels, fetched in parallel (network; a target that cannot fetch FAILS with pip's error)
    fetch_errors = {}
    print("fetching the wheels of %d target(s)..." % len(names), flush=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.install_jobs)) as pool:
        futures = {pool.submit(targets_mod.fetch, name): name for name in names}
        for future in concurrent.futures.as_completed(futures):
            name = futures[future]
            try:
                future.result()
            except Exception as exc:  # TargetError carries pip's stderr
                fetch_errors[name] = "%s: %s" % (type(exc).__name__, exc)
                print("FETCH FAILED %s:\n%s" % (name, exc), flush=True)
    fetch_seconds = time.time() - started
    if args.fetch_only:
        print("fetched the wheels of %d target(s) in %.1f min, %d failed" % (len(names) - len(fetch_errors),
                                                                          fetch_seconds / 60.0, len(fetch_errors)))
        return 1 if fetch_errors else 0
    install_seconds = 0.0

    # 2-4. per target, in --jobs workers: install (offline, from the wheel cache), status, tests,
    # and with --prune delete the folder afterwards, so at most --jobs target folders exist at a time
    rows = {name: {"target": name, "verdict": "fail", "pytest_exit": None, "error": None} for name in names}
    for name in fetch_errors:
        rows[name]["error"] = "install failed: " + fetch_errors[name]
    todo = sorted((n for n in names if n not in fetch_errors), key=lambda n: n not in SLOWEST)
    slots = queue.Queue()  # a worker's slot number picks its block of rendezvous ports
    for slot in range(args.jobs):
        slots.put(slot)
    install_times = []

    def process(name):
        slot = slots.get()
        try:
            try:
                path, seconds = timed_install(targets_mod, name)
                install_times.append(seconds)
            except Exception as exc:  # TargetError carries pip's / the import check's stderr
                rows[name]["error"] = "install failed: %s: %s" % (type(exc).__name__, exc)
                print("INSTALL FAILED %s:\n%s" % (name, exc), flush=True)
                return
            test_target(targets_mod, name, path, rows[name], results, slot)
        finally:
            if args.prune:
                targets_mod.remove(name)
            slots.put(slot)

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as workers:
        for future in [workers.submit(process, name) for name in todo]:
            future.result()  # a failure of the runner itself (not of a target) stops the matrix
    install_seconds = sum(install_times)

    wall = time.time() - started
    report = render(names, rows)
    print()
    print(report)
    failed = [n for n in names if rows[n]["verdict"] != "pass"]
    print("\n%d target(s), %d passed, %d failed; wall time %.1f min with %d worker(s) (wheel fetch %.1f min;"
          " installs %.1f min, overlapping other targets' tests)" % (len(names), len(names) - len(failed), len(failed),
                                                                    wall / 60.0, args.jobs, fetch_seconds / 60.0,
                                                                    install_seconds / 60.0))
    for name in failed:
        print("\nFAILED %s:\n%s" % (name, rows[name]["error"]))

    matrix = {
        "generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": platform.python_version(),
        "torch": torch_version(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "wall_seconds": round(wall, 1),
        "fetch_seconds": round(fetch_seconds, 1),
        "install_seconds": round(install_seconds, 1),
        "jobs": args.jobs,
        "pruned": args.prune,
        "targets": rows,
        "order": names,
    }
    with open(os.path.join(results, "matrix.json"), "w") as handle:
        json.dump(matrix, handle, indent=1, sort_keys=True)
    print("\nwrote %s" % os.path.join(results, "matrix.json"))
    return 1 if failed else 0


def timed_install(targets_mod, name):
    start = time.time()
    path = str(targets_mod.install(name))
    return path, time.time() - start


def test_target(targets_mod, name, path, row, results, slot):
    """Status and tests of one installed target in worker ``slot``; fills ``row`` (verdict, error, summary...)."""
    row["path"] = path
    summary_path = os.path.join(results, targets_mod.slug(name) + ".json")
    if os.path.exists(summary_path):
        os.remove(summary_path)
    records, wrapt_version, error = status(path, name, results)
    row["wrapt"] = wrapt_version
    if records is not None:
        present = [r for r in records if r["verdict"] not in ("not installed", "not in this release")]
        row["status"] = [{k: r[k] for k in ("module", "method", "release", "verdict", "variant", "reason")}
                         for r in present]
        row["sites_patched"] = sum(1 for r in present if r["verdict"] == "patched")
        row["sites_fixed_upstream"] = sum(1 for r in present if r["verdict"] == "fixed upstream")
        row["sites_other"] = sum(1 for r in present if r["verdict"] not in PROTECTED)
    print("testing %s ..." % name, flush=True)
    code, out, seconds = pytest_target(path, name, results, slot)
    with open(os.path.join(results, targets_mod.slug(name) + ".pytest.log"), "w") as handle:
        handle.write(out)
    row["pytest_exit"] = code
    row["seconds"] = round(seconds, 1)
    lines = out.strip().splitlines()
    row["pytest_summary"] = lines[-1] if lines else ""
    if os.path.exists(summary_path):
        with open(summary_path) as handle:
            row["summary"] = json.load(handle)
    problems = []
    if error:
        problems.append(error)
    if code == 5:
        problems.append("pytest collected no tests (exit 5)")
    elif code != 0:
        problems.append("pytest exit %s:\n%s" % (code, "\n".join(lines[-60:])))
    if "summary" not in row:
        problems.append("no results summary written (%s)" % summary_path)
    if row.get("sites_other"):
        problems.append("status reports unprotected/skipped sites: %s" % [
            r for r in row["status"] if r["verdict"] not in PROTECTED])
    if problems:
        row["error"] = "\n".join(problems)
    else:
        row["verdict"] = "pass"
    print("  %s %s in %.0fs: %s" % (name, row["verdict"], seconds, row["pytest_summary"]), flush=True)



def torch_version():
    code, out, _ = run([sys.executable, "-c", "import torch; print(torch.__version__)"], dict(os.environ), 120)
    return out.strip().splitlines()[-1] if code == 0 and out.strip() else None


def render(names, rows):
    header = ("target", "release", "patched/fixed", "verdict", "steps", "max div (shim)", "max div (no shim)")
    table = [header]
    for name in names:
        row = rows[name]
        summary = row.get("summary") or {}
        releases = sorted({r["release"] for r in row.get("status", []) if r.get("release")})
        own = name.split("==", 1)[-1].split("+", 1)[0]  # the target's own release first, the others counted
        if len(releases) > 1 and own in releases:
            releases = ["%s +%d" % (own, len(releases) - 1)]
        sites = ("%d/%d" % (row["sites_patched"], row["sites_fixed_upstream"])) if "sites_patched" in row else "-"
        table.append((
            name,
            ",".join(releases) or "-",
            sites,
            row["verdict"],
            str(summary.get("steps_compared", "-")),
            fmt(summary.get("max_divergence_with_shim")),
            fmt(summary.get("max_divergence_without_shim")),
        ))
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = []
    for i, r in enumerate(table):
        lines.append("  ".join(cell.ljust(widths[j]) for j, cell in enumerate(r)).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

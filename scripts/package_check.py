#!/usr/bin/env python
"""Is the package ready to publish?  Builds it as a release would and checks what a user would get.

    python scripts/package_check.py [--out DIR]

1. ``python -m build``: the sdist, and the wheel built from that sdist; then ``python -m build --wheel``
   straight from the checkout.
2. ``twine check --strict`` on the sdist and both wheels (metadata, the README rendering as the long
   description).
3. Each wheel holds the start-up files at the root of site-packages (the .pth, its PEP 829 .start twin and
   the module they import), the launcher's ``tpu_closure_fix/_bootstrap`` folder and every module of the
   package in the checkout, subpackages (``tpu_closure_fix/synccheck/``) included; the wheel built from
   the sdist holds the same files, byte for byte, as the one built from the checkout.
4. The sdist and the wheel each installed into a fresh venv (their dependencies from the package index),
   where ``tpu-closure-fix status`` runs and exits 0 (nothing is installed to patch).

build and twine are test-only tools: they are installed into the running interpreter when missing.
Prints one line per check and exits 1 when one fails. tests/package/test_distributions.py runs the same
steps, one test each.  Python 3.8+, standard library only.
"""
import argparse
import glob
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Installed at the root of site-packages: without them nothing arms at interpreter start.
ROOT_FILES = ("_tpu_closure_fix_startup.py", "tpu_closure_fix.pth", "tpu_closure_fix.start")
#: The launcher's folder (``tpu-closure-fix run`` puts it on PYTHONPATH).
BOOTSTRAP_FILES = ("tpu_closure_fix/_bootstrap/sitecustomize.py",)
TOOLS = ("build", "twine")
TIMEOUT = 1800


def run(command, **kwargs):
    """(exit code, stdout and stderr) of ``command``, never raising on a non-zero exit."""
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                          timeout=kwargs.pop("timeout", TIMEOUT), **kwargs)
    output = "\n".join(line for line in proc.stdout.splitlines()
                       if "it is neither a file nor a directory" not in line)  # this machine's find-links noise
    return proc.returncode, output


def ensure_tools(python=sys.executable):
    """Install build and twine into ``python`` when they are missing; raise RuntimeError when that fails."""
    code, _ = run([python, "-c", "import build, twine"])
    if code != 0:
        code, output = run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check"] + list(TOOLS))
        if code != 0:
            raise RuntimeError("installing %s failed:\n%s" % (" ".join(TOOLS), output[-3000:]))


def build(out, python=sys.executable):
    """Build into ``out``: {"sdist": path, "wheel_from_sdist": path, "wheel": path}; RuntimeError on failure."""
    found = {}
    for kind, args in (("from-sdist", []), ("direct", ["--wheel"])):
        folder = os.path.join(out, kind)
        code, output = run([python, "-m", "build"] + args + ["--outdir", folder, REPO])
        if code != 0:
            raise RuntimeError("python -m build %s failed:\n%s" % (" ".join(args), output[-3000:]))
        for pattern, key in (("*.tar.gz", "sdist"), ("*.whl", "wheel_from_sdist" if kind == "from-sdist" else "wheel")):
            paths = glob.glob(os.path.join(folder, pattern))
            if paths:
                found[key] = paths[0]
    missing = {"sdist", "wheel_from_sdist", "wheel"} - set(found)
    if missing:
        raise RuntimeError("python -m build made no %s" % ", ".join(sorted(missing)))
    return found


def twine_check(paths, python=sys.executable):
    """(ok, twine's output) of ``twine check --strict`` on ``paths``."""
    code, output = run([python, "-m", "twine", "check", "--strict"] + list(paths))
    return code == 0, output


def wheel_files(path):
    """{file name in the wheel: sha256 of its content}, without the RECORD (it lists the others' hashes)."""
    with zipfile.ZipFile(path) as wheel:
        return {name: hashlib.sha256(wheel.read(name)).hexdigest() for name in wheel.namelist()
                if not name.endswith(".dist-info/RECORD")}


def package_files():
    """Every Python module of the package in the checkout, its subpackages (``tpu_closure_fix/synccheck/``...)
    included: a subpackage the build configuration left out would break ``import tpu_closure_fix``."""
    found = []
    for root, dirs, names in os.walk(os.path.join(REPO, "tpu_closure_fix")):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found += [os.path.relpath(os.path.join(root, name), REPO).replace(os.sep, "/") for name in names
                  if name.endswith(".py")]
    return tuple(sorted(found))


def missing_files(files):
    """The required files (ROOT_FILES, BOOTSTRAP_FILES, every module of the package) that ``files`` lacks."""
    return [name for name in ROOT_FILES + BOOTSTRAP_FILES + package_files() if name not in files]


def differences(first, second):
    """Files present in one listing and not the other, or with another content: sorted names."""
    return sorted(name for name in set(first) | set(second) if first.get(name) != second.get(name))


def install_and_status(dist, folder, python=sys.executable):
    """Install ``dist`` (sdist or wheel) into a fresh venv in ``folder``; (exit code, output) of
    ``tpu-closure-fix status`` there, or (None, the failing step's output)."""
    venv = os.path.join(folder, "venv")
    code, output = run([python, "-m", "venv", venv])
    if code != 0:
        return None, "creating the venv failed:\n" + output
    code, output = run([os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q",
                        "--disable-pip-version-check", dist])
    if code != 0:
        return None, "pip install %s failed:\n%s" % (os.path.basename(dist), output)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TPU_CLOSURE_FIX", "VIRTUAL_ENV")}
    return run([os.path.join(venv, "bin", "tpu-closure-fix"), "status"], env=env, cwd=folder)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="folder for the distributions and venvs (default: a temporary one)")
    args = parser.parse_args(argv)
    out = os.path.abspath(args.out) if args.out else tempfile.mkdtemp(prefix="tcf-package-")
    problems = []

    def report(ok, what, detail=""):
        print("%s %s%s" % ("ok  " if ok else "FAIL", what, ("\n" + detail) if detail and not ok else ""))
        if not ok:
            problems.append(what)

    ensure_tools()
    dists = build(out)
    report(True, "built " + ", ".join(os.path.basename(p) for p in sorted(set(dists.values()))))
    ok, output = twine_check(dists.values())
    report(ok, "twine check --strict", output)
    listings = {key: wheel_files(dists[key]) for key in ("wheel", "wheel_from_sdist")}
    for key, files in listings.items():
        absent = missing_files(files)
        report(not absent, "%s holds %s and every module of tpu_closure_fix (%d, subpackages included)"
               % (key, ", ".join(ROOT_FILES + BOOTSTRAP_FILES), len(package_files())), "missing: %s" % absent)
    diff = differences(listings["wheel"], listings["wheel_from_sdist"])
    report(not diff, "the wheel built from the sdist holds the same files", "differ: %s" % diff)
    for key in ("sdist", "wheel"):
        code, output = install_and_status(dists[key], tempfile.mkdtemp(prefix=key + "-", dir=out))
        report(code == 0, "installed from the %s, tpu-closure-fix status exits 0" % key, output[-3000:])
    print("%d check(s) failed (distributions in %s)" % (len(problems), out) if problems
          else "all checks passed (distributions in %s)" % out)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

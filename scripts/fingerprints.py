#!/usr/bin/env python
"""Code fingerprints of the call-site table's methods, per variant and release.

For every row of ``tpu_closure_fix.sites.CALL_SITES`` with code of its own (a ``fix``, or an
upstream-fixed row: a release past the verified ones is "fixed upstream" only when identical), this
measures the fingerprint (:mod:`tpu_closure_fix.identity`) of the method the row
patches, in each release it can see:

* ``targets``: installed version-matrix targets (scripts/targets.py). Each target is
  imported in a subprocess with its folder on ``PYTHONPATH`` (and the shim off), and
  the live method is fingerprinted the way the engine does it. The method's source
  is also located in the file without importing; both must agree.
* ``wheels``: wheel files (``pip download --no-deps``), read without installing or
  importing: the module's source is taken from the zip and the method located with
  ``ast``. The release is the wheel's version (the vendored ``lightning_lite`` /
  ``lightning_fabric`` inside pytorch-lightning and the sub-packages of ``lightning``
  carry that same version).
* ``merge``: combine JSON outputs (e.g. targets installed and measured one at a
  time); two different fingerprints for one (variant, release) are a problem.
* ``check``: recompute from installed targets and compare with the fingerprints
  recorded in the table (the rows' ``fingerprints`` field) or in a JSON file.

Only (variant, release) pairs where the release is inside the row's ``releases``
range are reported. Output: a readable table on stdout, and ``--json FILE``
({variant: {release: fingerprint}}; ``-`` for stdout instead of the table).

Usage::

    python scripts/fingerprints.py targets [NAME ...] [--root DIR] [--json FILE]
    python scripts/fingerprints.py wheels WHEEL_OR_DIR ... [--json FILE]
    python scripts/fingerprints.py merge FILE.json ... [--json FILE]
    python scripts/fingerprints.py check [NAME ...] [--root DIR] [--against FILE.json]
    python scripts/fingerprints.py --check ...               # same as "check"

Without names, ``targets`` and ``check`` use every target that is installed (they
never install one). ``check`` exits 1 on any difference, missing record or
unreadable method. Python 3.8+, standard library only (plus this repository).
"""
import argparse
import ast
import json
import os
import re
import subprocess
import sys
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDENTITY = os.path.join(REPO, "tpu_closure_fix", "identity.py")
HERE = os.path.abspath(__file__)


# --------------------------------------------------------------------------- helpers shared with the child


def load_identity():
    """tpu_closure_fix/identity.py loaded by path: no package import, so the shim is
    not activated in the process that imports the targets."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_tpu_closure_fix_identity", IDENTITY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def definition_source(text, qualname):
    """Source segment of ``qualname`` ("Class.method" or "function") in module text:
    from its first decorator to the end of its body, or None when not defined there
    (the attribute is inherited, or assigned rather than defined)."""
    tree = ast.parse(text)
    body = tree.body
    node = None
    for part in qualname.split("."):
        node = _last_definition(body, _source_name(node, part))
        if node is None:
            return None
        body = node.body
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    lines = text.splitlines(True)
    first = min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])
    return "".join(lines[first - 1:node.end_lineno])


def _source_name(owner, name):
    """How ``name`` (a table qualname part) is spelled in the source of class ``owner``: a private method
    ``_Class__step`` is written ``__step`` there (Python mangles it when compiling the class)."""
    if isinstance(owner, ast.ClassDef):
        prefix = "_%s__" % owner.name.lstrip("_")
        if name.startswith(prefix) and not name.endswith("__"):
            return name[len(prefix) - 2:]
    return name


def _last_definition(body, name):
    """The definition the name is bound to after the block runs (the last one wins);
    definitions under ``if``/``try`` at the same level are included."""
    found = None
    for statement in body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and statement.name == name:
            found = statement
        elif isinstance(statement, (ast.If, ast.Try)):
            nested = [child for block in ("body", "orelse", "finalbody") for child in getattr(statement, block, [])]
            nested += [child for handler in getattr(statement, "handlers", []) for child in handler.body]
            found = _last_definition(nested, name) or found
    return found


def _child(rows):
    """Run inside the target's environment: import each row's module, fingerprint the
    method live and from its file. Returns one dict per row."""
    import importlib

    identity = load_identity()
    results = []
    for row in rows:
        result = dict(row, release=None, file=None, fingerprint=None, from_file=None, reason="")
        results.append(result)
        try:
            module = importlib.import_module(row["module"])
        except Exception as exc:  # not in this target: any import error means "not here"
            result["reason"] = "does not import: %s: %s" % (type(exc).__name__, (str(exc).splitlines() or [""])[0])
            continue
        result["file"] = getattr(module, "__file__", None)
        result["release"] = _loaded_release(row["package"])
        function, why = _defined_function(module, row["qualname"])
        if function is None:
            result["reason"] = why
            continue
        found = identity.examine(function)
        result["fingerprint"], result["reason"] = found.value, found.reason
        try:
            with open(result["file"], encoding="utf-8") as handle:
                segment = definition_source(handle.read(), row["qualname"])
            result["from_file"] = identity.fingerprint_source(segment) if segment else None
        except (OSError, ValueError, SyntaxError, TypeError) as exc:
            result["from_file_error"] = str(exc)
    return results


def _loaded_release(package):
    # The engine's rule (tpu_closure_fix.releases.loaded_release), restated here so the
    # child never imports the shim's package.
    top = sys.modules.get(package.split(".")[0])
    for holder in (top, getattr(top, "__about__", None)):
        version = getattr(holder, "__version__", None)
        if isinstance(version, str) and version:
            return version
    return None


def _defined_function(module, qualname):
    owner_path, _, attribute = qualname.rpartition(".")
    owner = module
    for part in owner_path.split(".") if owner_path else []:
        owner = getattr(owner, part, None)
        if owner is None:
            return None, "%s has no %s" % (module.__name__, owner_path)
    namespace = vars(owner)
    if attribute not in namespace:
        return None, "%s does not define %s itself" % (owner_path or module.__name__, attribute)
    return namespace[attribute], ""


# --------------------------------------------------------------------------- the table


def table_rows():
    """Rows with code of their own (a fix, or the upstream fix), as plain dicts, from the repository's
    call-site table (inheriting rows have no code of their own)."""
    os.environ["TPU_CLOSURE_FIX"] = "0"  # reading the table must not arm the shim in this process
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from tpu_closure_fix import sites

    rows = []
    for site in sites.CALL_SITES:
        if getattr(site, "inherits", None):
            continue
        rows.append({"variant": site.variant, "package": site.package, "module": site.module,
                     "qualname": site.qualname, "releases": site.releases,
                     "recorded": dict(getattr(site, "fingerprints", None) or {})})
    return rows


def in_range(release, specifier):
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from tpu_closure_fix.releases import in_range as _in_range

    return _in_range(release, specifier)


def recorded_fingerprints(rows):
    """{variant: {release: fingerprint}} as recorded in the table."""
    return {row["variant"]: dict(row["recorded"]) for row in rows if row["recorded"]}


# --------------------------------------------------------------------------- measuring


class Measurements(object):
    """Fingerprints per (variant, release), where each came from, and the problems met."""

    def __init__(self):
        self.values = {}  # variant -> release -> fingerprint (None: could not be read)
        self.sources = {}  # (variant, release) -> [where...]
        self.problems = []

    def add(self, variant, release, value, where, reason=""):
        known = self.values.setdefault(variant, {})
        if release in known and known[release] != value:
            self.problems.append("%s %s: %s from %s, but %s from %s"
                                 % (variant, release, value, where, known[release],
                                    ", ".join(self.sources[(variant, release)])))
        if value is None:
            self.problems.append("%s %s: no fingerprint (%s) in %s" % (variant, release, reason, where))
        known.setdefault(release, value)
        self.sources.setdefault((variant, release), []).append(where)

    def as_json(self):
        identity = load_identity()
        return {variant: {release: releases[release] for release in sorted(releases, key=identity.release_key)}
                for variant, releases in sorted(self.values.items())}


def targets_module():
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    try:
        import targets
    finally:
        sys.path.pop(0)
    return targets


def installed_targets(names, root):
    targets = targets_module()
    if not names:
        return [name for name in targets.TARGETS if targets.is_installed(name, root)]
    missing = [name for name in names if name not in targets.TARGETS]
    if missing:
        raise ValueError("unknown target(s): %s; known: %s" % (", ".join(missing), ", ".join(targets.TARGETS)))
    absent = [name for name in names if not targets.is_installed(name, root)]
    if absent:
        raise ValueError("target(s) not installed: %s (python scripts/targets.py install NAME)" % ", ".join(absent))
    return list(names)


def measure_targets(names, root=None, rows=None, measurements=None):
    """Import each installed target's call-site modules in a subprocess and record
    the fingerprints of rows whose range holds the loaded release."""
    targets = targets_module()
    rows = rows if rows is not None else table_rows()
    measurements = measurements or Measurements()
    for name in names:
        path = targets.target_dir(name, root)
        env = targets.target_env(path)
        env["TPU_CLOSURE_FIX"] = "0"
        payload = [{key: row[key] for key in ("variant", "package", "module", "qualname")} for row in rows]
        proc = subprocess.run([targets._python(), HERE, "_child"], input=json.dumps(payload), env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                              timeout=900)
        if proc.returncode != 0:
            measurements.problems.append("target %s: the import subprocess failed (exit %d): %s"
                                         % (name, proc.returncode, proc.stderr.strip()[-2000:]))
            continue
        by_variant = {row["variant"]: row for row in rows}
        for result in json.loads(proc.stdout.strip().splitlines()[-1]):
            row = by_variant[result["variant"]]
            release = result["release"]
            if result["file"] is None or release is None or not in_range(release, row["releases"]):
                continue
            if not os.path.realpath(result["file"]).startswith(os.path.realpath(str(path)) + os.sep):
                continue  # loaded from the base venv, not from this target
            where = "target %s (import)" % name
            measurements.add(row["variant"], release, result["fingerprint"], where, result["reason"])
            if result["fingerprint"] is not None and result.get("from_file") != result["fingerprint"]:
                measurements.problems.append("%s %s in target %s: live code %s, source file %s"
                                             % (row["variant"], release, name, result["fingerprint"],
                                                result.get("from_file") or result.get("from_file_error")))
    return measurements


_WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-.*\.whl$")


def wheel_files(paths):
    found = []
    for path in paths:
        if os.path.isdir(path):
            found.extend(os.path.join(path, name) for name in sorted(os.listdir(path)) if name.endswith(".whl"))
        else:
            found.append(path)
    return found


def measure_wheels(paths, rows=None, measurements=None):
    """Fingerprint each row's method straight from the wheel's source files."""
    identity = load_identity()
    rows = rows if rows is not None else table_rows()
    measurements = measurements or Measurements()
    for path in wheel_files(paths):
        parsed = _WHEEL_NAME.match(os.path.basename(path))
        if parsed is None:
            raise ValueError("not a wheel file name: %s (expected NAME-VERSION-...whl)" % path)
        release = parsed.group("version")
        with zipfile.ZipFile(path) as wheel:
            names = set(wheel.namelist())
            for row in rows:
                member = row["module"].replace(".", "/") + ".py"
                if member not in names or not in_range(release, row["releases"]):
                    continue
                where = "wheel %s" % os.path.basename(path)
                segment = definition_source(wheel.read(member).decode("utf-8"), row["qualname"])
                if segment is None:
                    measurements.add(row["variant"], release, None, where,
                                     "%s not defined in %s" % (row["qualname"], member))
                    continue
                measurements.add(row["variant"], release, identity.fingerprint_source(segment), where)
    return measurements


def merge_files(paths):
    measurements = Measurements()
    for path in paths:
        with open(path) as handle:
            for variant, releases in json.load(handle).items():
                for release, value in releases.items():
                    measurements.add(variant, release, value, os.path.basename(path), "recorded as null")
    return measurements


# --------------------------------------------------------------------------- checking


def compare(measured, recorded, by_release=True):
    """Problems (strings) between measured and recorded {variant: {release: fingerprint}}.
    Every measured release must be recorded with the same fingerprint; recorded
    releases that were not measured are not judged. ``by_release=False`` (the
    table, which names each distinct code once, by its newest release): the
    measured fingerprint must be one the variant records, whatever release names it."""
    problems = []
    for variant, releases in sorted(measured.items()):
        for release, value in sorted(releases.items()):
            if value is None:
                continue  # already a measurement problem
            if not by_release:
                known = set(recorded.get(variant, {}).values())
                if value not in known:
                    problems.append("%s %s: measured %s, not among the row's recorded %s"
                                    % (variant, release, value, sorted(known) or "(none)"))
                continue
            want = recorded.get(variant, {}).get(release)
            if want is None:
                problems.append("%s %s: measured %s, not recorded" % (variant, release, value))
            elif want != value:
                problems.append("%s %s: measured %s, recorded %s" % (variant, release, value, want))
    return problems


def check(names=None, root=None, recorded=None):
    """Recompute the fingerprints of the installed targets (all installed if ``names``
    is empty) and compare with ``recorded`` ({variant: {release: fingerprint}};
    default: the table's ``fingerprints`` field). Returns the list of problems."""
    names = installed_targets(names, root)
    if not names:
        return ["no target is installed (python scripts/targets.py install NAME)"]
    rows = table_rows()
    by_release = recorded is not None
    if recorded is None:
        recorded = recorded_fingerprints(rows)
        if not recorded:
            return ["the call-site table records no fingerprints (no row has a non-empty `fingerprints` field); "
                    "compare with a file: --against FILE.json"]
    measurements = measure_targets(names, root, rows)
    return measurements.problems + compare(measurements.values, recorded, by_release=by_release)


# --------------------------------------------------------------------------- output


def render_table(values, sources=None):
    """Readable table: per variant, runs of consecutive releases sharing a fingerprint."""
    identity = load_identity()
    lines = ["%-24s %-32s %-24s %s" % ("variant", "releases", "fingerprint", "same code as previous?")]
    for variant, releases in sorted(values.items()):
        ordered = sorted(releases, key=identity.release_key)
        previous = None
        for value, group in _runs(ordered, releases):
            span = group[0] if len(group) == 1 else "%s .. %s (%d)" % (group[0], group[-1], len(group))
            relation = "" if previous is None else ("yes" if value == previous else "no: code changed")
            lines.append("%-24s %-32s %-24s %s" % (variant, span, value or "(none)", relation))
            previous = value
    return "\n".join(lines)


def _runs(ordered, releases):
    runs = []
    for release in ordered:
        if runs and runs[-1][0] == releases[release]:
            runs[-1][1].append(release)
        else:
            runs.append((releases[release], [release]))
    return runs


def write_json(values, destination):
    text = json.dumps(values, indent=2, sort_keys=False) + "\n"
    if destination == "-":
        sys.stdout.write(text)
    else:
        with open(destination, "w") as handle:
            handle.write(text)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--check"]:  # the spelling the docs use for the check command
        argv[0] = "check"
    if argv[:1] == ["_child"]:
        print(json.dumps(_child(json.load(sys.stdin))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    sub.required = True
    for command, help_text in (("targets", "fingerprint installed targets (all installed if none named)"),
                               ("check", "recompute from installed targets and compare with the table")):
        sp = sub.add_parser(command, help=help_text)
        sp.add_argument("names", nargs="*", metavar="NAME")
        sp.add_argument("--root", default=None, help="targets root (default: .cache/targets)")
        if command == "check":
            sp.add_argument("--against", metavar="FILE.json",
                            help="compare with this {variant: {release: fingerprint}} file instead of the table")
        else:
            sp.add_argument("--json", metavar="FILE", help="also write the JSON here ('-': stdout, no table)")
    sp = sub.add_parser("wheels", help="fingerprint from wheel files, without installing them")
    sp.add_argument("paths", nargs="+", metavar="WHEEL_OR_DIR")
    sp.add_argument("--json", metavar="FILE", help="also write the JSON here ('-': stdout, no table)")
    sp = sub.add_parser("merge", help="merge JSON outputs (targets measured one at a time, wheels); "
                                      "two different fingerprints for one release are a problem")
    sp.add_argument("paths", nargs="+", metavar="FILE.json")
    sp.add_argument("--json", metavar="FILE", help="also write the JSON here ('-': stdout, no table)")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except ValueError as exc:
        print("fingerprints.py: %s" % exc, file=sys.stderr)
        return 2


def _run(args):
    if args.command == "check":
        recorded = None
        if args.against:
            with open(args.against) as handle:
                recorded = json.load(handle)
        problems = check(args.names, args.root, recorded)
        for problem in problems:
            print("PROBLEM: " + problem)
        print("fingerprints check: %s" % ("%d problem(s)" % len(problems) if problems else "ok"))
        return 1 if problems else 0

    if args.command == "targets":
        measurements = measure_targets(installed_targets(args.names, args.root), args.root)
    elif args.command == "wheels":
        measurements = measure_wheels(args.paths)
    else:
        measurements = merge_files(args.paths)
    values = measurements.as_json()
    if args.json:
        write_json(values, args.json)
    if args.json != "-":
        print(render_table(values))
    for problem in measurements.problems:
        print("PROBLEM: " + problem, file=sys.stderr)
    return 1 if measurements.problems else 0


if __name__ == "__main__":
    sys.exit(main())

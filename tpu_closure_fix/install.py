"""Where the running copy of tpu-closure-fix came from, and the command that installs it into an interpreter.

The package is not on the index (PyPI): ``pip install tpu-closure-fix`` finds nothing. What installs it is
what the running copy was installed from, read from facts, never guessed:

1. a source checkout: the folder above the package holds the project's ``pyproject.toml`` (run from a clone);
2. the PEP 610 record pip writes into the dist-info (``direct_url.json``) when it installs from a local folder
   (``pip install /path/to/clone``) or a wheel file: that folder or file, while it still exists;
3. a dist-info without that record, installed by pip from an index: that index has this release.

Each command names the interpreter (``PYTHON -m pip install ...``), so it installs into that interpreter's
site-packages (never ``--target``, whose folder Python reads no start-up file from).
"""
import os
import shlex
from collections import namedtuple

#: The distribution name of this project (pyproject.toml).
DISTRIBUTION = "tpu-closure-fix"
#: How a reader gets a source when the running copy names none.
CLONE = "/path/to/a/clone/of/tpu-closure-fix"


def _package_dir():
    return os.path.dirname(os.path.abspath(__file__))


def _is_checkout(folder):
    """True when ``folder`` holds this project's pyproject.toml (a clone, or an unpacked source archive)."""
    path = os.path.join(folder, "pyproject.toml")
    try:
        with open(path) as handle:
            text = handle.read()
    except OSError:
        return False
    return 'name = "%s"' % DISTRIBUTION in text


def _file_path(url):
    """The local path of a ``file://`` URL, or None for any other URL."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(url or "")
    if parsed.scheme != "file":
        return None
    return unquote(parsed.path)


def _own_distribution(package_dir):
    """The distribution installed beside ``package_dir`` whose files hold its ``__init__.py`` (this very copy),
    or None."""
    try:
        from importlib import metadata

        for dist in metadata.distributions(name=DISTRIBUTION, path=[os.path.dirname(package_dir)]):
            located = os.path.abspath(str(dist.locate_file(os.path.join("tpu_closure_fix", "__init__.py"))))
            if located == os.path.join(package_dir, "__init__.py"):
                return dist
    except Exception:  # metadata that cannot be read: nothing to say about it
        return None
    return None


def source(package_dir=None):
    """``(kind, where)`` of the running copy: ``("checkout", folder)``, ``("wheel", file)``,
    ``("index", release)``, or ``(None, why)`` when nothing names a source that still exists."""
    import json

    package_dir = package_dir or _package_dir()
    root = os.path.dirname(package_dir)
    if _is_checkout(root):
        return "checkout", root
    dist = _own_distribution(package_dir)
    if dist is None:
        return None, "the copy at %s has no installation record" % package_dir
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "null")
    except ValueError:
        direct = None
    if direct:
        path = _file_path(direct.get("url"))
        if path and "archive_info" not in direct and _is_checkout(path):
            return "checkout", path
        if path and path.endswith(".whl") and os.path.isfile(path):
            return "wheel", path
        return None, "it was installed from %s, which is gone" % direct.get("url")
    if (dist.read_text("INSTALLER") or "").strip() == "pip":
        return "index", dist.version
    return None, "its installation record names no source"


def install_command(python=None, package_dir=None):
    """The command that installs the running copy into ``python``'s site-packages (``pip`` of the current
    environment when None). Without a source on record: the command for a clone, with the clone's path to fill."""
    kind, where = source(package_dir)
    pip = "%s -m pip install" % shlex.quote(python) if python else "pip install"
    if kind in ("checkout", "wheel"):
        return "%s %s" % (pip, shlex.quote(where))
    if kind == "index":
        return "%s %s" % (pip, shlex.quote("%s==%s" % (DISTRIBUTION, where)))
    return "%s %s" % (pip, CLONE)


# --------------------------------------------------------------------------- the one fix an outcome names
def startup_fix(facts):
    """What makes the start-up hook run in the interpreter of ``facts`` (:mod:`.verify.fresh`): one step."""
    python = facts.get("executable")
    if (facts.get("flags") or {}).get("no_site"):
        return ("add `import tpu_closure_fix` at the top of the training script (python -S reads no start-up "
                "file, so only the script itself can arm the shim)")
    origin = facts.get("shim_origin")
    # installed in a site directory but its start-up file missing or unread: installed again, files and all
    in_site = origin is not None and os.path.dirname(os.path.dirname(origin)) in (facts.get("site_dirs") or [])
    command = install_command(python)
    if in_site:
        command = command.replace(" -m pip install ", " -m pip install --force-reinstall ", 1) if python else \
            command.replace("pip install ", "pip install --force-reinstall ", 1)
    return "install tpu-closure-fix into the interpreter's site-packages: `%s` (not with --target)" % command


def site_fix(record, row=None):
    """What puts an unprotected site's fix in place (``record``: its status record; ``row``: a call-site row of
    it, whose distribution and releases a pin names): one step."""
    from .config import DISABLE_VAR, ENV_VAR

    reason = record.get("reason") or ""
    if record.get("verdict") == "disabled":
        if reason.startswith(DISABLE_VAR):
            return "`unset %s` (or leave %s out of it)" % (DISABLE_VAR, record.get("integration") or "it")
        if reason.startswith(ENV_VAR + "="):
            return "`unset %s`" % ENV_VAR
        if "disable()" in reason:
            return "remove the call of tpu_closure_fix.disable() from the training script"
        return "start the training script with `import tpu_closure_fix` (the shim was not enabled there)"
    if row is None:
        return "pin a release docs/support.md lists"
    return "pin a release docs/support.md lists: `%s`" % pin_command(row)


#: A line that installs with today's pip beside the interpreter's torch, where the plain one does not: for every
#: release of ``distribution`` in ``releases`` (``>=A,<B``), ``pip install DIST==RELEASE`` and, for a call-site
#: row whose whole range lies in ``releases``, ``pip install 'DIST<range>'`` fail; ``line`` (the arguments after
#: ``pip install``) installs the nearest release that does, with the pins it needs to import beside torch 2.x;
#: ``why`` says what fails. ``torch``: the torch release the line installs (None: it leaves torch as it is); such
#: an entry stands for its rows only, a release of its own (a copy beside the script) installing as it is.
#: Each line is resolved by today's pip in the tests (tests/fixlines), beside a held torch.
Install = namedtuple("Install", "distribution releases line why torch")
INSTALLS = (
    Install("pytorch-lightning", ">=1.3.0,<1.4.0",
            "pytorch-lightning==1.4.9 torchmetrics==0.5.0 'numpy<2' 'protobuf<4' 'setuptools<82'",
            "it needs PyYAML<=5.4.1, which has no wheel for Python 3.10+ and whose source no longer builds", None),
    Install("pytorch-lightning", ">=1.5.4,<1.6.0",
            "pytorch-lightning==1.5.3 torchmetrics==0.7.2 'numpy<2' 'protobuf<4' 'setuptools<82'",
            "its metadata torch>=1.7.* is invalid since pip 24.1; 1.5.10.post0 pins setuptools==59.5.0, "
            "which torch 2.x refuses", None),
    Install("pytorch-lightning", ">=1.6.0,<1.6.5.post0",
            "pytorch-lightning==1.6.5.post0 torchmetrics==0.9.2 'numpy<2' 'protobuf<4' 'setuptools<82'",
            "its metadata torch>=1.8.* is invalid since pip 24.1", None),
    Install("pytorch-lightning", ">=1.7.0,<1.8.4",
            "pytorch-lightning==1.8.6 torchmetrics==0.11.4 lightning-utilities==0.4.2 'numpy<2' 'setuptools<82'",
            "its metadata torch>=1.9.* is invalid since pip 24.1", None),
    Install("lightning-lite", ">=1.8.0,<1.8.4",
            "lightning-lite==1.8.6 lightning-utilities==0.4.2 'numpy<2' 'setuptools<82'",
            "its metadata torch>=1.9.* is invalid since pip 24.1", None),
    Install("lightning", ">=1.8.0,<1.8.4",
            "lightning==1.8.6 torchmetrics==0.11.4 lightning-utilities==0.4.2 'numpy<2' 'setuptools<82'",
            "its metadata torch>=1.9.* is invalid since pip 24.1", None),
    Install("torch-xla", ">=2.1.0,<2.10",
            "torch==2.9.0 torch-xla==2.9.0",
            "torch_xla runs only beside the torch release it was built for", "2.9.0"),
)


def _bounds(releases):
    """``(lowest, above)`` Versions of a ``>=A,<B`` specifier (None where a side is open)."""
    from packaging.version import Version

    low = high = None
    for clause in releases.split(","):
        clause = clause.strip()
        if clause.startswith(">="):
            low = Version(clause[2:])
        elif clause.startswith("<") and not clause.startswith("<="):
            high = Version(clause[1:])
    return low, high


def _entry_for_range(distribution, releases):
    """The :data:`INSTALLS` entry of ``distribution`` whose releases hold the whole range ``releases``."""
    low, high = _bounds(releases)
    for entry in INSTALLS:
        if entry.distribution != distribution:
            continue
        entry_low, entry_high = _bounds(entry.releases)
        if (entry_low is None or (low is not None and entry_low <= low)) and \
                (entry_high is None or (high is not None and high <= entry_high)):
            return entry
    return None


def install_entry(distribution, release):
    """The :data:`INSTALLS` entry whose releases hold ``release`` of ``distribution`` (one that leaves torch
    alone), or None."""
    from .releases import in_range

    for entry in INSTALLS:
        if entry.distribution == distribution and entry.torch is None and in_range(release, entry.releases):
            return entry
    return None


def row_distribution(row):
    """The distribution a call-site row's pin names: the first one of its ``distribution`` cell."""
    return row.distribution.split(" | ")[0].split(" (")[0]


def pin_command(row):
    """The ``pip install ...`` that puts a release of a call-site row in place: ``'<distribution><releases>'``, or
    the :data:`INSTALLS` line where no release of that range installs with today's pip."""
    name = row_distribution(row)
    entry = _entry_for_range(name, row.releases)
    if entry is not None:
        return "pip install %s" % entry.line
    return "pip install %s" % shlex.quote("%s%s" % (name, row.releases))


def release_command(distribution, release):
    """``(command, why)``: the ``pip install ...`` of ``release`` of ``distribution``, and None; or, where that
    release does not install with today's pip (:data:`INSTALLS`), the line of the nearest release that does,
    and why the release's own line fails."""
    entry = install_entry(distribution, release)
    if entry is not None:
        return "pip install %s" % entry.line, entry.why
    return "pip install %s" % shlex.quote("%s==%s" % (distribution, release)), None


def newest_row(module):
    """The row of the call-site table, among those of ``module``'s top-level package, whose releases reach
    highest (a verified range to pin), or None when the table has none."""
    from packaging.version import InvalidVersion, Version

    from .sites import CALL_SITES

    top = module.split(".")[0]

    def upper(row):
        bounds = [part.strip()[1:] for part in row.releases.split(",") if part.strip().startswith("<")]
        try:
            return Version(bounds[0].lstrip("=")) if bounds else Version("0")
        except InvalidVersion:
            return Version("0")

    rows = [row for row in CALL_SITES if row.package.split(".")[0] == top]
    return max(rows, key=upper) if rows else None

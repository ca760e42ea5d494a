"""Frameworks in the directory of the training script: what ``python train.py`` imports first.

Python puts the script's directory first on ``sys.path`` (the working directory for ``python -m`` and
``-c``), so a framework package there -- a vendored ``pytorch_lightning/`` beside ``train.py`` -- is the one a
training run imports, whatever site-packages holds. The fresh interpreter of ``status`` never searches that
directory (:mod:`.child`: code planted there must never run), so its verdicts are about the other copy. This
module finds such packages by reading the directory alone (names, and the ``__version__`` literal of their
source, never executed); ``status`` and ``check`` then give no verdict on them (COULD NOT VERIFY, naming the
package and the directory), unless the fresh interpreter imported those very files from another path entry.
"""
import ast
import importlib.machinery
import os
import stat

#: Files of a package that may hold its ``__version__ = "..."`` literal, in the order they are read.
VERSION_FILES = ("__init__.py", "__about__.py", "__version__.py", "version.py")


#: The help of ``--script`` (``status`` and ``check``).
SCRIPT_HELP = ("the training script: its directory, which Python searches first, is checked for a framework "
               "there (default: the working directory)")


def script_argument(text):
    """An ``argparse`` type: the training script, an existing file (its absolute path)."""
    import argparse

    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError("%s is not a file (give the training script, e.g. --script train.py)" % text)
    return os.path.abspath(text)


def directory_of(script=None):
    """The directory Python puts first on ``sys.path`` for ``python SCRIPT`` (symlinks resolved, as Python does),
    or the working directory without a script (``python -m``, ``-c``)."""
    if script is None:
        return os.getcwd()
    return os.path.dirname(os.path.realpath(script))


def searched(flags, version, environ):
    """Does an interpreter (``flags``: the caller's ``-I``/``-E``... list; ``version``: "3.11.7") put the script's
    directory on ``sys.path``? Not under ``-I``, nor with ``PYTHONSAFEPATH`` set on Python 3.11+ (unless ``-E``)."""
    if "-I" in flags:
        return False
    major_minor = tuple(int(part) for part in (version or "0.0").split(".")[:2] if part.isdigit())
    if environ.get("PYTHONSAFEPATH") and "-E" not in flags and major_minor >= (3, 11):
        return False
    return True


def _is_file(path):
    """Whether ``path`` is a regular file, as ``os.path.isfile`` says, except that a path that cannot be examined
    (no permission on a folder on the way, a loop of symbolic links, an I/O error) raises its ``OSError``
    instead of reading as absent: a scan that could not look has not found nothing."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def _module_files(folder, name):
    """Paths in ``folder`` that import as the top-level module or regular package ``name``; raises ``OSError``
    where one cannot be examined (:func:`_is_file`)."""
    found = []
    package = os.path.join(folder, name)
    if _is_file(os.path.join(package, "__init__.py")):
        found.append(package)
    for suffix in importlib.machinery.all_suffixes():
        if _is_file(package + suffix):
            found.append(package + suffix)
    return found


def packages_in(directory, packages):
    """``[(package, path)]``: each of ``packages`` (``pytorch_lightning``, ``optimum.neuron``) that a module or
    regular package in ``directory`` provides, where the import system would find it there first. A dotted
    package counts under a namespace folder (``optimum/neuron/``) or a regular one."""
    found = []
    for package in sorted(packages):
        parts = package.split(".")
        folder = directory
        for part in parts[:-1]:  # the namespace or regular packages holding it
            folder = os.path.join(folder, part)
        top_regular = _module_files(directory, parts[0])
        if len(parts) > 1 and top_regular:
            found.extend((package, path) for path in top_regular)
            continue
        found.extend((package, path) for path in _module_files(folder, parts[-1]))
    return found


def _version_literal(source):
    """The string assigned to ``__version__`` (or ``version``) at the top of a module's source, else None."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                isinstance(node.value.value, str):
            if any(isinstance(target, ast.Name) and target.id in ("__version__", "version") for target in node.targets):
                return node.value.value
    return None


def release_of(path):
    """The release a package folder's source states as a literal (read, never run), else None."""
    if not os.path.isdir(path):
        return None
    for name in VERSION_FILES:
        try:
            with open(os.path.join(path, name), encoding="utf-8") as handle:
                release = _version_literal(handle.read())
        except (OSError, UnicodeDecodeError):
            continue
        if release:
            return release
    return None


def _same_files(path, locations):
    real = os.path.realpath(path)
    return any(os.path.realpath(location) == real for location in locations or ())


def shadowing(directory, packages, origins):
    """``[{"package", "path", "release"}]``: the packages ``directory`` provides that a script run from it imports
    instead of what the fresh interpreter imported (``origins``: package -> the folders or files it imported it
    from; the same files there are what the verdicts are about)."""
    return [{"package": package, "path": path, "release": release_of(path)}
            for package, path in packages_in(directory, packages)
            if not _same_files(path, origins.get(package))]


def reason(found, directory, python=None):
    """The COULD NOT VERIFY reason naming the first package found (and how many more), with the one fix: that
    release installed into ``python`` (the interpreter asked about), where status can judge it, and the folder
    moved out of the script's way."""
    first = found[0]
    more = " (and %d more)" % (len(found) - 1) if len(found) > 1 else ""
    release = " %s" % first["release"] if first["release"] else ""
    return ("%s%s at %s%s is what a script run from %s imports (Python searches the script's directory first); "
            "status never runs code from there (a script elsewhere: name it with --script). Fix: %s, and move %s out "
            "of %s" % (first["package"], release, first["path"], more, directory, install_step(first, python),
                       first["path"], directory))


def scan_failure(directory, exc):
    """The COULD NOT VERIFY reason of a scan of the training script's directory (None: the working directory,
    which no longer exists) that failed with ``exc``, with its fix: read access for a permission refused, the
    path repaired for any other failure (a loop of symbolic links, an I/O error), or the script named."""
    import shlex

    failure = "%s: %s" % (type(exc).__name__, exc)
    if directory is None:
        return ("the working directory, where a script run from here finds its imports first, cannot be scanned "
                "(%s). Fix: run this command from the directory the training script is run from, or name the "
                "script: `--script PATH`" % failure)
    if isinstance(exc, PermissionError):
        fix = ("run this command as a user who can read %s (the one that trains; `ls -ld %s` shows its owner "
               "and mode)" % (directory, shlex.quote(directory)))
    else:
        fix = "repair or remove the path named there (`ls -l %s`)" % shlex.quote(directory)
    return ("the scan of %s, which a script run from there searches first for its imports, failed (%s): whether "
            "a framework there is what such a script imports is unknown. Fix: %s; for a training script elsewhere, "
            "name it: `--script PATH`" % (directory, failure, fix))


def install_command(found, python=None):
    """``(command, why)``: ``PYTHON -m pip install '<distribution>==<release>'`` of a package found in the script's
    directory (its distribution: the call-site table's for that package), or the line of the nearest release that
    installs with today's pip where that one does not (``why``: what fails, else None); without a release read,
    the newest verified range."""
    import shlex

    from .. import install
    from ..sites import CALL_SITES

    rows = [row for row in CALL_SITES if row.package == found["package"]]
    why = None
    if found.get("release") and rows:
        command, why = install.release_command(install.row_distribution(rows[0]), found["release"])
    else:
        row = install.newest_row(found["package"])
        command = install.pin_command(row) if row is not None else "pip install %s" % found["package"]
    return ("%s -m %s" % (shlex.quote(python), command) if python else command), why


def install_step(found, python=None):
    """The fix's step that puts the package found beside the script into the interpreter: its own release, or the
    nearest one that installs, saying why."""
    command, why = install_command(found, python)
    if why is None:
        return "install it into the interpreter, `%s`" % command
    return ("install into the interpreter the nearest release that installs (%s %s does not: %s), `%s`"
            % (found["package"], found["release"], why, command))

"""What a fresh interpreter of the environment does: the facts ``status`` and ``check`` report.

A verdict is about the interpreter that will train, never about the checking process: the checking
process may have imported the shim itself (``tpu-closure-fix`` does), while a training script started as
``python train.py`` gets the shim only from the start-up hook (the ``tpu_closure_fix.pth`` file in
site-packages, or a ``sitecustomize``). So :func:`run_status` starts a fresh interpreter -- this one by
default, or ``--python PATH`` -- with the caller's environment and interpreter flags (``-E``, ``-s``,
``-I``, ``-S``), and the child reports:

1. before it imports anything: whether the start-up module is loaded and armed, where ``tpu_closure_fix``
   would be imported from, which site directories hold the ``.pth`` file, the interpreter's flags;
2. then, importing the shim held back (the interpreter's own copy, or, when it cannot import one, this
   process's, only to read the call-site table) and activating it only where the start-up hook would, every
   site's record (:func:`tpu_closure_fix.outcome.payload.build`): what a script started there runs. Where the hook
   does not run, a site the shim would patch is ``unpatched (start-up hook inactive)``, never ``patched``.

:func:`startup_hook` turns the facts of (1) into "active" or "inactive, because ...", one numbered rule
at a time. The child never searches the working directory (:func:`.child.python_code`).
"""
import contextlib
import os
import shutil
import sys
import tempfile

from . import child

#: The start-up file pip puts into site-packages (see pyproject.toml).
PTH = "tpu_closure_fix.pth"

#: How long the fresh interpreter may take: it imports every installed framework.
TIMEOUT = 600.0

# The child's first statements: nothing imported from sys.path before the start-up facts are read.
_FACTS = r"""
import os
_w = sys.modules.get("_tpu_closure_fix_startup")
facts = {"executable": sys.executable, "version": "%d.%d.%d" % tuple(sys.version_info[:3]),
         "startup_loaded": _w is not None, "startup_armed": _w is not None and any(f is _w for f in sys.meta_path),
         "shim_at_start": "tpu_closure_fix" in sys.modules, "switch": os.environ.get("TPU_CLOSURE_FIX"),
         "flags": {"no_site": bool(sys.flags.no_site), "isolated": bool(getattr(sys.flags, "isolated", 0)),
                   "ignore_environment": bool(sys.flags.ignore_environment),
                   "no_user_site": bool(sys.flags.no_user_site)}}
import importlib.util
_spec = importlib.util.find_spec("tpu_closure_fix")
facts["shim_origin"] = _spec.origin if _spec is not None else None
import site
_dirs = list(getattr(site, "getsitepackages", lambda: [])())
if site.ENABLE_USER_SITE:
    _dirs.append(site.getusersitepackages())
facts["site_dirs"] = _dirs
facts["pth_in"] = [d for d in _dirs if os.path.isfile(os.path.join(d, __PTH__))]
"""

# Then: the shim (the interpreter's own, else this process's copy, last on the path) lists every site. It is
# imported held back (switched off, the zero-code check not asked for): the interpreter that trains activates it
# only through its start-up hook, so child_main (tpu_closure_fix.outcome.payload; in a release before it,
# tpu_closure_fix.report) activates it only where that hook runs.
_REPORT = r"""
if _spec is None:
    sys.dont_write_bytecode = True  # the lent copy is this process's: nothing written into it
    sys.path.extend(__FALLBACK__)
_held = {name: os.environ.pop(name, None) for name in __HELD__}
os.environ["TPU_CLOSURE_FIX"] = "0"
try:
    try:
        import tpu_closure_fix
        try:
            from tpu_closure_fix.outcome.payload import child_main as _child_main
        except ImportError:
            from tpu_closure_fix.report import child_main as _child_main
    finally:
        for _name, _value in _held.items():
            os.environ.pop(_name, None)
            if _value is not None:
                os.environ[_name] = _value
    _child_main(facts)
except Exception as exc:
    import json
    facts["error"] = "%s: %s" % (type(exc).__name__, exc)
    sys.stdout.write(__MARKER__ + json.dumps({"facts": facts}) + "\n")
"""

#: The variables the child's import of the shim runs without (see ``_REPORT``): the switch, and the zero-code
#: check's, which activation arms whatever the switch says.
HELD = ("TPU_CLOSURE_FIX", "TPU_CLOSURE_FIX_SYNC_CHECK")


def facts_here():
    """The facts of this very process, for ``status --here``: a harness that installed test doubles for
    torch_xla or the Neuron SDK in its own process (a fresh interpreter would not have them). Its start-up
    hook is not asked about (``here``)."""
    namespace = {"sys": sys}
    exec(_FACTS.replace("__PTH__", repr(PTH)), namespace)  # the same statements as the child's
    facts = namespace["facts"]
    facts["here"] = True
    return facts


def caller_flags(flags=None):
    """The interpreter flags of this process that change what a start-up reads: ``-I`` (which implies
    ``-E`` and ``-s``), else ``-E`` and ``-s``; and ``-S``."""
    flags = flags or sys.flags
    out = []
    if getattr(flags, "isolated", 0):
        out.append("-I")
    else:
        if flags.ignore_environment:
            out.append("-E")
        if flags.no_user_site:
            out.append("-s")
    if flags.no_site:
        out.append("-S")
    return out


#: What a child that cannot import the shim itself is lent, and nothing else of this process's environment. Not
#: wrapt nor packaging: this process's copies may not run on the child's Python (the asked interpreter can be
#: any 3.8+). The lent shim is never activated there (its start-up hook cannot run: the shim is not installed),
#: so it needs no wrapt; it compares releases with the child's own packaging, which every framework needs.
LENT = ("tpu_closure_fix",)


@contextlib.contextmanager
def _lent_folder():
    """A private folder (``mkdtemp``, mode 0700) holding only this process's tpu_closure_fix (a link, or a copy
    where links fail): appended last to the path of a child that cannot import the shim itself, so that it can
    read the call-site table without seeing this process's other packages (its frameworks would be taken for
    the asked interpreter's). Removed afterwards."""
    folder = tempfile.mkdtemp(prefix="tpu-closure-fix-lent-")
    try:
        for name in LENT:
            path = getattr(sys.modules.get(name), "__file__", None)
            if not path:
                continue
            package = os.path.dirname(os.path.abspath(path))
            try:
                os.symlink(package, os.path.join(folder, name))
            except OSError:
                shutil.copytree(package, os.path.join(folder, name))
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def command(python=None, flags=None, lent=None):
    """The fresh interpreter's command line (``lent``: the folder of :func:`_lent_folder`)."""
    code = (_FACTS + _REPORT).replace("__PTH__", repr(PTH)).replace("__FALLBACK__", repr([lent] if lent else [])) \
        .replace("__MARKER__", repr(child.RESULT_MARK)).replace("__HELD__", repr(HELD))
    argv = child.python_code(code, python=python)
    return argv[:1] + (caller_flags() if flags is None else list(flags)) + argv[1:]


#: After how many seconds of waiting for the fresh interpreter one line on stderr says what is awaited.
NOTICE_AFTER = 5.0


def run_status(python=None, flags=None, timeout=TIMEOUT, script=None, notice_after=NOTICE_AFTER, notice=None):
    """``(payload, error)``: the fresh interpreter's facts and records, or None and why it failed.

    ``payload["beside_script"]``: the framework packages in the directory of the training script ``script``
    (default: the working directory) that a script run from there imports instead of what the child imported
    (:mod:`.script_dir`; the child never searches that directory), with that ``directory``.

    A ``PYTHONPATH`` entry relative to the working directory is what the interpreter that trains, started here,
    follows: it is given to the child resolved against this working directory where that directory is this
    user's own (:func:`resolved_pythonpath`); else no verdict is given and the error says why. ``-E``/``-I``
    make every interpreter ignore ``PYTHONPATH``: then it does not matter. An interpreter older than
    :data:`OLDEST` gets no verdict either (:func:`too_old`): its payload comes back without records, the error
    naming its version and the fix. Waiting longer than ``notice_after`` seconds, one line on stderr (or
    ``notice(line)``) says what for."""
    flags = caller_flags() if flags is None else list(flags)
    env = child.safe_environment()
    if not {"-E", "-I"} & set(flags):
        entries, refused = resolved_pythonpath(os.environ.get("PYTHONPATH", ""), os.getcwd())
        if refused:
            return None, refused
        if entries:
            env["PYTHONPATH"] = os.pathsep.join(entries)
    asked = python or sys.executable
    with _lent_folder() as lent, _notice(waiting_line(asked, timeout), notice_after, notice):
        run = child.run_child(command(python, flags, lent), timeout, env=env)
    if run.timed_out:
        return None, ("%s did not list its call sites within %g s (--timeout; its processes were ended). Fix: make "
                      "`%s -c pass` return, or give it more time: `--timeout SECONDS`" % (asked, timeout, asked))
    if run.payload is None:
        return None, "%s could not report: %s. Fix: %s" % (asked, run.error or run.stderr_tail(),
                                                           unreported_fix(asked, run))
    older = too_old(run.payload.get("facts") or {})
    if older:  # what it reported holds for no script: the package cannot be installed there
        return {key: value for key, value in run.payload.items() if key != "records"}, older
    if "records" in run.payload:
        run.payload["beside_script"] = _beside_script(run.payload, flags, script)
    return run.payload, None


def waiting_line(python, timeout):
    """The line saying what ``status`` and ``check`` wait for, after :data:`NOTICE_AFTER` seconds."""
    return ("tpu-closure-fix: waiting for %s to list its call sites (it imports every installed framework; "
            "gives up after %g s, --timeout SECONDS)" % (python, timeout))


@contextlib.contextmanager
def _notice(line, after, notice=None):
    """Say ``line`` once (``notice(line)``; default: on stderr, fitted to the terminal) if the body still runs
    ``after`` seconds on."""
    import threading

    def say():
        if notice is not None:
            notice(line)
            return
        from .. import textfit

        sys.stderr.write(textfit.fit(line, textfit.width()) + "\n")
        sys.stderr.flush()

    timer = threading.Timer(after, say)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def resolved_pythonpath(value, cwd):
    """``(entries, refused)``: the absolute ``PYTHONPATH`` entries of ``value`` a child is given, each relative
    entry resolved against the working directory ``cwd`` the training starts in, and None; or None and why a
    relative entry is not followed. It is followed where it names a folder this user (or root) owns and no
    one else can write: code another user planted there would run in the check. An empty entry is never
    followed (the working directory itself: :func:`.child.safe_environment`); one naming no folder is left
    out (the interpreter that trains finds nothing there either)."""
    entries = []
    for entry in value.split(os.pathsep):
        if not entry:
            continue
        if os.path.isabs(entry):
            entries.append(entry)
            continue
        path = os.path.realpath(os.path.join(cwd, entry))
        if not os.path.isdir(path):
            continue
        why = untrusted(path)
        if why:
            return None, ("PYTHONPATH holds %r, relative to the working directory: it names %s, which %s, so no "
                          "checking interpreter runs code from it, while the one that trains would. If you trust "
                          "it, give it as an absolute path (for example PYTHONPATH=$PWD/%s) and check again"
                          % (entry, path, why, entry.rstrip("/") or "."))
        entries.append(path)
    return entries, None


def untrusted(path):
    """Why code in the folder ``path`` may be another user's (another owner, or others may write it), or None."""
    import stat

    info = os.stat(path)
    if info.st_uid not in (os.getuid(), 0):
        return "user id %d owns" % info.st_uid
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "others can write"
    return None


#: The oldest Python tpu-closure-fix runs on (pyproject.toml's requires-python).
OLDEST = (3, 8)
#: A program that states the interpreter's version and imports nothing (run with ``-S``: not even ``site``).
_VERSION_CODE = "import sys; print('%d.%d' % sys.version_info[:2])"


def version_of(python):
    """``(major, minor)`` of the interpreter ``python``, or None when it states none (not a Python, or broken)."""
    import subprocess

    try:
        out = subprocess.run([python, "-S", "-c", _VERSION_CODE], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             env=child.safe_environment(), timeout=60, universal_newlines=True).stdout
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    parts = out.strip().split(".")
    if len(parts) != 2 or not all(part.isdigit() for part in parts):
        return None
    return int(parts[0]), int(parts[1])


def too_old(facts):
    """Why no verdict is given about the interpreter whose ``facts`` the child reported, when it is older than
    :data:`OLDEST` (a --python can point at one: the shim imported from a PYTHONPATH entry may still run
    there, but no release installs there, so its verdict would hold for no training run); else None."""
    parts = str(facts.get("version") or "").split(".")
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None  # no version stated: the other rules decide
    if (int(parts[0]), int(parts[1])) >= OLDEST:
        return None
    return ("%s is Python %s, which tpu-closure-fix does not run on (it needs Python %d.%d or newer; pip installs "
            "no release there). Fix: train and check with a Python %d.%d or newer: give --python its interpreter "
            "(e.g. `--python /path/to/venv/bin/python`)" % ((facts.get("executable"), facts.get("version")) + OLDEST
                                                              + OLDEST))


def unreported_fix(python, run, version=None):
    """The one step after an interpreter that could not report (``run``: its :class:`.child.ChildRun`): give
    ``--python`` a Python the project runs on, where ``python`` is none; else read the child's whole output,
    kept in a private log file (the error named is its last line)."""
    version = version or version_of(python)
    if version is None:
        return ("give --python the python of the environment that trains, a Python %d.%d or newer (%s states no "
                "Python version)" % (OLDEST + (python,)))
    if version < OLDEST:
        return ("train and check with a Python %d.%d or newer: %s is Python %d.%d, which tpu-closure-fix does not "
                "run on" % (OLDEST + (python,) + version))
    return "read its whole output, the error's cause above its last line: `cat %s`" % _keep_output(run)


def _keep_output(run):
    """The path of a new private file (mode 0600) holding ``run``'s stdout and stderr."""
    handle, path = tempfile.mkstemp(prefix="tpu-closure-fix-status-", suffix=".log")
    with os.fdopen(handle, "w") as out:
        out.write("$ %s\n--- stdout\n%s\n--- stderr\n%s\n" % (" ".join(run.argv[:1]) + " -c ...",
                                                                  run.stdout or "", run.stderr or ""))
    return path


def _beside_script(payload, flags, script):
    """``{"directory", "found"}``: what :func:`.script_dir.shadowing` finds in the training script's directory,
    where the asked interpreter searches it (``found`` is empty where it does not); with ``"error"`` too (the
    reason, :func:`.script_dir.scan_failure`) when the scan itself failed: then nothing is known of it."""
    from .. import sites
    from . import script_dir

    directory = None
    try:
        directory = script_dir.directory_of(script)
        found = []
        if script_dir.searched(flags, payload["facts"].get("version"), os.environ):
            found = script_dir.shadowing(directory, sites.top_level_packages(), payload.get("origins") or {})
    except OSError as exc:
        return {"directory": directory, "found": [], "error": script_dir.scan_failure(directory, exc)}
    return {"directory": directory, "found": found}


def startup_hook(facts):
    """``(active, reason)``: does a script started in that interpreter get the shim at start, and why
    (not)? ``active`` is None when not asked. The first rule that applies decides."""
    from ..config import show_value
    from ..settings import parse_switch

    flags = facts.get("flags") or {}
    origin = facts.get("shim_origin")
    # 0. Not asked: ``status --here`` reports the process it runs in.
    if facts.get("here"):
        return None, "not asked (status --here reports this process, which imported tpu_closure_fix)"
    # 1. Switched off: the start-up module is read but arms nothing.
    if not parse_switch(facts.get("switch"))[0]:
        return False, "TPU_CLOSURE_FIX=%s switches the shim off" % show_value(facts.get("switch"))
    # 2. Armed at start (the .pth or a sitecustomize) with the shim importable there, or already imported.
    if facts.get("shim_at_start") or (facts.get("startup_armed") and origin is not None):
        return True, "armed at interpreter start by %s" % ("the start-up module" if facts.get("startup_armed")
                                                           else "a start-up file importing tpu_closure_fix")
    # 3. -S: no start-up file of site-packages is read.
    if flags.get("no_site"):
        return False, "python -S: the interpreter reads no start-up file of site-packages"
    # 4. Not installed for that interpreter at all.
    if origin is None:
        return False, "tpu_closure_fix is not installed for %s" % facts.get("executable")
    # 5. Installed outside every site directory: a --target folder or a PYTHONPATH entry.
    package_root = os.path.dirname(os.path.dirname(origin))
    site_dirs = [os.path.abspath(d) for d in facts.get("site_dirs") or []]
    if os.path.abspath(package_root) not in site_dirs:
        return False, ("tpu_closure_fix is imported from %s (a --target folder or a PYTHONPATH entry), and Python "
                       "reads start-up .pth files only from site-packages: nothing imports it at interpreter "
                       "start" % package_root)
    # 6. In site-packages, but its start-up file is missing or was not read.
    if not facts.get("pth_in"):
        return False, "%s is missing from %s (installed without its start-up files?)" % (PTH, package_root)
    if flags.get("isolated") or flags.get("no_user_site"):
        return False, "python -I/-s: the user site-packages holding %s is not read" % PTH
    return False, "%s is in %s but the start-up module was not armed" % (PTH, ", ".join(facts["pth_in"]))


"""``tpu-closure-fix run -- python train.py ...``: the patch in the script and in every child.

Like ``ddtrace-run`` / ``opentelemetry-instrument``: put the package's own
``tpu_closure_fix/_bootstrap`` directory, which holds a ``sitecustomize.py``
that arms the same lazy watcher as the ``.pth``
(``_tpu_closure_fix_startup.install()``), first on ``PYTHONPATH``, then
``os.execvp`` the command. Every Python interpreter started under it -- the
script, multiprocessing ``spawn``/``forkserver`` children, ``xmp.spawn``
workers, subprocesses -- inherits ``PYTHONPATH`` and is patched, whatever the
install mode (.pth skipped, an editable install, a ``--target`` directory, an
image whose site-packages ``.pth`` files are not processed). ``fork`` children
inherit the patched memory.

Nothing is written: the sitecustomize is a file of the installation, so no other
user can create, replace or redirect it unless they can already change the
package itself. Before use, the package directory, the bootstrap directory,
the file and its byte-code cache (if any) are checked: real directory / regular
file (no symbolic link), owned by the caller, root or the owner of the running
``launcher.py`` (whose code is already running), not writable by every user,
and group-writable only where ``launcher.py`` already is (same group). Anything
else is refused with a message naming the path. Since nothing is created there is
nothing to clean up, and ``run`` can ``exec`` the command: same process, so exit
codes and signals are the command's own.

``PYTHONPATH`` is kept exactly (empty entries, meaning the current directory,
included); one entry is put in front of it, and none when it already starts
with the bootstrap directory (``run`` inside ``run``). The sitecustomize then
imports the sitecustomize it shadows, if any, skipping every bootstrap directory
(of any installation) that already ran, so an image's own sitecustomize runs
once and nested launchers never chain into each other.

What defeats it: ``python -S`` (no sitecustomize at all), ``python -E`` and
``python -I`` (``PYTHONPATH`` is ignored), and commands that clear or filter
the environment before starting Python (``env -i``, ``sudo``). ``run`` warns on
stderr when the command is a Python interpreter given ``-S``, ``-E`` or ``-I``
-- directly, behind ``env`` (``env python -E``, ``env -S "python -E"``) or in
the ``#!`` line of a script -- and when ``env -i`` / ``env -u PYTHONPATH``
drops ``PYTHONPATH``; there, only the ``.pth`` (``-E``/``-I``) or
``import tpu_closure_fix`` in the script patches. A wrapper script that adds
such a flag itself is not seen. ``TPU_CLOSURE_FIX=0`` still disables everything.

An installation whose bootstrap directory cannot be one ``PYTHONPATH`` entry
(its path holds ``os.pathsep``, ``:``) is refused with exit status 2: Python
would split it and search the pieces relative to the working directory. A
command that cannot be started exits 127 when it does not exist and 126 when
it exists but cannot be run, as in a shell.
"""
import os
import re
import shutil
import stat
import sys

from .config import quote_value

#: Set in the command's environment to the bootstrap directory in use (information for reports and tests).
BOOTSTRAP_ENV = "TPU_CLOSURE_FIX_BOOTSTRAP"

#: The directory of the package that holds the shipped sitecustomize.py.
BOOTSTRAP_DIRNAME = "_bootstrap"

#: Interpreter options that keep the bootstrap from running, and why.
DEFEATING_FLAGS = {
    "S": "imports no sitecustomize",
    "E": "ignores PYTHONPATH",
    "I": "ignores PYTHONPATH (isolated mode)",
}

# A Python interpreter's file name: python, python3, python3.11, python3.13t, pypy3, python3-dbg ...
_PYTHON_NAME = re.compile(r"^(python|pypy)[0-9.]*[a-z]?(-dbg)?(\.exe)?$", re.IGNORECASE)


class BootstrapError(Exception):
    """The shipped bootstrap cannot be used safely; the message names the path and the reason."""


def _package_dir():
    return os.path.dirname(os.path.realpath(__file__))


def _problem(path, expected_type, reference):
    """Why ``path`` may not be trusted (None if it may): type, owner and who can write it.

    ``reference`` is the stat of the running ``launcher.py``: its owner, and the group that can write
    it, already control the code running now, so trusting them for the bootstrap adds nobody.
    """
    try:
        info = os.lstat(path)
    except OSError as exc:
        return "cannot read it (%s); is tpu-closure-fix installed as plain files (not a zip)?" % (
            exc.strerror or exc)
    if stat.S_ISLNK(info.st_mode):
        return "it is a symbolic link"
    if stat.S_IFMT(info.st_mode) != expected_type:
        return "it is not a %s" % ("directory" if expected_type == stat.S_IFDIR else "regular file")
    if not hasattr(os, "geteuid"):  # no POSIX owners and modes (Windows): nothing more to check
        return None
    euid = os.geteuid()
    if info.st_uid not in (euid, 0, reference.st_uid):
        return "it is owned by uid %d: not you (uid %d), root, or the owner of %s" % (
            info.st_uid, euid, os.path.realpath(__file__))
    if info.st_mode & stat.S_IWOTH:
        return "every user can write it (mode %s)" % oct(stat.S_IMODE(info.st_mode))
    same_group_already = reference.st_mode & stat.S_IWGRP and reference.st_gid == info.st_gid
    if info.st_mode & stat.S_IWGRP and not same_group_already:
        return "group %d can write it (mode %s), but not %s" % (
            info.st_gid, oct(stat.S_IMODE(info.st_mode)), os.path.realpath(__file__))
    return None


def _checked_paths(package, directory):
    """(path, type) of everything Python reads to run the bootstrap: the directories, the file, and its
    byte-code cache (Python loads a cached sitecustomize.*.pyc instead of the source when it is there)."""
    paths = [(package, stat.S_IFDIR), (directory, stat.S_IFDIR),
             (os.path.join(directory, "sitecustomize.py"), stat.S_IFREG)]
    cache = os.path.join(directory, "__pycache__")
    if os.path.lexists(cache):
        paths.append((cache, stat.S_IFDIR))
        if os.path.isdir(cache) and not os.path.islink(cache):
            paths.extend((os.path.join(cache, name), stat.S_IFREG) for name in sorted(os.listdir(cache))
                         if name.startswith("sitecustomize."))
    return paths


def _pythonpath_problem(directory):
    """Why ``directory`` cannot be one ``PYTHONPATH`` entry (None if it can).

    Python splits ``PYTHONPATH`` at every ``os.pathsep``: installed under ``/opt/co:lon``, the entry
    ``/opt/co:lon/tpu_closure_fix/_bootstrap`` becomes ``/opt/co`` and ``lon/tpu_closure_fix/_bootstrap``,
    a path relative to the working directory, where another user may have planted a sitecustomize.py.
    A relative entry has the same problem on its own.
    """
    if os.pathsep in directory:
        return "it holds %r, which separates PYTHONPATH entries: Python would split it and search the pieces, " \
               "relative to the working directory" % os.pathsep
    if not os.path.isabs(directory):
        return "it is not an absolute path: Python would search it relative to the working directory"
    return None


def bootstrap_dir():
    """The verified directory that holds the shipped sitecustomize.py; raises :class:`BootstrapError`."""
    package = _package_dir()
    directory = os.path.join(package, BOOTSTRAP_DIRNAME)
    problem = _pythonpath_problem(directory)
    if problem:
        raise BootstrapError("cannot put %s on PYTHONPATH: %s. Install tpu-closure-fix under a path without %r, "
                             "or add `import tpu_closure_fix` to the script" % (
                                 quote_value(directory, limit=300), problem, os.pathsep))
    reference = os.stat(os.path.realpath(__file__))
    for path, expected_type in _checked_paths(package, directory):
        problem = _problem(path, expected_type, reference)
        if problem:
            raise BootstrapError("refusing to use %s: %s" % (path, problem))
    return directory


def _starts_with(pythonpath, directory):
    """True if the first entry of ``pythonpath`` is ``directory`` (``run`` inside ``run``)."""
    if not pythonpath:
        return False
    first = pythonpath.split(os.pathsep, 1)[0]
    return bool(first) and os.path.realpath(first) == directory


def child_environment(environ=None):
    """The environment the command runs in: the bootstrap directory, then PYTHONPATH exactly as it was."""
    env = dict(os.environ if environ is None else environ)
    directory = bootstrap_dir()
    current = env.get("PYTHONPATH")
    if not _starts_with(current, directory):
        # An empty or unset PYTHONPATH has no entries: appending a separator would add one (the cwd).
        env["PYTHONPATH"] = directory + os.pathsep + current if current else directory
    env[BOOTSTRAP_ENV] = directory
    return env


#: ``env`` options that take an argument (attached or the next word).
_ENV_ARGUMENT = {"-u": "--unset", "-C": "--chdir", "-S": "--split-string"}


def _env_option(words, index):
    """``(name, argument, next index)`` of the ``env`` option at ``words[index]`` (argument None if it has none)."""
    word = words[index]
    for short, long in _ENV_ARGUMENT.items():
        if word in (short, long):
            return short, (words[index + 1] if index + 1 < len(words) else ""), index + 2
        if word.startswith(long + "="):
            return short, word.split("=", 1)[1], index + 1
        if word.startswith(short) and not word.startswith("--"):
            return short, word[len(short):], index + 1
    return word, None, index + 1


def _env_command(command):
    """``(the command that `env [OPTION]... [NAME=VALUE]... COMMAND` runs, the env options that drop
    PYTHONPATH)``; None when ``command`` is not ``env``."""
    if not command or os.path.basename(command[0]) != "env":
        return None
    words, index, clearing = list(command[1:]), 0, []
    while index < len(words) and words[index] != "--":
        if not words[index].startswith("-"):
            if "=" not in words[index]:
                return words[index:], clearing
            index += 1  # NAME=VALUE
            continue
        option, argument, index = _env_option(words, index)
        if option in ("-i", "-", "--ignore-environment") or (option == "-u" and argument == "PYTHONPATH"):
            clearing.append(option if argument is None else "%s %s" % (option, argument))
        elif option == "-S":  # the split string's words come next
            words[index:index] = argument.split()
    return words[index + 1:], clearing


def _shebang_command(command):
    """``command`` as the kernel runs it when ``command[0]`` is a script with a ``#!`` line, else None."""
    if not command:
        return None
    path = command[0] if os.sep in command[0] else shutil.which(command[0])
    if not path or not os.path.isfile(path):  # never open a FIFO or a device: reading could block
        return None
    try:
        with open(path, "rb") as handle:
            first = handle.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("latin-1").split()
    return words + [path] + list(command[1:]) if words else None


def effective_command(command, depth=4):
    """``(command, via, clearing)``: the Python command ``command`` ends up running, seen through ``env``
    and ``#!`` lines (``via``: how, for messages), and the ``env`` options that clear ``PYTHONPATH``."""
    via, clearing = [], []
    for _ in range(depth):
        if not command or _PYTHON_NAME.match(os.path.basename(command[0])):
            break
        behind_env = _env_command(command)
        if behind_env is not None:
            command, cleared = behind_env
            clearing.extend(cleared)
            via.append("behind `env`")
            continue
        script = _shebang_command(command)
        if script is None:
            break
        via.append("in the #! line of %s" % quote_value(command[0], limit=200))
        command = script
    return command, via, clearing


def interpreter_flags(command):
    """The single-letter options of ``command`` if it runs a Python interpreter directly, else an empty set.

    Reads options the way Python does, up to the script, ``-c``/``-m`` or ``--``: clusters
    (``-IE``), and the arguments of ``-W``/``-X`` (attached or the next word), which are not flags.
    """
    if not command or not _PYTHON_NAME.match(os.path.basename(command[0])):
        return set()
    flags = set()
    words = iter(command[1:])
    for word in words:
        if word == "--" or word == "-" or not word.startswith("-"):
            break
        if word.startswith("--"):
            if word == "--check-hash-based-pycs":
                next(words, None)
            continue
        for position, letter in enumerate(word[1:], 1):
            if letter in "cm":  # the rest is the command or the module name
                return flags
            if letter in "WX":
                if position == len(word) - 1:
                    next(words, None)  # its argument is the next word
                break
            flags.add(letter)
    return flags


def defeat_warnings(command):
    """One stderr line per option of a Python command that keeps the bootstrap from running: given directly,
    behind ``env`` (``env python -E``, ``env -S "python -E"``), or in a script's ``#!`` line; and one per
    ``env`` option that clears ``PYTHONPATH``."""
    command, via, clearing = effective_command(command)
    found = interpreter_flags(command)
    name = quote_value(os.path.basename(command[0]), limit=60)[1:-1] if command else ""
    where = " (%s)" % ", ".join(via) if via else ""
    lines = []
    for letter in sorted(found & set(DEFEATING_FLAGS)):
        remedy = ("add `import tpu_closure_fix` at the top of the script" if letter == "S" else
                  "only tpu-closure-fix's .pth file in that interpreter's site-packages, or "
                  "`import tpu_closure_fix` in the script, patches it")
        lines.append("tpu-closure-fix run: warning: `%s -%s`%s %s, so `run` cannot patch this command or its "
                     "Python children; %s.\n" % (name, letter, where, DEFEATING_FLAGS[letter], remedy))
    for option in clearing:
        lines.append("tpu-closure-fix run: warning: `env %s` drops PYTHONPATH, so `run` cannot patch the command "
                     "it starts; `import tpu_closure_fix` in the script patches it.\n" % option)
    return lines


def _cmd_run(args):
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        sys.stderr.write("tpu-closure-fix run: no command given (usage: tpu-closure-fix run -- python train.py)\n")
        return 2
    try:
        env = child_environment()
    except BootstrapError as exc:
        sys.stderr.write("tpu-closure-fix run: %s\n" % exc)
        return 2
    env.update(sync_check_environment(args))
    for line in defeat_warnings(command):
        sys.stderr.write(line)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        sys.stderr.write("tpu-closure-fix run: cannot run %s: %s\n" % (quote_value(command[0]), exc.strerror or exc))
        return _exec_failure_status(exc)


def _exec_failure_status(exc):
    """A shell's exit status for a command it could not run: 127 when the name leads to no file (not found,
    a path through a non-directory, a name too long to exist), 126 when it found one it cannot run (a
    directory, no execute permission, an unknown format)."""
    import errno

    return 127 if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG) else 126


def sync_check_environment(args):
    """The zero-code SyncCheck's variables for the command, from ``--sync-check`` / ``--sync-check-on-divergence``."""
    from .config import ON_DIVERGENCE_VAR, SYNC_CHECK_VAR

    env = {}
    if args.sync_check is not None:
        env[SYNC_CHECK_VAR] = str(args.sync_check)
    if args.sync_check_on_divergence is not None:
        env[ON_DIVERGENCE_VAR] = args.sync_check_on_divergence
    return env


def _sync_check_steps(raw):
    """argparse type of ``--sync-check``: the values TPU_CLOSURE_FIX_SYNC_CHECK accepts."""
    import argparse

    from .settings import parse_every

    every, problem = parse_every(raw)
    if problem or not raw.strip():
        raise argparse.ArgumentTypeError("N must be a whole number of optimizer steps (ASCII digits; 0: off)")
    return every


def add_parser(subparsers):
    """Register ``run`` on the CLI's sub-parsers (called by cli.build_parser)."""
    import argparse

    parser = subparsers.add_parser(
        "run", help="run a command with the shim active in it and in every Python child "
                    "(usage: tpu-closure-fix run -- python train.py ...)",
        description="Run COMMAND with the shim active in it and in every Python process it starts: puts "
                    "the package's bootstrap directory (a sitecustomize.py) first on PYTHONPATH and execs "
                    "COMMAND. Not effective under python -S (no sitecustomize), python -E or -I "
                    "(PYTHONPATH ignored; run warns), or commands that clear the environment (env -i, "
                    "sudo); use `import tpu_closure_fix` in the script there.")
    parser.add_argument("--sync-check", metavar="N", type=_sync_check_steps,
                        help="compare the replicas' parameters every N optimizer steps in every process of the "
                             "command, also with TPU_CLOSURE_FIX=0 (sets TPU_CLOSURE_FIX_SYNC_CHECK; 0: off)")
    parser.add_argument("--sync-check-on-divergence", choices=("warn", "raise"),
                        help="what the check does when the replicas differ (default warn)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command and its arguments")
    parser.set_defaults(func=_cmd_run)
    return parser

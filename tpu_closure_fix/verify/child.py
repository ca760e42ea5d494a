"""Run Python child processes with a hard timeout and read the JSON result each one leaves.

Every verification step (the event-order self-test, the XLA graph check), the demo's replicas and
the test suite's subprocess scenarios start children the same way, through :func:`run_children`:

* each child gets its own session (process group), so a child that starts helpers of its own (the
  replica pool of torch_xla's ``run_multiprocess``) is ended as a whole;
* all children share one deadline; at the deadline every group still running is killed
  (SIGKILL), and the run reports "timed out" instead of hanging (an XLA collective executed on
  the CPU waits forever on torch_xla 2.1);
* stdout and stderr are drained by threads while the children run, so children running at the
  same time never block on a full pipe; ``on_line`` sees stdout lines as they arrive;
* the result is JSON: either the last stdout line that starts with ``marker``, or the file the
  child was told to write (``result_files``); with ``marker=None`` and no file, none is expected.

When a child has exited, whatever is left in its process group is killed before the child is
reaped: the exited leader keeps the group id reserved until then, so the signal can only reach
processes this child started.
"""
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import namedtuple

#: Default prefix of the result line a child prints: ``<marker><json>``.
RESULT_MARK = "TPU_CLOSURE_FIX_RESULT "

_POLL = 0.05
_TAIL = 4000


class ChildRun(namedtuple("ChildRun", "argv returncode payload stdout stderr seconds timed_out error")):
    """What one child did.  ``payload``: the parsed JSON result, or None.  ``error``: None, or one
    line saying what went wrong (timed out, exited with a code, printed no result, bad JSON)."""

    __slots__ = ()

    @property
    def ok(self):
        return self.error is None

    def stderr_tail(self, chars=_TAIL):
        return (self.stderr or "")[-chars:]

    def last_error_line(self):
        """The last line of stderr that looks like an exception (``Name: message``), else ''."""
        for line in reversed((self.stderr or "").splitlines()):
            text = line.strip()
            head = text.split(":", 1)[0]
            if ":" in text and head and head.replace(".", "").replace("_", "").isalnum() and \
                    (head.endswith(("Error", "Exception", "Interrupt")) or head == "Exception"):
                return text
        return ""


#: ``-c`` code run before anything is imported from ``sys.path``: drop the entry ``-c`` puts first (``''``:
#: the working directory, searched at every import).  ``sys`` is built in; the imports that follow come
#: from the remaining, absolute, entries.
_SAFE_PATH_PREFIX = "import sys; sys.path[:] = [entry for entry in sys.path if entry != '']; "

#: Runs the module the way ``python -m`` does (``runpy._run_module_as_main`` is what ``-m`` itself calls:
#: ``__main__``, ``sys.argv[0]``, the ``__spec__`` that spawn start methods read).
_RUN_MODULE = _SAFE_PATH_PREFIX + "import runpy; runpy._run_module_as_main(sys.argv.pop(1))"


def python_command(module, *args, python=None):
    """The command that runs ``python -m module args`` without searching the working directory.

    ``python -m`` and ``python -c`` put the working directory first on ``sys.path``: run from a shared
    directory (``cd /tmp``), a planted ``torch.py`` or ``tpu_closure_fix.py`` there would run in the
    child.  ``-I`` would avoid that but also drops ``PYTHONPATH`` and the user site-packages, where the
    frameworks the child must test can be installed (a ``--target`` folder, ``pip --user``); ``-P``
    exists only from Python 3.11 and ``python`` may be another interpreter of unknown version.  So
    every child starts as ``python -c <bootstrap> module args``, whose first statement removes the
    ``''`` entry before anything else is imported (Python 3.8+; start-up files such as
    ``sitecustomize`` are imported before that entry exists).  Pair it with :func:`safe_environment`,
    which drops the relative ``PYTHONPATH`` entries the interpreter would resolve against the working
    directory.  This interpreter by default.
    """
    return [python or sys.executable, "-c", _RUN_MODULE, module] + [str(a) for a in args]


def python_code(code, python=None):
    """``[python, "-c", code]`` without the working directory on ``sys.path`` (see :func:`python_command`)."""
    return [python or sys.executable, "-c", _SAFE_PATH_PREFIX + code]


def interpreter_path(text, env=None):
    """The absolute path of the interpreter ``text`` names, found as a shell finds a command, or None when that is
    not an executable file.

    A name without a slash (``python3``) is looked up on ``PATH`` (of ``env``, default ``os.environ``), in its
    absolute entries only: an empty, ``.`` or relative entry would name the working directory, where a planted
    ``./python3`` must never run. A path with a slash is that file. Symlinks are kept (a venv's ``python`` is
    one: resolved, it would name the base interpreter without the venv)."""
    if os.sep not in text and not (os.altsep and os.altsep in text):
        entries = (os.environ if env is None else env).get("PATH", "").split(os.pathsep)
        found = shutil.which(text, path=os.pathsep.join(entry for entry in entries if os.path.isabs(entry)))
        return os.path.abspath(found) if found else None
    path = os.path.abspath(text)
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def safe_environment(env=None):
    """A copy of ``env`` (default ``os.environ``) for a child interpreter: ``PYTHONPATH`` keeps only its
    absolute entries, and ``PYTHONSAFEPATH=1``.

    An empty or relative ``PYTHONPATH`` entry names a directory relative to the working directory (the
    interpreter turns it into an absolute path at start-up, so the child cannot tell it apart later).
    ``PYTHONSAFEPATH`` (Python 3.11+; ignored before) keeps the working directory off the path of any
    Python the child starts in turn.
    """
    child_env = dict(os.environ if env is None else env)
    entries = [entry for entry in child_env.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(entry)]
    if entries:
        child_env["PYTHONPATH"] = os.pathsep.join(entries)
    else:
        child_env.pop("PYTHONPATH", None)
    child_env["PYTHONSAFEPATH"] = "1"
    return child_env


def relative_pythonpath(env=None):
    """The named ``PYTHONPATH`` entries of ``env`` (default ``os.environ``) that are relative to the working
    directory: :func:`safe_environment` leaves them out of every child, where the interpreter that trains
    (started in some working directory) would follow them."""
    value = (os.environ if env is None else env).get("PYTHONPATH", "")
    return [entry for entry in value.split(os.pathsep) if entry and not os.path.isabs(entry)]


def run_child(argv, timeout, env=None, cwd=None, marker=RESULT_MARK, result_file=None, on_line=None):
    """Run one child; see :func:`run_children`."""
    return run_children([argv], timeout, env=env, cwd=cwd, marker=marker,
                        result_files=None if result_file is None else [result_file],
                        on_line=None if on_line is None else (lambda index, line: on_line(line)))[0]


def run_children(commands, timeout, env=None, cwd=None, marker=RESULT_MARK, result_files=None, on_line=None):
    """Start every command at once, wait for all (one shared deadline), return a ChildRun each.

    ``env``: the environment of every child (a dict), or a list with one per child.
    ``result_files``: per child, a path to read the JSON result from instead of stdout (or None).
    ``on_line(index, line)``: called from a reader thread for every stdout line of child ``index``.
    """
    envs = env if isinstance(env, list) else [env] * len(commands)
    files = result_files or [None] * len(commands)
    if not (len(envs) == len(files) == len(commands)):
        raise ValueError("commands, env and result_files must have the same length")
    deadline = time.monotonic() + timeout
    started = []
    try:
        for index, (argv, child_env) in enumerate(zip(commands, envs)):
            started.append(_start(list(argv), child_env, cwd, index, on_line))
        runs = []
        for (argv, proc, readers, start), result_file in zip(started, files):
            if isinstance(proc, OSError):  # the interpreter could not be started at all
                runs.append(ChildRun(argv, None, None, "", "", 0.0, False, "could not start %s: %s: %s"
                                     % (argv[0], type(proc).__name__, proc)))
                continue
            timed_out = not _wait_then_end_group(proc, deadline)
            for reader in readers:
                reader.join(timeout=30)
            stdout, stderr = "".join(readers[0].chunks), "".join(readers[1].chunks)
            runs.append(_describe(argv, proc.returncode, stdout, stderr, time.monotonic() - start, timed_out,
                                  timeout, marker, result_file))
        return runs
    except BaseException:
        # Ctrl-C (KeyboardInterrupt), SIGTERM turned into SystemExit, any error: the children run in sessions
        # of their own, so no terminal signal reaches them: end every group started, then go on unwinding
        for _, proc, _, _ in started:
            if not isinstance(proc, OSError):
                _kill_group(proc)
                proc.wait()
        raise


class _Reader(threading.Thread):
    def __init__(self, stream, index, on_line):
        super().__init__(daemon=True)
        self.stream, self.index, self.on_line, self.chunks = stream, index, on_line, []

    def run(self):
        try:
            for line in self.stream:
                self.chunks.append(line)
                if self.on_line is not None:
                    try:
                        self.on_line(self.index, line)
                    except Exception:  # a progress callback must never lose the child's output
                        self.on_line = None
        finally:
            self.stream.close()


def _start(argv, env, cwd, index, on_line):
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, universal_newlines=True, start_new_session=True)
    except OSError as exc:  # not executable, a missing shebang interpreter, another architecture
        return argv, exc, [], start
    readers = [_Reader(proc.stdout, index, on_line), _Reader(proc.stderr, index, None)]
    for reader in readers:
        reader.start()
    return argv, proc, readers, start


def _wait_then_end_group(proc, deadline):
    """Wait for ``proc`` until ``deadline``; kill its process group; reap it.  True if it exited."""
    exited = _wait_unreaped(proc, deadline)
    _kill_group(proc)
    proc.wait()
    return exited


def _wait_unreaped(proc, deadline):
    waitid = getattr(os, "waitid", None)
    while time.monotonic() < deadline:
        if waitid is not None:
            # WNOWAIT: the exited child stays a zombie, so its group id cannot be reused before the kill
            try:
                if waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    return True
            except ChildProcessError:
                return True
        elif proc.poll() is not None:
            return True
        time.sleep(_POLL)
    return False


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        if proc.returncode is None:
            try:
                proc.kill()
            except OSError:
                pass


def _describe(argv, returncode, stdout, stderr, seconds, timed_out, timeout, marker, result_file):
    payload, error = None, None
    if timed_out:
        error = "timed out after %.0f s (process group killed)" % timeout
    else:
        try:
            payload = _read_result(stdout, marker, result_file)
        except (OSError, ValueError) as exc:
            error = "could not read the child's result: %s: %s" % (type(exc).__name__, exc)
        if error is None and returncode != 0:
            error = "exited with code %s" % returncode
        if error is None and payload is None and (marker is not None or result_file is not None):
            error = "printed no result"
        if error is not None and returncode != 0:
            exc_line = ChildRun(argv, returncode, None, stdout, stderr, 0, False, None).last_error_line()
            if exc_line:
                error += ": " + exc_line
    return ChildRun(argv, returncode, payload, stdout, stderr, round(seconds, 1), timed_out, error)


def _read_result(stdout, marker, result_file):
    if result_file is not None:
        if not os.path.exists(result_file):
            return None
        with open(result_file) as handle:
            return json.load(handle)
    if marker is None:
        return None
    lines = [line for line in stdout.splitlines() if line.startswith(marker)]
    return json.loads(lines[-1][len(marker):]) if lines else None


def emit(payload, marker=RESULT_MARK, stream=None):
    """In a child: print the result line the parent reads (flushed)."""
    stream = stream or sys.stdout
    stream.write(marker + json.dumps(payload, default=str) + "\n")
    stream.flush()


@contextlib.contextmanager
def only_this_package_on_path(env):
    """Yield ``(env, folder)``: a copy of ``env`` whose PYTHONPATH starts with a private folder holding just this
    ``tpu_closure_fix`` (a symlink, or a copy where symlinks fail).

    A child run by another interpreter (another venv) must import *this* package and nothing else
    from our environment; the folder is made by ``mkdtemp`` (mode 0700) and removed afterwards.
    """
    folder = tempfile.mkdtemp(prefix="tpu-closure-fix-child-")
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        try:
            os.symlink(package, os.path.join(folder, "tpu_closure_fix"))
        except OSError:
            shutil.copytree(package, os.path.join(folder, "tpu_closure_fix"),
                            ignore=shutil.ignore_patterns("__pycache__"))
        child_env = dict(env)
        child_env["PYTHONPATH"] = os.pathsep.join(
            [folder] + [p for p in child_env.get("PYTHONPATH", "").split(os.pathsep) if p])
        yield child_env, folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)

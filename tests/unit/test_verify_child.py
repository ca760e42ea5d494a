"""The one helper that runs Python children with a hard timeout and reads their JSON result."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tpu_closure_fix.verify.child import RESULT_MARK, emit, only_this_package_on_path, python_code, python_command, \
    run_child, run_children, safe_environment

PY = sys.executable


def code(text):
    return [PY, "-c", textwrap.dedent(text)]


def test_reads_the_last_marked_line():
    run = run_child(code("""
        print("noise")
        print(%r + '{"n": 1}')
        print(%r + '{"n": 2}')
    """ % (RESULT_MARK, RESULT_MARK)), 60)
    assert run.ok and run.payload == {"n": 2} and run.returncode == 0


def test_custom_marker_and_result_file(tmp_path):
    out = tmp_path / "r.json"
    run = run_child(code("print('PROBE {\"a\": 1}')"), 60, marker="PROBE ")
    assert run.payload == {"a": 1}
    run = run_child(code("import json; json.dump({'b': 2}, open(%r, 'w'))" % str(out)), 60, result_file=str(out))
    assert run.ok and run.payload == {"b": 2}


def test_no_result_and_bad_exit_are_errors_with_the_exception_line():
    run = run_child(code("print('nothing marked')"), 60)
    assert not run.ok and run.error == "printed no result"
    run = run_child(code("raise KeyError('boom')"), 60)
    assert not run.ok and run.returncode == 1
    assert run.error == "exited with code 1: KeyError: 'boom'"
    run = run_child(code("print(%r + '{not json')" % RESULT_MARK), 60)
    assert run.error.startswith("could not read the child's result: JSONDecodeError")


def test_no_result_expected_when_marker_is_none():
    run = run_child(code("print('plain output')"), 60, marker=None)
    assert run.ok and run.payload is None and run.stdout == "plain output\n"


def test_timeout_kills_the_whole_process_group(tmp_path):
    """A child that hangs, and a grandchild it started, are both gone after the timeout."""
    pid_file = tmp_path / "grandchild.pid"
    run = run_child(code("""
        import subprocess, sys, time
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open(%r, "w").write(str(p.pid))
        time.sleep(600)
    """ % str(pid_file)), 3)
    assert run.timed_out and run.error == "timed out after 3 s (process group killed)"
    assert run.seconds < 60
    grandchild = int(pid_file.read_text())
    assert _ends(grandchild)


def test_a_straggler_left_by_a_finished_child_is_ended(tmp_path):
    pid_file = tmp_path / "straggler.pid"
    run = run_child(code("""
        import subprocess, sys
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        open(%r, "w").write(str(p.pid))
        print(%r + "{}")
    """ % (str(pid_file), RESULT_MARK)), 60)
    assert run.ok and not run.timed_out
    assert _ends(int(pid_file.read_text()))


def _ends(pid, patience=30.0):
    """True once ``pid`` is gone or a zombie (SIGKILL is delivered asynchronously)."""
    import time

    deadline = time.monotonic() + patience
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_children_run_at_once_and_stream_lines():
    # each child waits for the other's file: they only finish if both run at the same time
    seen = []
    commands = [code("""
        import os, sys, time
        open("ready-%d", "w").close()
        for _ in range(600):
            if os.path.exists("ready-%d"):
                break
            time.sleep(0.05)
        print("step 1/1", flush=True)
        print(%r + '{"rank": %d}')
    """ % (rank, 1 - rank, RESULT_MARK, rank)) for rank in (0, 1)]
    cwd = os.path.dirname(os.path.abspath(__file__))
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        runs = run_children(commands, 60, cwd=folder, on_line=lambda i, line: seen.append((i, line.strip())))
    assert [r.payload for r in runs] == [{"rank": 0}, {"rank": 1}], [r.error for r in runs]
    assert (0, "step 1/1") in seen and (1, "step 1/1") in seen
    assert cwd  # the test's own folder is untouched


def test_emit_and_python_command(capsys):
    emit({"x": [1, 2]})
    assert capsys.readouterr().out == RESULT_MARK + json.dumps({"x": [1, 2]}) + "\n"
    assert python_command("m", "--a", 3)[0] == sys.executable and python_command("m", python="/x/py")[0] == "/x/py"


PLANTED = "open(%r, 'a').write(__name__ + '\\n')\n"


@pytest.fixture
def planted_workdir(tmp_path):
    """A working directory holding modules that shadow a stdlib module and the module to run; each one,
    if imported, appends its name to ``ran.txt``.  The real module is in ``lib/`` (absolute PYTHONPATH)."""
    work, lib, ran = tmp_path / "work", tmp_path / "lib", tmp_path / "ran.txt"
    work.mkdir()
    lib.mkdir()
    for name in ("json", "runpy", "probemod"):
        (work / (name + ".py")).write_text(PLANTED % str(ran))
    (lib / "probemod.py").write_text("import json, sys\nprint(json.dumps({'name': __name__, 'argv': sys.argv[1:], "
                                     "'spec': __spec__.name, 'file': __file__ == sys.argv[0]}))\n")
    return work, str(lib), ran


def test_python_command_runs_the_module_like_dash_m_never_from_the_working_directory(planted_workdir):
    work, lib, ran = planted_workdir
    proc = subprocess.run(python_command("probemod", "--a", 3), cwd=str(work), capture_output=True, text=True,
                          env=safe_environment(dict(os.environ, PYTHONPATH=lib)), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"name": "__main__", "argv": ["--a", "3"], "spec": "probemod", "file": True}
    assert not ran.exists()


def test_plain_dash_m_runs_the_planted_modules_twin(planted_workdir):
    work, lib, ran = planted_workdir
    subprocess.run([sys.executable, "-m", "probemod"], cwd=str(work), capture_output=True, text=True,
                   env=dict(os.environ, PYTHONPATH=lib), timeout=60)
    # the working directory's probemod ran, not lib's (Python < 3.9 even imports runpy from there first)
    assert ran.read_text().split() in (["__main__"], ["runpy"])


def test_python_code_never_imports_from_the_working_directory(planted_workdir):
    work, lib, ran = planted_workdir
    proc = subprocess.run(python_code("import json; print(json.dumps(1))"), cwd=str(work), capture_output=True,
                          text=True, env=safe_environment(), timeout=60)
    assert (proc.returncode, proc.stdout, ran.exists()) == (0, "1\n", False), proc.stderr
    subprocess.run([sys.executable, "-c", "import json"], cwd=str(work), timeout=60)  # the twin
    assert ran.read_text().split() == ["json"]


@pytest.mark.parametrize("pythonpath, kept", [
    ("/abs/a:rel/b::/abs/c:.", "/abs/a:/abs/c"), ("lon/x", None), ("", None), (None, None)])
def test_safe_environment_keeps_only_absolute_pythonpath_entries(pythonpath, kept):
    env = {"HOME": "/h"} if pythonpath is None else {"HOME": "/h", "PYTHONPATH": pythonpath}
    out = safe_environment(env)
    assert out.get("PYTHONPATH") == kept and out["PYTHONSAFEPATH"] == "1" and out["HOME"] == "/h"
    assert env.get("PYTHONPATH") == pythonpath  # a copy


def test_only_this_package_on_path():
    with only_this_package_on_path({"PYTHONPATH": "/elsewhere"}) as (env, folder):
        first, rest = env["PYTHONPATH"].split(os.pathsep, 1)
        assert first == folder and rest == "/elsewhere"
        assert sorted(os.listdir(folder)) == ["tpu_closure_fix"]
        assert oct(os.stat(folder).st_mode & 0o777) == "0o700"
        run = run_child([PY, "-c", "import tpu_closure_fix.verify.child as c, json; "
                                   "print(c.RESULT_MARK + json.dumps(c.__file__))"],
                        60, env=dict(env, TPU_CLOSURE_FIX="0"), cwd=folder)
        assert run.payload.startswith(folder), run.error
    assert not os.path.exists(folder)

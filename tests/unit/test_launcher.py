"""``tpu-closure-fix run``: what another local user can do to it, PYTHONPATH, nesting, defeating flags.

Every launch goes through the real command (``tpu-closure-fix run -- ...`` from this checkout) and
starts a *bare* interpreter (a venv without the shim's .pth, nothing installed), so "armed" means
the launcher armed it: the start-up module's import watcher is on ``sys.meta_path``.

The second local user is uid/gid 65534 (``nobody``) through ``setpriv``: those tests need root and
setpriv and are skipped with that reason elsewhere. The attacks are not tied to one design: a
legitimate run first shows which PYTHONPATH entries ``run`` adds and which names it creates in the
shared temporary directory; the attacker then goes for exactly those places.
"""
import compileall
import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from support.local_users import IS_ROOT, NOBODY, as_nobody, second_user, shared_directory

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: The command's report: its PYTHONPATH, whether the launcher armed it, how often the user's own
#: sitecustomize ran in it, and whether a module of the working directory imports.
PROBE = """
import builtins, json, os, sys
try:
    import modhere
    cwd_module = True
except ImportError:
    cwd_module = False
print(json.dumps({
    "pythonpath": os.environ.get("PYTHONPATH"),
    "armed": any(f is sys.modules.get("_tpu_closure_fix_startup") for f in sys.meta_path),
    "own_sitecustomize_runs": getattr(builtins, "OWN_SITECUSTOMIZE_RUNS", 0),
    "cwd_module": cwd_module,
}))
"""

OWN_SITECUSTOMIZE = ("import builtins\n"
                     "builtins.OWN_SITECUSTOMIZE_RUNS = getattr(builtins, 'OWN_SITECUSTOMIZE_RUNS', 0) + 1\n")

#: What a malicious sitecustomize does: leave proof that it ran (as the victim).
EVIL_SITECUSTOMIZE = "open(%r, 'w').write('pwned')\n"


def launcher(root=REPO):
    """The ``tpu-closure-fix`` command of the installation at ``root``, whatever PYTHONPATH is."""
    return [sys.executable, "-c", "import sys; sys.path.insert(0, %r); from tpu_closure_fix.cli import main; "
                                  "sys.exit(main())" % root]


def environment(pythonpath=None, tmpdir=None, extra=None):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TPU_CLOSURE_FIX", "TPU_CLOSURE_FIX_BOOTSTRAP", "TPU_CLOSURE_FIX_BOOTSTRAP_ROOT")}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    if tmpdir is not None:
        env["TMPDIR"] = tmpdir
    env.update(extra or {})
    return env


def run(command, pythonpath=None, tmpdir=None, cwd=None, extra=None, root=REPO):
    return subprocess.run(launcher(root) + ["run", "--"] + command, env=environment(pythonpath, tmpdir, extra),
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def report(proc):
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A venv's interpreter with nothing installed: no .pth arms anything in it."""
    root = tmp_path_factory.mktemp("bare")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    python = str(root / "venv" / "bin" / "python")
    assert report(subprocess.run([python, "-c", PROBE], capture_output=True, text=True,
                                 env=environment()))["armed"] is False
    return python


@pytest.fixture
def shared_tmp():
    """A shared temporary directory like /tmp (mode 1777): what TMPDIR is for both users."""
    path = shared_directory()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def legitimate_run(bare_python, shared):
    """What `run` adds to PYTHONPATH and creates in the shared temporary directory; then the latter is
    removed, so the attacker can get there first, as they could on a fresh machine."""
    before = set(os.listdir(shared))
    proc = run([bare_python, "-c", PROBE], pythonpath=REPO, tmpdir=shared)
    out = report(proc)
    assert out["armed"] is True
    added = out["pythonpath"].split(os.pathsep)[:-1]  # the original PYTHONPATH (REPO) is the last entry
    created = sorted(set(os.listdir(shared)) - before)
    for name in created:
        path = os.path.join(shared, name)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    return added, [os.path.join(shared, name) for name in created]


# ----------------------------------------------------------------------------------- another local user
@second_user
def test_run_creates_nothing_another_user_can_write(bare_python, shared_tmp):
    added, created = legitimate_run(bare_python, shared_tmp)
    assert created == [], "run left files in the shared temporary directory: %s" % created
    assert added, "run added nothing to PYTHONPATH"
    for entry in added:
        for path in (entry, os.path.join(entry, "sitecustomize.py")):
            if os.path.exists(path):
                probe = as_nobody("test -w %s" % shlex.quote(path))
                assert probe.returncode != 0, "uid %d can write %s" % (NOBODY, path)


def plant_sitecustomize(places, marker):
    """As the second user: create each place as a mode-777 directory holding a sitecustomize.py of theirs
    (or replace the sitecustomize.py in it). Returns the places where that worked."""
    planted = []
    for place in places:
        script = ("umask 000; mkdir -p {d} 2>/dev/null; printf %s {code} > {d}/sitecustomize.py"
                  .format(d=shlex.quote(place), code=shlex.quote(EVIL_SITECUSTOMIZE % marker)))
        if as_nobody(script).returncode == 0:
            planted.append(place)
    return planted


@second_user
def test_second_users_sitecustomize_is_never_executed(bare_python, shared_tmp):
    marker = os.path.join(shared_tmp, "pwned")
    # The twin: the attacker's file is live ammunition, it runs when its directory is on PYTHONPATH.
    (evil,) = plant_sitecustomize([os.path.join(shared_tmp, "evil")], marker)
    subprocess.run([bare_python, "-c", "pass"], env=environment(pythonpath=evil), check=True, timeout=60)
    assert os.path.exists(marker)
    os.remove(marker)

    added, created = legitimate_run(bare_python, shared_tmp)
    plant_sitecustomize(added + created, marker)
    out = report(run([bare_python, "-c", PROBE], pythonpath=REPO, tmpdir=shared_tmp))
    assert not os.path.exists(marker), "run executed a sitecustomize.py of uid %d" % NOBODY
    assert out["armed"] is True


@second_user
def test_planted_symlink_never_redirects_a_write(bare_python, shared_tmp, tmp_path):
    victim = tmp_path / "victim.txt"  # a root file the attacker cannot write
    victim.write_text("original\n")
    added, created = legitimate_run(bare_python, shared_tmp)
    # Start the launcher's process first, so its PID (kept across exec) is known to the attacker.
    command = launcher() + ["run", "--", bare_python, "-c", PROBE]
    proc = subprocess.Popen(["/bin/sh", "-c", 'read go; exec "$@"', "sh"] + command, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=environment(pythonpath=REPO, tmpdir=shared_tmp))
    links = []
    for place in added + created:
        for name in ("sitecustomize.py.%d.tmp" % proc.pid, "sitecustomize.py.tmp"):
            link = os.path.join(place, name)
            script = "umask 000; mkdir -p {d} 2>/dev/null; ln -s {v} {l}".format(
                d=shlex.quote(place), v=shlex.quote(str(victim)), l=shlex.quote(link))
            if as_nobody(script).returncode == 0:
                links.append(link)
    for link in links:  # they are real: they resolve to the victim
        assert os.path.realpath(link) == str(victim)
    out, err = proc.communicate("go\n", timeout=120)
    assert proc.returncode == 0, err
    assert victim.read_text() == "original\n", "run wrote through a symlink planted by uid %d" % NOBODY
    assert json.loads(out.strip().splitlines()[-1])["armed"] is True


@second_user
def test_file_planted_at_the_bootstrap_path_is_no_denial_of_service(bare_python, shared_tmp):
    added, created = legitimate_run(bare_python, shared_tmp)
    for place in added + created:
        as_nobody("touch %s" % shlex.quote(place))
    proc = run([bare_python, "-c", PROBE], pythonpath=REPO, tmpdir=shared_tmp)
    assert "Traceback" not in proc.stderr
    assert report(proc)["armed"] is True


# ----------------------------------------------------------------------------------- the bootstrap check
def package_copy(tmp_path, name="install"):
    """A second installation of this checkout (package and start-up module), owned by root, mode 755."""
    root = tmp_path / name
    shutil.copytree(os.path.join(REPO, "tpu_closure_fix"), str(root / "tpu_closure_fix"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(os.path.join(REPO, "startup"), str(root / "startup"))
    for dirpath, dirnames, filenames in os.walk(str(root)):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)
    return str(root)


def bootstrap_of(root):
    return os.path.join(root, "tpu_closure_fix", "_bootstrap")


def test_untampered_copy_is_accepted_twin(bare_python, tmp_path):
    root = package_copy(tmp_path)
    out = report(run([bare_python, "-c", PROBE], root=root))
    assert out["armed"] is True and out["pythonpath"] == bootstrap_of(root)


@pytest.mark.parametrize("tamper,reason", [
    (lambda b: os.chmod(b, 0o777), "every user can write it"),
    (lambda b: os.chmod(os.path.join(b, "sitecustomize.py"), 0o646), "every user can write it"),
    (lambda b: os.chmod(b, 0o775), "group"),
])
def test_bootstrap_writable_by_others_is_refused(bare_python, tmp_path, tamper, reason):
    root = package_copy(tmp_path)
    tamper(bootstrap_of(root))
    proc = run([bare_python, "-c", PROBE], root=root)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "refusing to use" in proc.stderr and reason in proc.stderr and "Traceback" not in proc.stderr


def test_group_writable_like_the_package_itself_is_accepted(bare_python, tmp_path):
    root = package_copy(tmp_path)  # a group-shared install: the code that runs is group-writable already
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, "tpu_closure_fix")):
        os.chmod(dirpath, 0o775)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o664)
    assert report(run([bare_python, "-c", PROBE], root=root))["armed"] is True


def test_symlinked_bootstrap_file_is_refused(bare_python, tmp_path):
    root = package_copy(tmp_path)
    target = os.path.join(bootstrap_of(root), "sitecustomize.py")
    elsewhere = str(tmp_path / "elsewhere.py")
    shutil.move(target, elsewhere)
    os.symlink(elsewhere, target)
    proc = run([bare_python, "-c", PROBE], root=root)
    assert proc.returncode == 2 and "symbolic link" in proc.stderr


@pytest.mark.skipif(not IS_ROOT, reason="changing a file's owner needs root")
def test_bootstrap_owned_by_another_user_is_refused(bare_python, tmp_path):
    root = package_copy(tmp_path)
    os.chown(os.path.join(bootstrap_of(root), "sitecustomize.py"), NOBODY, NOBODY)
    proc = run([bare_python, "-c", PROBE], root=root)
    assert proc.returncode == 2 and "owned by uid %d" % NOBODY in proc.stderr


@pytest.mark.skipif(not IS_ROOT, reason="changing a file's owner needs root")
def test_installation_owned_by_its_user_is_accepted_twin(bare_python, tmp_path):
    root = package_copy(tmp_path)  # e.g. root runs a user's venv: that user's launcher.py already runs
    for dirpath, dirnames, filenames in os.walk(root):
        os.chown(dirpath, NOBODY, NOBODY)
        for name in filenames:
            os.chown(os.path.join(dirpath, name), NOBODY, NOBODY)
    assert report(run([bare_python, "-c", PROBE], root=root))["armed"] is True


def test_byte_code_cache_writable_by_others_is_refused(bare_python, tmp_path):
    root = package_copy(tmp_path)
    compileall.compile_dir(bootstrap_of(root), quiet=1)  # as pip does at install
    assert report(run([bare_python, "-c", PROBE], root=root))["armed"] is True  # the twin
    cache = os.path.join(bootstrap_of(root), "__pycache__")
    assert any(name.startswith("sitecustomize.") for name in os.listdir(cache))
    os.chmod(cache, 0o777)  # what a umask of 000 gives: anyone could then plant a sitecustomize.*.pyc
    proc = run([bare_python, "-c", PROBE], root=root)
    assert proc.returncode == 2 and "__pycache__: every user can write it" in proc.stderr


# ----------------------------------------------------------------------------------- PYTHONPATH kept exactly
@pytest.fixture
def workdir(tmp_path):
    """A working directory with a module, and a script in a subdirectory that imports it."""
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "modhere.py").write_text("VALUE = 1\n")
    (work / "sub" / "script.py").write_text(PROBE)
    return work


def direct(python, args, pythonpath, cwd=None):
    """The probe's report without run."""
    return report(subprocess.run([python] + args, env=environment(pythonpath), cwd=cwd and str(cwd),
                                 capture_output=True, text=True, timeout=60))


@pytest.mark.parametrize("pythonpath", [REPO + os.pathsep, os.pathsep + REPO, REPO + os.pathsep * 2 + REPO])
def test_empty_pythonpath_entry_is_kept(bare_python, workdir, pythonpath):
    script = str(workdir / "sub" / "script.py")
    # The twins: without run, the empty entry (the working directory) is what makes the import work.
    assert direct(bare_python, [script], pythonpath, workdir)["cwd_module"] is True
    assert direct(bare_python, [script], REPO, workdir)["cwd_module"] is False
    out = report(run([bare_python, script], pythonpath=pythonpath, cwd=str(workdir)))
    assert out["cwd_module"] is True and out["armed"] is True
    assert out["pythonpath"].endswith(os.pathsep + pythonpath)  # the user's value, untouched, at the end


@pytest.mark.parametrize("pythonpath", [None, ""])
def test_unset_or_empty_pythonpath_gains_no_empty_entry(bare_python, workdir, pythonpath):
    script = str(workdir / "sub" / "script.py")
    assert direct(bare_python, [script], pythonpath, workdir)["cwd_module"] is False  # the twin
    out = report(run([bare_python, script], pythonpath=pythonpath, cwd=str(workdir)))
    assert out["cwd_module"] is False and out["armed"] is True
    assert "" not in out["pythonpath"].split(os.pathsep)


# ----------------------------------------------------------------------------------- run inside run
@pytest.fixture
def own_site(tmp_path):
    own = tmp_path / "own_site"
    own.mkdir()
    (own / "sitecustomize.py").write_text(OWN_SITECUSTOMIZE)
    return str(own)


def test_own_sitecustomize_runs_once_under_run_twin(bare_python, own_site):
    assert direct(bare_python, ["-c", PROBE], own_site)["own_sitecustomize_runs"] == 1  # without run
    out = report(run([bare_python, "-c", PROBE], pythonpath=own_site))
    assert out["own_sitecustomize_runs"] == 1 and out["armed"] is True


def test_run_inside_run_adds_nothing(bare_python, own_site):
    outer = report(run([bare_python, "-c", PROBE], pythonpath=own_site))
    proc = run(launcher() + ["run", "--", bare_python, "-c", PROBE], pythonpath=own_site)
    inner = report(proc)
    assert inner["pythonpath"] == outer["pythonpath"]
    assert inner["own_sitecustomize_runs"] == 1 and inner["armed"] is True
    assert "Error in sitecustomize" not in proc.stderr


def test_run_inside_run_of_another_installation_never_loops(bare_python, own_site, tmp_path):
    other = package_copy(tmp_path)
    proc = run(launcher(other) + ["run", "--", bare_python, "-c", PROBE], pythonpath=own_site)
    out = report(proc)
    assert "RecursionError" not in proc.stderr and "Error in sitecustomize" not in proc.stderr
    assert out["own_sitecustomize_runs"] == 1 and out["armed"] is True
    entries = out["pythonpath"].split(os.pathsep)
    assert entries[-1] == own_site and bootstrap_of(other) in entries


# ----------------------------------------------------------------------------------- -S / -E / -I
@pytest.mark.parametrize("flags,letters", [
    (["-E"], "E"), (["-I"], "I"), (["-S"], "S"), (["-u", "-E"], "E"), (["-IE"], "EI"), (["-sE"], "E"),
    (["-W", "error", "-E"], "E"),
])
def test_defeating_flag_is_reported_and_really_defeats(bare_python, flags, letters):
    proc = run([bare_python] + flags + ["-c", PROBE])
    assert report(proc)["armed"] is False  # what the warning says is true: nothing armed this interpreter
    for letter in letters:
        assert "`python -%s`" % letter in proc.stderr and "cannot patch" in proc.stderr, proc.stderr


@pytest.mark.parametrize("flags", [[], ["-u"], ["-X", "dev"], ["-W", "E"], ["-WE"], ["-B", "-O"]])
def test_harmless_flags_arm_without_a_warning_twin(bare_python, flags):
    proc = run([bare_python] + flags + ["-c", PROBE])
    assert report(proc)["armed"] is True
    assert "warning" not in proc.stderr


@pytest.mark.parametrize("command,flags", [
    (["python3", "-IE", "x.py"], {"I", "E"}),
    (["/usr/bin/python3.11", "-c", "-E"], set()),        # after -c comes the code, not options
    (["python", "-Ec", "pass"], {"E"}),
    (["python", "-mE"], set()),                          # -m: the rest is a module name
    (["python", "-X", "E", "-W", "E", "x.py"], set()),   # arguments of -X/-W are not flags
    (["python", "-XE", "-WE", "x.py"], set()),
    (["python", "--check-hash-based-pycs", "always", "-S"], {"S"}),
    (["python", "x.py", "-E"], set()),                   # the script's own arguments
    (["python", "--", "-E"], set()),
    (["pypy3", "-S"], {"S"}),
    (["bash", "-E"], set()),                             # not a Python interpreter
    (["python-config", "-E"], set()),
])
def test_interpreter_flags(command, flags):
    from tpu_closure_fix import launcher as module

    assert module.interpreter_flags(command) == flags


def test_help_and_docstring_name_the_defeating_flags():
    from tpu_closure_fix import launcher as module

    proc = subprocess.run(launcher() + ["run", "--help"], capture_output=True, text=True, timeout=60,
                          env=environment())
    assert proc.returncode == 0
    for text in (" ".join(proc.stdout.split()), " ".join(module.__doc__.split())):
        for flag in ("python -S", "python -E", "-I"):
            assert flag in text, (flag, text)


# ----------------------------------------------------------------------------------- huge values
HUGE = "x" * 120000


def test_huge_switch_value_is_quoted_short_twin():
    from tpu_closure_fix import config, settings

    _, short = settings.parse_switch("maybe")
    assert "TPU_CLOSURE_FIX='maybe'" in short  # a short value is quoted whole
    _, problem = settings.parse_switch(HUGE)
    assert len(problem) < 400
    assert "'%s'" % HUGE[:config.QUOTE_LIMIT] in problem and "120000 characters" in problem


def test_huge_switch_value_warning_at_start_up():
    proc = run([sys.executable, "-c", "import tpu_closure_fix"], pythonpath=REPO, extra={"TPU_CLOSURE_FIX": HUGE})
    assert proc.returncode == 0
    assert len(proc.stderr) < 2000  # the launcher's process and the command's each warn once
    assert "TPUClosureFixWarning" in proc.stderr and "120000 characters" in proc.stderr


# ----------------------------------------------------------------------------------- where the package is
@second_user
def test_an_installation_path_holding_the_separator_is_refused(bare_python, tmp_path, shared_tmp):
    """Under ``.../co:lon``, the bootstrap entry would split into ``.../co`` and ``lon/...``, relative to the
    working directory, where the second user planted a sitecustomize.py: refused before it can run."""
    from support.local_users import plant

    root = package_copy(tmp_path, "co%slon" % os.pathsep)
    marker = os.path.join(shared_tmp, "pwned")
    plant(os.path.join(shared_tmp, "lon", "tpu_closure_fix", "_bootstrap", "sitecustomize.py"),
          EVIL_SITECUSTOMIZE % marker)
    proc = run([bare_python, "-c", PROBE], root=root, cwd=shared_tmp)
    assert not os.path.exists(marker), "run executed a sitecustomize.py of uid %d" % NOBODY
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr.startswith("tpu-closure-fix run: cannot put ") and "holds ':'" in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr


def test_an_installation_path_without_the_separator_is_used_twin(bare_python, tmp_path):
    root = package_copy(tmp_path, "co-lon")
    out = report(run([bare_python, "-c", PROBE], root=root))
    assert out["armed"] is True and out["pythonpath"] == bootstrap_of(root)


def test_a_foreign_interpreter_gets_the_package_not_its_neighbours(bare_python, tmp_path):
    """The fallback for an interpreter that cannot import the start-up module finds tpu-closure-fix (and its
    runtime dependencies) in the installation by name: never another package installed next to it."""
    root = package_copy(tmp_path)
    with open(os.path.join(root, "neighbour.py"), "w") as handle:
        handle.write("VALUE = 1\n")  # what a venv's site-packages also holds: torch, numpy ...
    code = ("import importlib.util, json, sys\ntry:\n    import neighbour\n    found = True\nexcept ImportError:\n"
            "    found = False\nprint(json.dumps({'neighbour': found, 'package': importlib.util.find_spec("
            "'tpu_closure_fix').origin, 'startup': sys.modules['_tpu_closure_fix_startup'].__file__}))\n")
    out = report(run([bare_python, "-c", code], root=root, cwd=str(tmp_path)))
    assert out["neighbour"] is False
    assert out["package"] == os.path.join(root, "tpu_closure_fix", "__init__.py")
    assert out["startup"] == os.path.join(root, "startup", "_tpu_closure_fix_startup.py")
    direct_path = subprocess.run([bare_python, "-c", "import neighbour"], env=environment(pythonpath=root),
                                 capture_output=True, timeout=60, cwd=str(tmp_path))
    assert direct_path.returncode == 0  # the twin: on the path, the neighbour imports


# ----------------------------------------------------------------------------------- exit codes like a shell
def test_a_directory_exits_126_and_a_missing_command_127(tmp_path):
    (tmp_path / "some-dir").mkdir()
    (tmp_path / "not-executable").write_text("echo hi\n")
    for command, code in ((["./some-dir"], 126), (["./not-executable"], 126), (["./missing"], 127),
                          (["tpu-closure-fix-no-such-command"], 127)):
        proc = run(command, cwd=str(tmp_path))
        assert proc.returncode == code and proc.stderr.startswith("tpu-closure-fix run: cannot run "), (command,
                                                                                                        proc.stderr)
        shell = subprocess.run(["/bin/sh", "-c", 'exec "$@"', "sh"] + command, cwd=str(tmp_path),
                               capture_output=True, timeout=60)
        assert shell.returncode == code, command  # what a shell gives


# ----------------------------------------------------------------------------------- flags behind env and #!
def script(tmp_path, shebang):
    path = tmp_path / "train"
    path.write_text("#!%s\n%s" % (shebang, PROBE))
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("how", ["env", "env -S", "#!", "#!env -S"])
def test_a_defeating_flag_behind_env_or_in_a_shebang_is_reported(bare_python, tmp_path, how):
    command = {"env": ["env", bare_python, "-E", "-c", PROBE],
               "env -S": ["env", "-S", bare_python + " -I", "-c", PROBE],
               "#!": [script(tmp_path, bare_python + " -E")],
               "#!env -S": [script(tmp_path, "/usr/bin/env -S %s -E" % bare_python)]}[how]
    proc = run(command)
    assert report(proc)["armed"] is False  # what the warning says is true
    assert "cannot patch" in proc.stderr and ("behind `env`" in proc.stderr or "#! line" in proc.stderr), proc.stderr


@pytest.mark.parametrize("how", ["env", "#!"])
def test_no_flag_behind_env_or_in_a_shebang_arms_without_a_warning_twin(bare_python, tmp_path, how):
    command = ["env", "A=1", bare_python, "-c", PROBE] if how == "env" else [script(tmp_path, bare_python)]
    proc = run(command)
    assert report(proc)["armed"] is True and "warning" not in proc.stderr, proc.stderr


def test_env_clearing_pythonpath_is_reported(bare_python):
    proc = run(["env", "-u", "PYTHONPATH", bare_python, "-c", PROBE])
    assert report(proc)["armed"] is False and "`env -u PYTHONPATH` drops PYTHONPATH" in proc.stderr


def test_huge_command_name_is_quoted_short():
    proc = run(["/nonexistent/" + "y" * 120000])
    assert proc.returncode == 127 and "cannot run" in proc.stderr
    assert len(proc.stderr) < 400

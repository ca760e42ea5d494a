"""Issue #2: every activation mode, each in a fresh subprocess against the real target.

Modes: ``import tpu_closure_fix`` before and after Lightning; the .pth startup
file from a real (non-editable) wheel install into a fresh venv; autowrapt's
entry point (``AUTOWRAPT_BOOTSTRAP=tpu_closure_fix``); ``sitecustomize_example``;
PYTHONSTARTUP; and the values of ``TPU_CLOSURE_FIX``. Each "patched" check has
its twin where the same mode is switched off and the site stays unpatched.

The fresh venv sees torch through a path line appended *after* its own
site-packages (so its own wheel install of tpu-closure-fix and wrapt wins), and
the target's Lightning through PYTHONPATH, as a user's --target install would.
"""
import json
import os
import subprocess
import sys
import sysconfig

import pytest

from conftest import REPO, TESTS

# Runs on the representative targets only, some tests on fewer: see ONLY_ON in conftest.py.


def _site_list():
    sys.path.insert(0, REPO)
    from tpu_closure_fix import sites

    return [(s.module, s.qualname) for s in sites.CALL_SITES if s.fix is not None and s.integration == "lightning"]


@pytest.fixture(scope="session")
def probe_dir(tmp_path_factory):
    """An empty working directory for the probes (nothing in it can shadow a module)."""
    return tmp_path_factory.mktemp("probe")


def _target_path():
    return [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and os.path.abspath(p) != REPO]


def probe_env(env_extra=None, pythonpath_extra=(), drop_env=()):
    """The probe's environment: the tests folder (for ``support``) after ``pythonpath_extra``, then the
    target; the call sites to look at in TCF_SITES."""
    env = {k: v for k, v in os.environ.items() if k not in ("TPU_CLOSURE_FIX",) + tuple(drop_env)}
    env["PYTHONPATH"] = os.pathsep.join(list(pythonpath_extra) + [TESTS] + _target_path())
    env["TCF_SITES"] = json.dumps(_site_list())
    env.update(env_extra or {})
    return env


def run_probe(python, probe_dir, env_extra=None, pythonpath_extra=(), args=(), drop_env=()):
    """``python -m support.activation_probe ARGS``; returns (its PROBE output, the completed process)."""
    env = probe_env(env_extra, pythonpath_extra, drop_env)
    proc = subprocess.run([python, "-m", "support.activation_probe"] + list(args), env=env, capture_output=True,
                          text=True, timeout=300, cwd=str(probe_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("PROBE ")][-1]
    return json.loads(line[len("PROBE "):]), proc


def probe_in(venv, probe_dir, **probe_options):
    """The probe's PROBE output from the interpreter of ``venv`` (a ``(python, site-packages)`` fixture);
    ``probe_options`` as for :func:`run_probe`."""
    python, _ = venv
    result, _ = run_probe(python, probe_dir, **probe_options)
    return result


def assert_patched(result):
    assert result["patched"], "no affected call site found in this target"
    assert set(result["patched"].values()) == {1}, result["patched"]


def assert_unpatched(result):
    assert result["patched"], "no affected call site found in this target"
    assert set(result["patched"].values()) == {0}, result["patched"]


# --------------------------------------------------------------------------- plain import
def test_import_after_lightning(probe_dir):
    result, _ = run_probe(sys.executable, probe_dir, pythonpath_extra=[REPO], args=["import-after"])
    assert_patched(result)


def test_import_before_lightning(probe_dir):
    result, _ = run_probe(sys.executable, probe_dir, pythonpath_extra=[REPO], args=["import-before"])
    assert_patched(result)


def test_import_with_switch_off_twin(probe_dir):
    result, _ = run_probe(sys.executable, probe_dir, env_extra={"TPU_CLOSURE_FIX": "0"}, pythonpath_extra=[REPO],
                          args=["import-before"])
    assert_unpatched(result)


# --------------------------------------------------------------------------- wheel + fresh venv
@pytest.fixture(scope="session")
def wheel(shim_wheel):
    return shim_wheel


def _fresh_venv(root, wheel, extra=()):
    # no pip of its own (ensurepip costs more than the rest of the fixture): this interpreter's pip installs into
    # the venv's interpreter (``--python``), as that venv's own pip would
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=300)
    python = str(root / "bin" / "python")
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel, "wrapt",
                    "packaging"] + list(extra), check=True, timeout=600)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # torch (and the rest of the base venv) *after* the fresh venv's own packages:
    with open(os.path.join(site, "zz_base_venv.pth"), "w") as handle:
        handle.write(sysconfig.get_paths()["purelib"] + "\n")
    return python, site


@pytest.fixture(scope="session")
def pth_venv(tmp_path_factory, wheel):
    return _fresh_venv(tmp_path_factory.mktemp("pth") / "venv", wheel)


@pytest.fixture(scope="session")
def bare_venv(tmp_path_factory, wheel):
    """The wheel and autowrapt installed, then the .pth/.start removed: only the other modes can act."""
    python, site = _fresh_venv(tmp_path_factory.mktemp("bare") / "venv", wheel, extra=["autowrapt"])
    for name in ("tpu_closure_fix.pth", "tpu_closure_fix.start"):
        os.remove(os.path.join(site, name))
    return python, site


@pytest.fixture(scope="session")
def target_install(tmp_path_factory, wheel):
    """``pip install --target DIR`` of the wheel (with wrapt and packaging) for a venv that has no shim of its
    own: the start-up ``.pth`` lands in DIR, which Python never reads start-up files from."""
    root = tmp_path_factory.mktemp("target-install")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=300)
    python = str(root / "venv" / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "zz_base_venv.pth"), "w") as handle:  # torch, after the venv's own packages
        handle.write(sysconfig.get_paths()["purelib"] + "\n")
    folder = str(root / "target")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", folder, wheel, "wrapt", "packaging"],
                   check=True, timeout=600)
    return python, folder


def status_json(python, probe_dir, pythonpath_extra=(), command="status"):
    proc = subprocess.run([python, "-m", "tpu_closure_fix", command, "--json"] +
                          (["--no-graph"] if command == "check" else []),
                          env=probe_env(pythonpath_extra=pythonpath_extra), capture_output=True, text=True,
                          timeout=600, cwd=str(probe_dir))
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture(scope="session")
def target_install_probe(target_install, probe_dir):
    """The probe of a script started at the --target install (no import of the shim): the same child for
    both commands' tests."""
    python, folder = target_install
    result, _ = run_probe(python, probe_dir, pythonpath_extra=[folder])
    return result


@pytest.mark.parametrize("command", ["status", "check"])
def test_a_target_install_is_unprotected_naming_the_reason_and_the_fix(target_install, target_install_probe,
                                                                       probe_dir, command):
    python, folder = target_install
    code, out = status_json(python, probe_dir, pythonpath_extra=[folder], command=command)
    assert (code, out["outcome"], out["exit_code"]) == (1, "unprotected", 1), out["reason"]
    assert out["startup_hook"]["active"] is False
    assert "imported from %s (a --target folder or a PYTHONPATH entry)" % folder in out["startup_hook"]["reason"]
    assert "Fix: install tpu-closure-fix into the interpreter's site-packages" in out["reason"]
    assert out["python"]["executable"] == python and out["shim_path"] == os.path.join(folder, "tpu_closure_fix")
    assert_rows_say_unpatched(out)
    if command == "check":  # no self-test line says "patched" either: they drive a fix that never runs there
        assert out["event_check"]["sites"] == [] and "start-up hook does not run" in out["event_check"]["not_run"]
    # the fact behind the verdict: a script started there (no import of the shim) runs the sites unpatched
    assert_unpatched(target_install_probe)


def assert_rows_say_unpatched(out):
    """The table agrees with an unprotected outcome: no site reads ``patched`` (before, the child patched them with
    the copy of the shim it imported to read the table), and the sites the shim patches read what runs."""
    assert out["outcome"] == "unprotected", out["reason"]
    verdicts = {"%s:%s" % (r["module"], r["method"]): (r["verdict"], r["reason"]) for r in out["sites"]}
    assert not [site for site, (verdict, _) in verdicts.items() if verdict in ("patched", "guarded")], verdicts
    affected = ["%s:%s" % site for site in _site_list() if "%s:%s" % site in verdicts and
                verdicts["%s:%s" % site][0] not in ("not installed", "not in this release", "not imported yet")]
    assert affected, verdicts
    for site in affected:
        assert verdicts[site] == ("unpatched", "start-up hook inactive"), (site, verdicts[site])


def assert_rows_say_patched(out):
    """The twin: the hook runs, the same sites read ``patched``."""
    assert out["outcome"] == "protected", out["reason"]
    verdicts = {"%s:%s" % (r["module"], r["method"]): r["verdict"] for r in out["sites"]}
    assert "patched" in verdicts.values() and "unpatched" not in verdicts.values(), verdicts


def status_of(python, probe_dir, pythonpath, flags=(), args=()):
    """``python FLAGS -m tpu_closure_fix status --json ARGS`` with exactly ``pythonpath`` (then the tests folder
    and the target) as PYTHONPATH."""
    proc = subprocess.run([python] + list(flags) + ["-m", "tpu_closure_fix", "status", "--json"] + list(args),
                          env=probe_env(pythonpath_extra=pythonpath), capture_output=True, text=True, timeout=600,
                          cwd=str(probe_dir))
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout)


def test_python_S_reads_every_site_unpatched_and_the_twin_without_S_patched(pth_venv, probe_dir):
    """``-S``: no start-up file of site-packages is read, so the shim found on PYTHONPATH never runs."""
    python, site = pth_venv
    pythonpath = [site, sysconfig.get_paths()["purelib"]]  # -S reads no .pth: torch and the shim by path
    code, out = status_of(python, probe_dir, pythonpath, flags=["-S"])
    assert code == 1 and out["startup_hook"]["active"] is False and "python -S" in out["startup_hook"]["reason"]
    assert_rows_say_unpatched(out)
    code, out = status_of(python, probe_dir, pythonpath)
    assert code == 0 and out["startup_hook"]["active"] is True
    assert_rows_say_patched(out)


@pytest.fixture(scope="session")
def shimless_venv(tmp_path_factory):
    """A venv that cannot import tpu_closure_fix at all: the base venv's packages (torch) reach it through links
    to each of them but the shim's files."""
    root = tmp_path_factory.mktemp("shimless")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=300)
    python = str(root / "venv" / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps, base = root / "deps", sysconfig.get_paths()["purelib"]
    deps.mkdir()
    for name in os.listdir(base):
        if "tpu_closure_fix" not in name and not name.endswith(".pth"):
            os.symlink(os.path.join(base, name), str(deps / name))
    with open(os.path.join(site, "zz_base_venv.pth"), "w") as handle:
        handle.write(str(deps) + "\n")
    return python


def test_python_at_an_interpreter_without_the_shim_reads_every_site_unpatched(shimless_venv, pth_venv, probe_dir):
    """``--python`` at a venv without the shim (the frameworks on PYTHONPATH): its table is read with a lent copy of
    the shim, which is never activated there. The twin: ``--python`` at a venv with the shim installed."""
    bare = shimless_venv
    code, out = status_of(sys.executable, probe_dir, [], args=["--python", bare])
    assert code == 1 and out["python"]["executable"] == bare
    assert out["startup_hook"] == {"active": False, "reason": "tpu_closure_fix is not installed for %s" % bare}
    assert_rows_say_unpatched(out)
    with_shim, _ = pth_venv
    code, out = status_of(sys.executable, probe_dir, [], args=["--python", with_shim])
    assert code == 0 and out["python"]["executable"] == with_shim
    assert_rows_say_patched(out)


@pytest.mark.parametrize("command", ["status", "check"])
def test_the_twin_in_site_packages_is_protected_with_the_hook_active(pth_venv, probe_dir, command):
    python, _ = pth_venv
    code, out = status_json(python, probe_dir, command=command)
    assert (code, out["outcome"], out["exit_code"]) == (0, "protected", 0), out["reason"]
    assert out["startup_hook"] == {"active": True, "reason": "armed at interpreter start by the start-up module"}
    assert out["schema"] == 1 and out["shim_version"] and out["sites"]


def test_wheel_ships_startup_files(pth_venv):
    _, site = pth_venv
    with open(os.path.join(site, "tpu_closure_fix.pth")) as handle:
        assert handle.read().startswith("import _tpu_closure_fix_startup")
    with open(os.path.join(site, "tpu_closure_fix.start")) as handle:
        assert handle.read().strip() == "_tpu_closure_fix_startup:install"


@pytest.fixture(scope="session")
def pth_default_probe(pth_venv, probe_dir):
    """(PROBE output, process) of the .pth venv with the switch unset, every warning shown: the auto-enable
    test and the unset row of the switch values read the same child."""
    python, _ = pth_venv
    return run_probe(python, probe_dir, args=["--warnings-always"])


def test_pth_auto_enable(pth_default_probe):
    result, _ = pth_default_probe
    assert result["before"] == [], "nothing of the shim may load before Lightning is imported"
    assert_patched(result)


@pytest.fixture(scope="session")
def pth_off_probe(pth_venv, probe_dir):
    """(PROBE output, process) of the .pth venv with the switch off, every warning shown: the auto-enable twin and
    the off row of the switch values read the same child."""
    python, _ = pth_venv
    return run_probe(python, probe_dir, env_extra={"TPU_CLOSURE_FIX": "OFF"}, args=["--warnings-always"])


def test_pth_switch_off_twin(pth_off_probe):
    result, _ = pth_off_probe
    assert_unpatched(result)


def test_pth_idle_interpreter_pays_nothing(pth_venv, probe_dir):
    python, _ = pth_venv
    result, _ = run_probe(python, probe_dir, args=["idle"])
    assert result["loaded"] == []
    silent = subprocess.run([python, "-c", "pass"], capture_output=True, text=True, timeout=60)
    assert silent.stdout == "" and silent.stderr == ""


def test_pth_plus_import_one_layer(pth_venv, probe_dir):
    assert_patched(probe_in(pth_venv, probe_dir, args=["enable-twice"]))


def test_autowrapt_entry_point(bare_venv, probe_dir):
    assert_patched(probe_in(bare_venv, probe_dir, env_extra={"AUTOWRAPT_BOOTSTRAP": "tpu_closure_fix"}))


def test_autowrapt_twins(bare_venv, probe_dir):
    # no .pth, no bootstrap variable: nothing activates
    assert_unpatched(probe_in(bare_venv, probe_dir, drop_env=("AUTOWRAPT_BOOTSTRAP",)))
    assert_unpatched(probe_in(bare_venv, probe_dir, env_extra={"AUTOWRAPT_BOOTSTRAP": "tpu_closure_fix",
                                                               "TPU_CLOSURE_FIX": "0"}))


def test_sitecustomize_example(bare_venv, probe_dir):
    example = os.path.join(REPO, "sitecustomize_example")
    result = probe_in(bare_venv, probe_dir, pythonpath_extra=[example], drop_env=("AUTOWRAPT_BOOTSTRAP",))
    assert result["before"] == []
    assert_patched(result)
    assert_unpatched(probe_in(bare_venv, probe_dir, pythonpath_extra=[example], env_extra={"TPU_CLOSURE_FIX": "No"},
                              drop_env=("AUTOWRAPT_BOOTSTRAP",)))


def test_pythonstartup_interactive_only(bare_venv, probe_dir):
    python, _ = bare_venv
    startup = os.path.join(REPO, "sitecustomize_example", "sitecustomize.py")
    env = probe_env(env_extra={"PYTHONSTARTUP": startup}, drop_env=("AUTOWRAPT_BOOTSTRAP",))
    session = "from support import activation_probe\nactivation_probe.interactive()\n"  # typed at the prompt
    proc = subprocess.run([python, "-i", "-q"], input=session, env=env, capture_output=True, text=True, timeout=300,
                          cwd=str(probe_dir))
    line = next(l for l in proc.stdout.splitlines() if "RESULT" in l)
    depths = json.loads(line.split("RESULT", 1)[1])
    assert depths and set(depths.values()) == {1}, depths
    # ... and a script run in the same environment is not touched by PYTHONSTARTUP.
    result, _ = run_probe(python, probe_dir, env_extra={"PYTHONSTARTUP": startup}, drop_env=("AUTOWRAPT_BOOTSTRAP",))
    assert_unpatched(result)


# Every accepted spelling is checked in-process by tests/unit/test_config.py; here one of each kind,
# end to end through the .pth auto-enable.
@pytest.mark.parametrize("value,expect_patched,expect_warning", [
    (None, True, False), ("Yes", True, False), ("OFF", False, False), ("maybe", True, True),
])
def test_switch_values(pth_venv, probe_dir, pth_default_probe, pth_off_probe, value, expect_patched, expect_warning):
    python, _ = pth_venv
    if value is None:
        result, proc = pth_default_probe
    elif value == "OFF":
        result, proc = pth_off_probe
    else:
        result, proc = run_probe(python, probe_dir, env_extra={"TPU_CLOSURE_FIX": value}, args=["--warnings-always"])
    (assert_patched if expect_patched else assert_unpatched)(result)
    # a warning with its lines (a bad value's message starts on the line after Python's location prefix)
    warnings_seen = [line for line in rows(proc.stderr) if "TPUClosureFixWarning" in line]
    if expect_warning:
        assert len(warnings_seen) == 1, proc.stderr
        assert "TPU_CLOSURE_FIX" in warnings_seen[0] and "0/false/off/no" in warnings_seen[0]
    else:
        assert warnings_seen == [], proc.stderr


# --------------------------------------------------------------------------- the switch under any locale
LOCALES = {"ascii stdout": {"PYTHONIOENCODING": "ascii"},
           "C locale": {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}}


def status_text(probe_dir, value, locale):
    env = probe_env(dict(LOCALES[locale], TPU_CLOSURE_FIX=value), pythonpath_extra=[REPO])
    proc = subprocess.run([sys.executable, "-m", "tpu_closure_fix", "status"], env=env, capture_output=True,
                          timeout=300, cwd=str(probe_dir))
    assert b"Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr[-3000:]
    return proc.stdout.decode("ascii"), proc.returncode


def rows(text):
    """The lines of a status text with each wrapped continuation (indented) joined to the line it continues."""
    joined = []
    for line in text.splitlines():
        if line.startswith(" ") and joined and line.strip():
            joined[-1] += " " + line.strip()
        else:
            joined.append(line)
    return joined


@pytest.mark.parametrize("locale", sorted(LOCALES))
def test_a_unicode_space_in_the_switch_is_a_bad_value_under_every_locale(probe_dir, locale):
    """``$'0\\u2003'``: only ASCII whitespace is ignored, so it is not ``0`` (a UTF-8 locale used to strip
    U+2003, a C locale not; status then printed it raw and died on an ASCII stdout)."""
    text, code = status_text(probe_dir, "0\u2003", locale)
    sites = [line for line in rows(text) if ".optimizer_step" in line]
    assert code == 0 and sites and all(" patched" in line and "disabled" not in line for line in sites), text


@pytest.mark.parametrize("locale", sorted(LOCALES))
def test_a_line_break_in_the_switch_is_quoted_on_one_row(probe_dir, locale):
    text, code = status_text(probe_dir, "off\n", locale)
    sites = [line for line in rows(text) if "disabled (" in line and not line.startswith("UNPROTECTED")]
    assert code == 1 and sites, text
    assert all(line.endswith("TPU_CLOSURE_FIX='off\\n')") for line in sites), text
    assert all(line.strip() != ")" for line in text.splitlines()), text

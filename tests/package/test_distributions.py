"""The sdist and the wheel as they would be published (scripts/package_check.py, one test per check).

Builds with ``python -m build`` (build and twine are test-only tools, installed into this interpreter
when missing), then installs each distribution into a fresh venv, its dependencies from the package
index. About a minute on a quiet machine, several when the machine is busy.
"""
import importlib.util
import json
import os
import subprocess
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("package_check", os.path.join(REPO, "scripts", "package_check.py"))
package_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(package_check)

#: Printed by the installed venv's interpreter: was the start-up module imported by the .pth, and armed?
ARMED = ("import json, sys; w = sys.modules.get('_tpu_closure_fix_startup'); "
         "print(json.dumps({'loaded': w is not None, 'armed': any(f is w for f in sys.meta_path)}))")


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    package_check.ensure_tools()
    return package_check.build(str(tmp_path_factory.mktemp("dist")))


def test_twine_check_passes(dists):
    ok, output = package_check.twine_check(dists.values())
    assert ok, output


@pytest.mark.parametrize("key", ["wheel", "wheel_from_sdist"])
def test_the_wheel_holds_the_start_up_files_and_the_bootstrap_folder(dists, key):
    assert package_check.missing_files(package_check.wheel_files(dists[key])) == []


def test_the_wheel_built_from_the_sdist_holds_the_same_files(dists):
    direct, from_sdist = (package_check.wheel_files(dists[key]) for key in ("wheel", "wheel_from_sdist"))
    assert package_check.differences(direct, from_sdist) == []
    assert len(direct) > 20, sorted(direct)  # the whole package, not an empty listing compared with another


def test_the_checks_see_a_missing_and_a_changed_file(tmp_path, dists):
    """The file checks above can fail: a copy of the wheel without the .pth, with another start-up module."""
    files = package_check.wheel_files(dists["wheel"])
    broken = tmp_path / "broken.whl"
    with zipfile.ZipFile(dists["wheel"]) as wheel, zipfile.ZipFile(str(broken), "w") as copy:
        for name in wheel.namelist():
            if name == "tpu_closure_fix.pth":
                continue
            data = wheel.read(name)
            copy.writestr(name, data + b"\n# changed\n" if name == "_tpu_closure_fix_startup.py" else data)
    broken_files = package_check.wheel_files(str(broken))
    assert package_check.missing_files(broken_files) == ["tpu_closure_fix.pth"]
    assert package_check.differences(files, broken_files) == ["_tpu_closure_fix_startup.py", "tpu_closure_fix.pth"]


@pytest.mark.parametrize("key", ["sdist", "wheel"])
def test_installed_from_it_status_runs_and_the_pth_arms_the_watcher(dists, key, tmp_path):
    code, output = package_check.install_and_status(dists[key], str(tmp_path))
    assert code == 0, output
    # no framework in that venv: said as such, about the venv's own fresh interpreter, whose hook is armed
    assert "NOTHING TO PROTECT: no framework or torch_xla release the shim covers is installed" in output, output
    assert "start-up hook: active (armed at interpreter start by the start-up module)" in output, output
    python = str(tmp_path / "venv" / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TPU_CLOSURE_FIX", "VIRTUAL_ENV")}

    def started(switch):
        proc = subprocess.run([python, "-c", ARMED], env=dict(env, TPU_CLOSURE_FIX=switch), capture_output=True,
                              text=True, timeout=120, cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    assert started("1") == {"loaded": True, "armed": True}
    # twin: switched off, the .pth still imports the module, which arms nothing
    assert started("0") == {"loaded": True, "armed": False}

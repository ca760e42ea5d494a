"""The fix an UNPROTECTED outcome names works here: the install command names the source of the running copy
(the package is not on the index), the switch to unset, or the pin; read from facts, never from names."""
import json
import os
import shlex

import pytest
from packaging.requirements import Requirement

from support.outcomes import status_outcome
from tpu_closure_fix import install

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = "/home/user/venv/bin/python"
SITE = "/home/user/venv/lib/python3.11/site-packages"


def installed_copy(tmp_path, direct_url=None, installer="pip"):
    """A site folder holding a copy of the package with its dist-info, as pip leaves it."""
    site = tmp_path / "site"
    (site / "tpu_closure_fix").mkdir(parents=True)
    (site / "tpu_closure_fix" / "__init__.py").write_text("")
    info = site / "tpu_closure_fix-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tpu-closure-fix\nVersion: 0.1.0\n")
    (info / "RECORD").write_text("tpu_closure_fix/__init__.py,,\n")
    if installer:
        (info / "INSTALLER").write_text(installer + "\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))
    return str(site / "tpu_closure_fix")


def a_clone(tmp_path):
    clone = tmp_path / "clone of tpu-closure-fix"
    clone.mkdir()
    with open(os.path.join(REPO, "pyproject.toml")) as handle:
        (clone / "pyproject.toml").write_text(handle.read())
    return str(clone)


def named_path(command):
    """The last word of a shell command: what pip is asked to install."""
    return shlex.split(command)[-1]


def test_run_from_this_checkout_the_command_installs_the_checkout():
    kind, where = install.source(os.path.join(REPO, "tpu_closure_fix"))
    assert (kind, where) == ("checkout", REPO)
    command = install.install_command(PYTHON, os.path.join(REPO, "tpu_closure_fix"))
    assert command.startswith(PYTHON + " -m pip install ")
    assert os.path.isfile(os.path.join(named_path(command), "pyproject.toml"))


def test_installed_from_a_folder_the_record_names_it_while_it_exists(tmp_path):
    clone = a_clone(tmp_path)
    package = installed_copy(tmp_path, {"url": "file://" + clone.replace(" ", "%20"), "dir_info": {}})
    assert install.source(package) == ("checkout", clone)
    assert named_path(install.install_command(None, package)) == clone  # quoted: the path holds spaces
    os.remove(os.path.join(clone, "pyproject.toml"))
    kind, why = install.source(package)
    assert kind is None and "which is gone" in why


def test_installed_from_a_wheel_the_record_names_the_wheel(tmp_path):
    wheel = tmp_path / "tpu_closure_fix-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK")
    package = installed_copy(tmp_path, {"url": "file://" + str(wheel), "archive_info": {}})
    assert install.source(package) == ("wheel", str(wheel))
    assert named_path(install.install_command(PYTHON, package)) == str(wheel)
    wheel.unlink()
    assert install.source(package)[0] is None


def test_installed_from_an_index_names_that_release_and_without_a_record_a_clone(tmp_path):
    package = installed_copy(tmp_path)
    assert install.source(package) == ("index", "0.1.0")
    assert install.install_command(None, package) == "pip install tpu-closure-fix==0.1.0"
    other = installed_copy(tmp_path / "other", installer=None)
    assert install.source(other)[0] is None
    assert install.install_command(None, other) == "pip install " + install.CLONE
    # a dist-info of another copy (not the one running) says nothing about this one
    bare = tmp_path / "bare" / "tpu_closure_fix"
    bare.mkdir(parents=True)
    assert install.source(str(bare))[0] is None


def facts(**changes):
    base = {"executable": PYTHON, "version": "3.11.7", "startup_loaded": False, "startup_armed": False,
            "shim_at_start": False, "switch": None,
            "flags": {"no_site": False, "isolated": False, "ignore_environment": False, "no_user_site": False},
            "shim_origin": None, "site_dirs": [SITE], "pth_in": []}
    base.update(changes)
    return base


def record(verdict, reason="", module="lightning_fabric.plugins.precision.xla", method="XLAPrecision.optimizer_step"):
    return {"distribution": "lightning-fabric", "release": "2.6.6", "module": module, "method": method,
            "verdict": verdict, "reason": reason, "variant": None, "integration": "lightning"}


def outcome(records, **fact_changes):
    return status_outcome({"facts": facts(**fact_changes), "records": records})


def fix_of(reason):
    assert "Fix: " in reason, reason
    return reason.rsplit("Fix: ", 1)[1]


def test_the_start_up_fix_is_an_install_line_that_installs_into_the_training_interpreter():
    name, code, reason = outcome([record("patched")])
    assert (name, code) == ("unprotected", 1)
    command = fix_of(reason).split("`")[1]
    assert command.startswith(PYTHON + " -m pip install ") and "--target" not in command
    path = named_path(command)
    assert os.path.isfile(os.path.join(path, "pyproject.toml")) or (path.endswith(".whl") and os.path.isfile(path))
    assert "pip install tpu-closure-fix" not in reason  # not on the index: that line installs nothing


def test_installed_in_site_packages_without_its_start_up_file_it_is_installed_again():
    reason = outcome([record("patched")], shim_origin=SITE + "/tpu_closure_fix/__init__.py")[2]
    assert " -m pip install --force-reinstall " in fix_of(reason)


def test_under_python_minus_s_the_fix_is_the_import_line():
    reason = outcome([record("patched")], flags={"no_site": True})[2]
    assert fix_of(reason).startswith("add `import tpu_closure_fix` at the top of the training script")


@pytest.mark.parametrize("given, fix", [
    (record("disabled", "TPU_CLOSURE_FIX=0"), "`unset TPU_CLOSURE_FIX`."),
    (record("disabled", "TPU_CLOSURE_FIX='off\\n'"), "`unset TPU_CLOSURE_FIX`."),
    (record("disabled", "TPU_CLOSURE_FIX_DISABLE names lightning"),
     "`unset TPU_CLOSURE_FIX_DISABLE` (or leave lightning out of it)."),
    (record("disabled", "tpu_closure_fix.disable() was called"),
     "remove the call of tpu_closure_fix.disable() from the training script."),
])
def test_a_switched_off_site_names_the_switch_to_unset(given, fix):
    name, code, reason = outcome([given], startup_loaded=True, startup_armed=True,
                                 shim_origin=SITE + "/tpu_closure_fix/__init__.py", pth_in=[SITE])
    assert (name, code) == ("unprotected", 1) and fix_of(reason) == fix, reason


def test_a_skipped_site_names_a_pin_pip_can_read():
    given = record("skipped", "unknown release 2.7.0")
    reason = outcome([given], startup_loaded=True, startup_armed=True,
                     shim_origin=SITE + "/tpu_closure_fix/__init__.py", pth_in=[SITE])[2]
    command = fix_of(reason).split("`")[1]
    assert command.startswith("pip install ")
    pin = Requirement(named_path(command))
    assert pin.name == "lightning-fabric" and "2.6.6" in pin.specifier and "2.7.0" not in pin.specifier


def test_an_uncovered_step_names_a_pin_of_its_frameworks_newest_verified_range():
    found = [{"file": SITE + "/pytorch_lightning/core/optimizer.py", "line": 8,
              "module": "pytorch_lightning.core.optimizer", "function": "LightningOptimizer.__step_on_tpu"}]
    given = {"facts": facts(startup_loaded=True, startup_armed=True, shim_origin=SITE + "/tpu_closure_fix/__init__.py",
                            pth_in=[SITE]), "records": [record("fixed upstream")], "uncovered": found}
    name, code, reason = status_outcome(given)
    assert (name, code) == ("could not verify", 3)
    pin = Requirement(named_path(fix_of(reason).split("`")[1]))
    assert pin.name == "pytorch-lightning" and "2.6.6" in pin.specifier and "2.6.7" not in pin.specifier

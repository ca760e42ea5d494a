"""A lightning-fabric release the table does not name: patched by code identity, or guarded.

lightning-fabric 2.6.6 is presented as a newer release: a copy of the
installed package whose ``version.info`` says 2.6.7 (or 2.9.0), put first on
the path, exactly what a user upgrading past the table would import. Its
``XLAPrecision.optimizer_step`` is the 2.6.6 code, so the shim recognises it by
its fingerprint (tpu_closure_fix.identity, the row's recorded ``fingerprints``)
and patches it with the 2.6.6 row's fix; status says why. A second copy also
edits that method's body (it still hands the caller's closure to
``xm.optimizer_step``, in ``optimizer_args``): no row may claim that code, the
site is skipped, and the torch_xla guard protects its call (status
``guarded``).

Each is checked on 2 gloo replicas (support.replica, the Fabric loop with
``optimizer.step(closure)``) against the plain-PyTorch reference, with its twin
under TPU_CLOSURE_FIX=0 (diverged; disabled / unprotected).
"""
import json
import subprocess
import sys

import pytest

from conftest import TESTS, child_env, run_replicas, target_dir
from support import expectations
from support.package_copy import copy_presented_as, replace_once

FABRIC_SITE = "lightning_fabric.plugins.precision.xla:XLAPrecision.optimizer_step"
GUARD_SITE = "torch_xla.core.xla_model:optimizer_step"
SCENARIO = dict(expectations.SCENARIOS["lite-sgd"], name="lite-sgd")
RANKS = (0, 1)

ORIGINAL_CALL = "        return xm.optimizer_step(optimizer, optimizer_args=kwargs, barrier=True)\n"
# The same call, written differently: a different fingerprint, and still the caller's closure in optimizer_args.
EDITED_CALL = ("        result = xm.optimizer_step(optimizer, optimizer_args=kwargs, barrier=True)\n"
               "        return result\n")


def presented_as(root, version, edit=False):
    """A copy of the installed lightning_fabric under ``root`` claiming ``version``; returns ``root``."""
    package = copy_presented_as(target_dir(), "lightning_fabric", root, version)
    if edit:
        replace_once(package / "plugins" / "precision" / "xla.py", ORIGINAL_CALL, EDITED_CALL,
                     "lightning-fabric 2.6.6's XLAPrecision.optimizer_step changed?")
    return root


def replicas(tmp_path_factory, version, edit):
    root = presented_as(tmp_path_factory.mktemp("fabric-%s%s" % (version, "-edited" if edit else "")), version, edit)
    return {shim: run_replicas([SCENARIO], shim, tmp_path_factory.mktemp("replicas"), path_first=[root])
            for shim in (True, False)}


@pytest.fixture(scope="module")
def same_code(tmp_path_factory):
    return replicas(tmp_path_factory, "2.6.7", edit=False)


@pytest.fixture(scope="module")
def edited_code(tmp_path_factory):
    return replicas(tmp_path_factory, "2.6.7", edit=True)


def trajectory(runs, shim, rank):
    return runs[shim][rank]["scenarios"]["lite-sgd"]["params"]


def reference(runs):
    return runs[True][0]["scenarios"]["lite-sgd"]["reference"]


def assert_presented(runs, version):
    for shim in (True, False):
        assert "lightning_fabric %s" % version in runs[shim][0]["lightning"]["lite"], runs[shim][0]["lightning"]


def assert_equal_to_reference(runs):
    ref = reference(runs)
    assert len(ref) == SCENARIO["steps"]
    for rank in RANKS:
        assert trajectory(runs, True, rank) == ref, "replica %d differs from the reference" % rank


def assert_diverged(runs):
    assert trajectory(runs, False, 0) != trajectory(runs, False, 1)
    assert trajectory(runs, False, 0) != reference(runs)


# --------------------------------------------------------------------------- same code, newer release
def test_newer_release_with_the_same_code_is_patched_by_identity(same_code):
    assert_presented(same_code, "2.6.7")
    site = same_code[True][0]["sites"][FABRIC_SITE]
    assert site == {"wrapped": True, "verdict": "patched",
                    "reason": "2.6.7 not in the table; code identical to 2.6.6"}, site
    assert_equal_to_reference(same_code)


def test_newer_release_with_the_same_code_twin(same_code):
    site = same_code[False][0]["sites"][FABRIC_SITE]
    assert (site["wrapped"], site["verdict"]) == (False, "disabled"), site
    assert_diverged(same_code)


def status_records(root, shim):
    """``tpu-closure-fix status --json`` with ``root`` first on the path (no torch_xla: the guard is not
    installed); returns the records."""
    proc = subprocess.run([sys.executable, "-m", "tpu_closure_fix", "status", "--json"],
                          env=child_env(shim, path_first=[root]), capture_output=True, text=True, timeout=300,
                          cwd=TESTS)
    return json.loads(proc.stdout[proc.stdout.index("{"):])["sites"], proc


def test_status_of_a_much_newer_release_with_the_same_code(tmp_path):
    root = presented_as(tmp_path, "2.9.0")
    records, proc = status_records(root, shim=True)
    (site,) = [r for r in records if "%s:%s" % (r["module"], r["method"]) == FABRIC_SITE]
    assert (site["release"], site["verdict"]) == ("2.9.0", "patched"), site
    assert site["reason"] == "2.9.0 not in the table; code identical to 2.6.6", site
    # The twin: switched off, the same site is reported disabled.
    records, proc = status_records(root, shim=False)
    (site,) = [r for r in records if "%s:%s" % (r["module"], r["method"]) == FABRIC_SITE]
    assert (site["release"], site["verdict"]) == ("2.9.0", "disabled"), site
    assert "TPU_CLOSURE_FIX=0" in site["reason"], site


# --------------------------------------------------------------------------- edited code, newer release
def test_edited_code_is_skipped_by_its_row_and_protected_by_the_guard(edited_code):
    assert_presented(edited_code, "2.6.7")
    sites = edited_code[True][0]["sites"]
    site = sites[FABRIC_SITE]
    assert (site["wrapped"], site["verdict"]) == (False, "guarded"), site
    assert "unknown release 2.6.7" in site["reason"] and "torch_xla guard" in site["reason"], site
    assert (sites[GUARD_SITE]["wrapped"], sites[GUARD_SITE]["verdict"]) == (True, "patched"), sites[GUARD_SITE]
    assert_equal_to_reference(edited_code)
    events = [name for name, _ in edited_code[True][0]["scenarios"]["lite-sgd"]["events"]]
    assert events == ["zero_grad", "forward", "backward", "reduce_gradients", "step", "mark_step"] * SCENARIO["steps"]


def test_edited_code_twin(edited_code):
    sites = edited_code[False][0]["sites"]
    site = sites[FABRIC_SITE]
    assert (site["wrapped"], site["verdict"]) == (False, "skipped"), site  # unprotected: the buggy code runs
    assert (sites[GUARD_SITE]["wrapped"], sites[GUARD_SITE]["verdict"]) == (False, "disabled"), sites[GUARD_SITE]
    assert_diverged(edited_code)

"""pytorch-lightning 2.6.6 presented as the next release (2.7.0): the classes it keeps for old import paths.

A copy of the installed ``pytorch_lightning`` whose ``version.info`` says 2.7.0 is put first on the path, as
a user upgrading past the table would import it. Its ``XLAPrecision.optimizer_step`` is the 2.6.6 code (fixed
upstream: identical, so the 2.6.6 row applies), and ``TPUPrecisionPlugin``, ``TPUBf16PrecisionPlugin`` and
``XLAPrecisionPlugin`` (kept for old import paths) inherit it: they are judged as the method they inherit,
fixed upstream too. Two twins move the gradient reduction before the closure: in that method (not identical
to any verified release: left untouched, it and every class inheriting it) and in the helper it reaches,
``_xla_wrap_closure`` (the method still identical: the row's shape checks the helper's order), both
reported unprotected.
"""
import json
import subprocess
import sys

from conftest import TESTS, child_env, target_dir
from support.package_copy import copy_presented_as, replace_once

XLA_SITE = "pytorch_lightning.plugins.precision.xla:XLAPrecision.optimizer_step"
LEGACY = ("pytorch_lightning.plugins.precision.tpu:TPUPrecisionPlugin.optimizer_step",
          "pytorch_lightning.plugins.precision.tpu_bf16:TPUBf16PrecisionPlugin.optimizer_step",
          "pytorch_lightning.plugins.precision.xla:XLAPrecisionPlugin.optimizer_step")
STEP = "        closure_result = optimizer.step(closure=closure, **kwargs)\n"
REDUCED_FIRST = "        xm.reduce_gradients(optimizer)\n" + STEP
HELPER = "        closure_result = closure()\n        xm.reduce_gradients(optimizer)\n"
HELPER_REDUCING_FIRST = "        xm.reduce_gradients(optimizer)\n        closure_result = closure()\n"


LEGACY_CLASS = "class TPUPrecisionPlugin(XLAPrecision):\n"
LEGACY_OVERRIDE = (LEGACY_CLASS + "    def _xla_wrap_closure(self, optimizer, closure):\n"
                   "        import torch_xla.core.xla_model as xm\n\n"
                   "        xm.reduce_gradients(optimizer)\n        return closure()\n\n")


def presented_as(root, version, reorder=False, reorder_helper=False, legacy_override=False):
    package = copy_presented_as(target_dir(), "pytorch_lightning", root, version)
    xla = package / "plugins" / "precision" / "xla.py"
    if reorder:
        replace_once(xla, STEP, REDUCED_FIRST, "pytorch-lightning 2.6.6's XLAPrecision.optimizer_step changed?")
    if reorder_helper:
        replace_once(xla, HELPER, HELPER_REDUCING_FIRST,
                     "pytorch-lightning 2.6.6's XLAPrecision._xla_wrap_closure changed?")
    if legacy_override:
        replace_once(package / "_graveyard" / "tpu.py", LEGACY_CLASS, LEGACY_OVERRIDE,
                     "pytorch-lightning 2.6.6's legacy TPUPrecisionPlugin changed?")
    return str(root)


def status(root):
    proc = subprocess.run([sys.executable, "-m", "tpu_closure_fix", "status", "--json"],
                          env=child_env(True, path_first=[root]), capture_output=True, text=True, timeout=600, cwd=TESTS)
    out = json.loads(proc.stdout)
    return proc.returncode, out, {"%s:%s" % (r["module"], r["method"]): r for r in out["sites"]}


def test_the_next_release_with_the_same_code_is_fixed_upstream_classes_kept_for_old_paths_included(tmp_path):
    code, out, sites = status(presented_as(tmp_path, "2.7.0"))
    assert (code, out["outcome"]) == (0, "protected"), out["reason"]
    assert (sites[XLA_SITE]["release"], sites[XLA_SITE]["verdict"]) == ("2.7.0", "fixed upstream")
    assert sites[XLA_SITE]["reason"] == "2.7.0 not in the table; code identical to 2.6.6"
    for key in LEGACY:
        assert sites[key]["verdict"] == "fixed upstream", sites[key]
        assert sites[key]["reason"].startswith("via pytorch_lightning.plugins.precision.xla.XLAPrecision."
                                               "optimizer_step (2.7.0 not in the table)"), sites[key]


def test_the_twin_with_the_reduction_before_the_closure_is_unprotected(tmp_path):
    code, out, sites = status(presented_as(tmp_path, "2.7.0", reorder=True))
    assert (code, out["outcome"]) == (1, "unprotected"), out["reason"]
    assert sites[XLA_SITE]["verdict"] == "skipped" and "unknown release 2.7.0" in sites[XLA_SITE]["reason"]
    for key in LEGACY:
        assert sites[key]["verdict"] == "skipped", sites[key]
        assert "unknown release 2.7.0" in sites[key]["reason"], sites[key]


def test_the_twin_with_the_helper_reducing_before_the_closure_is_unprotected(tmp_path):
    code, out, sites = status(presented_as(tmp_path, "2.7.0", reorder_helper=True))
    assert (code, out["outcome"]) == (1, "unprotected"), out["reason"]
    site = sites[XLA_SITE]
    assert site["verdict"] == "skipped", site  # never "fixed upstream"
    assert site["reason"] == ("expected the upstream fix, but its helper _xla_wrap_closure loads reduce_gradients "
                              "before closure"), site
    for key in LEGACY:
        assert sites[key]["verdict"] == "skipped", sites[key]


def test_a_class_kept_for_an_old_path_that_overrides_the_helper_is_judged_with_its_own_helper(tmp_path):
    code, out, sites = status(presented_as(tmp_path, "2.7.0", legacy_override=True))
    assert (code, out["outcome"]) == (1, "unprotected"), out["reason"]
    legacy = sites[LEGACY[0]]
    assert legacy["verdict"] == "skipped", legacy
    assert legacy["reason"].endswith("expected the upstream fix, but its helper _xla_wrap_closure loads "
                                     "reduce_gradients before closure"), legacy
    assert sites[XLA_SITE]["verdict"] == "fixed upstream"  # the base itself is unchanged

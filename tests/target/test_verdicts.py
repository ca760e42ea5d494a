"""Property: whenever status claims protection, a call through the site runs closure -> reduce -> step.

For every site family installed on the target (the Trainer plugin and Lite of pytorch-lightning 1.8.6,
the fixed-upstream Trainer and Fabric's XLAPrecision of 2.6.6, accelerate's AcceleratedOptimizer), and
for releases constructed from them (a copy of the installed package that claims a newer release, with
its site's code edited), one child (support.verdict_probe) reads ``status()`` and then runs one
optimizer step through every site with the ``check`` self-test's drivers and recording torch_xla
stand-in. Whenever the verdict is ``patched``, ``guarded`` or ``fixed upstream``, the recorded order
must be the fixed one (every reduction after the backward of its step and before the step).

Constructed releases, each named for what it would get wrong if a verdict were derived from names:

* ``from-import``: Fabric's call goes through ``optimizer_step`` bound by a module-level
  ``from torch_xla.core.xla_model import optimizer_step``. Shim enabled first: that name is the guard
  (``guarded``). Enabled late: it is the original, so the site is ``skipped`` and its call shows the bug.
* ``decorator``: Fabric 2.6.6's text, with ``override`` bound to a wrapping decorator: not identical to
  2.6.6 (never patched as such, which would bypass the decorator); the guard protects its call and the
  decorator's body runs.
* ``identical`` / ``reordered``: the 2.6.6 Trainer's fixed code presented as 2.7.0, unchanged (``fixed
  upstream``: identical to 2.6.6) or reducing before the step while still naming ``_xla_wrap_closure``,
  ``_wrap_closure`` and ``mark_step`` (``skipped``: not verified, and its call shows the bug).

The twin of every run with the shim on is the same run under TPU_CLOSURE_FIX=0: sites the shim
patches are ``disabled`` and their recorded order is the buggy one.
"""
import json
import os
import subprocess
import sys

import pytest

from conftest import PROBE_MARK, TARGET, TESTS, child_env, defined_where, target_dir
from support.package_copy import copy_package, write_source

PROTECTED = ("patched", "guarded", "fixed upstream")
FABRIC_SITE = "lightning_fabric.plugins.precision.xla:XLAPrecision.optimizer_step"
TRAINER_SITE = "pytorch_lightning.plugins.precision.xla:XLAPrecision.optimizer_step"
NEWER = "2.7.0"

FABRIC_CALL = "        return xm.optimizer_step(optimizer, optimizer_args=kwargs, barrier=True)\n"
FABRIC_IMPORT = "from typing_extensions import get_args, override\n"
TRAINER_WRAPS = ("        closure = partial(self._xla_wrap_closure, optimizer, closure)\n"
                 "        closure = partial(self._wrap_closure, model, optimizer, closure)\n")
TRAINER_REDUCES_FIRST = ("        _named_only = self._xla_wrap_closure  # named, never wraps the closure\n"
                         "        xm.reduce_gradients(optimizer)\n"
                         "        closure = partial(self._wrap_closure, model, optimizer, closure)\n")
FROM_IMPORT = """
try:
    from torch_xla.core.xla_model import optimizer_step
except ImportError:  # no torch_xla here: the module still imports
    optimizer_step = None
"""
# The call written differently: another fingerprint, the caller's closure still in optimizer_args.
EDITED_CALL = ("        result = xm.optimizer_step(optimizer, optimizer_args=kwargs, barrier=True)\n"
               "        return result\n")
WRAPPING_OVERRIDE = '''
import functools as _functools

DECORATED_CALLS = []


def override(function):  # the no-op's name, bound to a decorator that wraps
    @_functools.wraps(function)
    def wrapper(*args, **kwargs):
        DECORATED_CALLS.append(function.__name__)
        return function(*args, **kwargs)
    return wrapper
'''


def _edit(path, old, new):
    text = path.read_text()
    assert text.count(old) == 1, "%s changed upstream? %r not found once" % (path, old)
    write_source(path, text.replace(old, new))


def presented(root, package, version, edits=()):
    """A copy of the installed ``package`` under ``root`` claiming ``version``, with ``edits``
    ((relative file, old, new)) applied; returns ``root``."""
    copy_package(os.path.join(target_dir(), package), root / package)
    (root / package / "version.info").write_text(version + "\n")
    for relative, old, new in edits:
        _edit(root / package / relative, old, new)
    return root


XLA_PY = "plugins/precision/xla.py"
CONSTRUCTED = {
    "from-import": ("lightning_fabric", [
        (XLA_PY, FABRIC_IMPORT, FABRIC_IMPORT + FROM_IMPORT),
        (XLA_PY, FABRIC_CALL, "        return optimizer_step(optimizer, optimizer_args=kwargs, barrier=True)\n")]),
    "decorator": ("lightning_fabric", [(XLA_PY, FABRIC_IMPORT, FABRIC_IMPORT + WRAPPING_OVERRIDE)]),
    "edited": ("lightning_fabric", [(XLA_PY, FABRIC_CALL, EDITED_CALL)]),
    "identical": ("pytorch_lightning", []),
    "reordered": ("pytorch_lightning", [(XLA_PY, TRAINER_WRAPS, TRAINER_REDUCES_FIRST)]),
}
ON_TARGET = {
    "lightning-fabric==2.6.6": ("from-import", "decorator"),
    "pytorch-lightning==2.6.6": ("identical", "reordered"),
}


def probe(mode, root=None):
    """Run support.verdict_probe: mode "on" (enabled first), "late" (enabled after the imports) or "off"
    (TPU_CLOSURE_FIX=0); returns {site: result}."""
    env = child_env(mode == "on", path_first=[root] if root else [])
    proc = subprocess.run([sys.executable, "-m", "support.verdict_probe"] + (["--late"] if mode == "late" else []),
                          env=env, capture_output=True, text=True, timeout=600, cwd=TESTS)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    line = [text for text in proc.stdout.splitlines() if text.startswith(PROBE_MARK)][-1]
    return {site["site"]: site for site in json.loads(line[len(PROBE_MARK):])["sites"]}


_runs = {}


def run(tmp_path_factory, mode, constructed=None):
    key = (mode, constructed)
    if key not in _runs:
        root = None
        if constructed:
            package, edits = CONSTRUCTED[constructed]
            root = presented(tmp_path_factory.mktemp(constructed), package, NEWER, edits)
        _runs[key] = probe(mode, root)
    return _runs[key]


def assert_claims_hold(sites):
    """The property, for one run; returns the protected sites (never none: the run must test something)."""
    protected = {name: site for name, site in sites.items() if site["verdict"] in PROTECTED}
    for name, site in protected.items():
        assert site["error"] is None and site["order_ok"], (name, site)
    return protected


SCENARIOS = [("on", None), ("late", None)] + [(mode, constructed) for constructed in ON_TARGET.get(TARGET, ())
                                              for mode in ("on", "late")]


@pytest.mark.parametrize("mode, constructed", SCENARIOS, ids=["%s-%s" % (c or "installed", m) for m, c in SCENARIOS])
def test_every_protection_claim_is_the_fixed_order(tmp_path_factory, mode, constructed):
    assert assert_claims_hold(run(tmp_path_factory, mode, constructed))


@pytest.mark.parametrize("constructed", [None] + list(ON_TARGET.get(TARGET, ())))
def test_twin_without_the_shim_the_patched_sites_run_the_buggy_order(tmp_path_factory, constructed):
    """TPU_CLOSURE_FIX=0: no site the shim would patch or guard claims protection, and they show the bug."""
    on, off = run(tmp_path_factory, "on", constructed), run(tmp_path_factory, "off", constructed)
    assert_claims_hold(off)
    shimmed = [name for name, site in on.items() if site["verdict"] in ("patched", "guarded")]
    assert shimmed
    for name in shimmed:
        assert off[name]["verdict"] in ("disabled", "skipped"), off[name]
        assert off[name]["error"] is None and not off[name]["order_ok"], off[name]


# --------------------------------------------------------------------------- constructed releases
@defined_where(TARGET == "lightning-fabric==2.6.6")
def test_a_name_bound_before_the_guard_is_not_guarded(tmp_path_factory):
    first, late = run(tmp_path_factory, "on", "from-import"), run(tmp_path_factory, "late", "from-import")
    assert first[FABRIC_SITE]["verdict"] == "guarded" and first[FABRIC_SITE]["order_ok"], first[FABRIC_SITE]
    site = late[FABRIC_SITE]
    assert site["verdict"] == "skipped" and "unknown release %s" % NEWER in site["reason"], site
    assert site["error"] is None and not site["order_ok"], site  # the call runs the original: the bug
    assert site["events"][0] == "reduce_gradients(no grads)", site


@defined_where(TARGET == "lightning-fabric==2.6.6")
def test_a_decorator_bound_to_a_wrapper_is_not_identical(tmp_path_factory):
    site = run(tmp_path_factory, "on", "decorator")[FABRIC_SITE]
    assert site["verdict"] == "guarded" and "code identical to" not in site["reason"], site
    assert site["decorated"] >= 1 and site["order_ok"], site  # the decorator's body ran, the order is fixed


@defined_where(TARGET == "pytorch-lightning==2.6.6")
def test_a_newer_release_with_identical_fixed_code_is_fixed_upstream(tmp_path_factory):
    site = run(tmp_path_factory, "on", "identical")[TRAINER_SITE]
    assert (site["release"], site["verdict"]) == (NEWER, "fixed upstream"), site
    assert site["reason"] == "%s not in the table; code identical to 2.6.6" % NEWER, site
    assert site["order_ok"], site


@defined_where(TARGET == "pytorch-lightning==2.6.6")
def test_a_newer_release_that_reduces_first_is_not_fixed_upstream(tmp_path_factory):
    for mode in ("on", "off"):
        site = run(tmp_path_factory, mode, "reordered")[TRAINER_SITE]
        assert site["verdict"] == "skipped" and "not verified" in site["reason"], site
        assert site["error"] is None and not site["order_ok"], site


# --------------------------------------------------------------------------- check judges what status could not verify
def check_json(root):
    proc = subprocess.run([sys.executable, "-m", "tpu_closure_fix", "check", "--json", "--no-graph"],
                          env=child_env(True, path_first=[root]), capture_output=True, text=True, timeout=600,
                          cwd=TESTS)
    return json.loads(proc.stdout[proc.stdout.index("{"):]), proc


@defined_where(TARGET in ON_TARGET)
def test_check_judges_a_not_verified_site_by_the_order_its_call_runs(tmp_path):
    """A constructed newer release (status: skipped, not verified: no torch_xla in check's own process, so
    no guard) is decided by check's event test: Fabric's edited copy reaches the guard in the self-test
    (protected, exit 0); the Trainer copy that reduces first shows the bug (unprotected, exit 1)."""
    constructed = "edited" if TARGET == "lightning-fabric==2.6.6" else "reordered"
    package, edits = CONSTRUCTED[constructed]
    result, proc = check_json(presented(tmp_path, package, NEWER, edits))
    site = FABRIC_SITE if package == "lightning_fabric" else TRAINER_SITE
    (record,) = [r for r in result["status"] if "%s:%s" % (r["module"], r["method"]) == site]
    assert record["verdict"] == "skipped" and "not verified" in record["reason"], record
    (event,) = [e for e in result["event_check"]["sites"] if e["site"] == site]
    assert event["error"] is None, event
    if constructed == "reordered":
        # (the release's other, method-less sites are unknown too: status names one of them first)
        assert (result["exit_code"], proc.returncode, event["ok"]) == (1, 1, False), result["reason"]
        assert event["events"][0] == "reduce_gradients(no grads)", event
    else:
        # Judged by its recorded order: not named unprotected. (Fabric's bf16 subclass, a site that only
        # inherits the method, is not driven: an unknown release of it stays unprotected in check.)
        assert event["ok"] and "%s runs the buggy order" % site not in result["reason"], result["reason"]

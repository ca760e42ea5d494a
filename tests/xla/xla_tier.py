"""Real-torch_xla tier helpers: run ``tpu-closure-fix check`` inside an environment built by scripts/xla_env.sh.

``TPU_CLOSURE_FIX_XLA_PYTHON`` names that environment's interpreter (``bash scripts/xla_env.sh 2.1``
or ``2.9``).  At collection the environment is asked, once, which call sites are installed and
what the table says of them (``status`` in the XLA interpreter); the tests are then defined per
site, only where they apply (a tier without a fixed-upstream site has no fixed-upstream tests).
Without the variable (or with a broken environment) the tier has one test, which fails under CI
(env ``CI`` set) and is skipped otherwise.
"""
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
REPO = os.path.dirname(TESTS)
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from tpu_closure_fix import sites as _sites  # noqa: E402
from tpu_closure_fix.verify import table  # noqa: E402
from tpu_closure_fix.verify.child import RESULT_MARK, run_child  # noqa: E402

XLA_PY = os.environ.get("TPU_CLOSURE_FIX_XLA_PYTHON", "").strip()
TIMEOUT = float(os.environ.get("TPU_CLOSURE_FIX_XLA_TIMEOUT", "900"))  # per child, hard (group kill)
HOW = ("build it with `XLA_PY=$(bash scripts/xla_env.sh 2.9)` (or 2.1) and run with "
       "TPU_CLOSURE_FIX_XLA_PYTHON=\"$XLA_PY\"")

#: The probe asks what ``check`` itself will see: ``tpu-closure-fix status --json`` (imports the shim
#: first, then every installed call-site module, as ``check`` does) and torch_xla's release.
_PROBE = """
import json, runpy, sys
from importlib.metadata import version
sys.argv = ["tpu-closure-fix", "status", "--json"]
import io, contextlib
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        runpy.run_module("tpu_closure_fix", run_name="__main__")
    except SystemExit:
        pass
print(%r + json.dumps({"torch_xla": version("torch_xla"), "status": json.loads(out.getvalue())["sites"]}))
""" % RESULT_MARK


def xla_env(extra=None, drop=("PJRT_DEVICE", "CPU_NUM_DEVICES", "TPU_CLOSURE_FIX", "PYTHONPATH")):
    """The environment of a child in the XLA venv: this checkout first on the path, no PJRT settings
    (the graph check sets its own), the shim on unless ``extra`` says otherwise."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = REPO
    env["PYTHONWARNINGS"] = "ignore"
    env.update(extra or {})
    return env


def _probe():
    """(torch_xla release, [status record]) of the XLA environment, or (None, reason)."""
    if not XLA_PY:
        return None, "TPU_CLOSURE_FIX_XLA_PYTHON is not set"
    if not os.path.exists(XLA_PY):
        return None, "TPU_CLOSURE_FIX_XLA_PYTHON=%r does not exist" % XLA_PY
    run = run_child([XLA_PY, "-c", _PROBE], 300, env=xla_env(), cwd=REPO)
    if run.payload is None:
        return None, "probing %s failed: %s\n%s" % (XLA_PY, run.error, run.stderr_tail(2000))
    return run.payload["torch_xla"], run.payload["status"]


TORCH_XLA, _STATUS = _probe()
UNAVAILABLE = _STATUS if TORCH_XLA is None else None
STATUS = [] if TORCH_XLA is None else _STATUS


def _row(record):
    return next(r for r in _sites.CALL_SITES if r.variant == record["variant"])


def _protected(record):
    """Installed, protected sites with a row, not a subclass inheriting the method."""
    return record["verdict"] in ("patched", "fixed upstream") and record.get("variant") and not _row(record).inherits


def _traced(record):
    """Sites the self-tests drive: protected ones whose integration has a verification driver."""
    return _protected(record) and table.missing_driver(_row(record)) is None


def site_id(record):
    return "%s:%s" % (record["module"], record["method"])


#: site id -> verdict with the shim on, for every site the check traces in this tier
SITES = {site_id(r): r["verdict"] for r in STATUS if _traced(r)}
PATCHED = sorted(s for s, v in SITES.items() if v == "patched")
#: protected sites whose integration has no verification driver yet: named by check, not traced
UNTESTED = sorted(site_id(r) for r in STATUS if _protected(r) and not _traced(r))
FIXED_UPSTREAM = sorted(s for s, v in SITES.items() if v == "fixed upstream")


def unavailable(reason=None):
    reason = reason or UNAVAILABLE
    if os.environ.get("CI"):
        pytest.fail("real-torch_xla tier cannot run under CI: %s; %s" % (reason, HOW), pytrace=False)
    pytest.skip("real-torch_xla tier not run: %s; %s" % (reason, HOW))


_checks = {}


def run_check(label, extra_env=None, args=("--json",), pythonpath=()):
    """``tpu-closure-fix check`` in the XLA interpreter, once per label for the whole session:
    (exit code, parsed JSON or the text, the ChildRun)."""
    if label not in _checks:
        env = xla_env(extra_env)
        env["PYTHONPATH"] = os.pathsep.join(list(pythonpath) + [REPO])
        run = run_child([XLA_PY, "-m", "tpu_closure_fix", "check", "--timeout", str(TIMEOUT)] + list(args),
                        TIMEOUT + 60, env=env, cwd=REPO, marker=None)
        if run.timed_out:
            pytest.fail("check (%s) %s\n%s" % (label, run.error, run.stderr_tail()), pytrace=False)
        output = run.stdout
        if "--json" in args:
            try:
                output = json.loads(run.stdout)
            except ValueError:
                pytest.fail("check (%s) printed no JSON (exit %s):\n%s\n%s"
                            % (label, run.returncode, run.stdout[-2000:], run.stderr_tail()), pytrace=False)
        _checks[label] = (run.returncode, output, run)
    return _checks[label]


def defined_where(condition):
    """Define a test only where it applies (never a skip counted in the results)."""
    def decorate(test):
        return test if condition else None
    return decorate

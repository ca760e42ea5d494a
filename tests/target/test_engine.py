"""Issue #2: idempotency, exact restore on disable(), status() content and the CLI's exit codes.

Each check runs in a fresh interpreter against the real target release.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, TARGET, TESTS, child_env
from support import expectations

LIFECYCLE = textwrap.dedent(
    """
    import importlib, json, sys, warnings
    warnings.simplefilter("ignore")
    import wrapt
    SITES = %r  # (module, qualname) of every row with a fix: passed in, importing the package would enable it

    def depth(obj):
        n = 0
        while isinstance(obj, wrapt.FunctionWrapper):
            n += 1
            obj = obj.__wrapped__
        return n

    originals = {}
    for module_name, qualname in SITES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        cls_name, attr = qualname.rsplit(".", 1)
        cls = getattr(module, cls_name, None)
        if cls is not None and attr in vars(cls):
            original = vars(cls)[attr]
            while isinstance(original, wrapt.FunctionWrapper):  # already patched by the .pth auto-enable
                original = original.__wrapped__
            originals[(module_name, qualname)] = (cls, attr, original)

    def snapshot():
        out = {}
        for (module, qualname), (cls, attr, original) in originals.items():
            current = vars(cls)[attr]
            inner = current
            while isinstance(inner, wrapt.FunctionWrapper):
                inner = inner.__wrapped__
            out[module + ":" + qualname] = {"depth": depth(current), "is_original": current is original,
                                           "wraps_original": inner is original}
        return out

    log = {"before": snapshot(), "auto_enabled": "_tpu_closure_fix_startup" in sys.modules}
    import tpu_closure_fix
    log["import"] = snapshot()
    import tpu_closure_fix
    tpu_closure_fix.enable(); tpu_closure_fix.enable()
    log["enable_twice"] = snapshot()
    importlib.reload(tpu_closure_fix)
    log["reload_package"] = snapshot()
    tpu_closure_fix.disable()
    log["disable"] = snapshot()
    tpu_closure_fix.disable()
    log["disable_twice"] = snapshot()
    tpu_closure_fix.enable()
    log["enable_again"] = snapshot()
    log["status"] = tpu_closure_fix.status()
    print(json.dumps(log))
    """
)


def run(code, shim=True, args=None):
    proc = subprocess.run([sys.executable] + (args or ["-c", code]), env=child_env(shim), capture_output=True,
                          text=True, timeout=300, cwd=TESTS)
    return proc


@pytest.fixture(scope="module")
def log():
    from tpu_closure_fix import sites

    proc = run(LIFECYCLE % ([(s.module, s.qualname) for s in sites.CALL_SITES
                             if s.fix is not None and s.integration == "lightning"],))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def expected_patched(site):
    """From Lightning's history (support/expectations.py), not from the shim's table."""
    if site.startswith(("pytorch_lightning.", "lightning.pytorch.")):
        return expectations.trainer_affected(TARGET)
    return expectations.lite_affected(TARGET)  # Lite/Fabric: every release


def test_lifecycle_one_layer_and_exact_restore(log):
    assert any(expected_patched(site) for site in log["before"]), "the target has no affected call site?"
    # With the wheel's .pth installed, Lightning was already patched on import ("before").
    unpatched = ("disable", "disable_twice") + (() if log["auto_enabled"] else ("before",))
    patched = ("import", "enable_twice", "reload_package", "enable_again") + (("before",) if log["auto_enabled"] else ())
    for stage in unpatched + patched:
        for site, info in log[stage].items():
            if expected_patched(site) and stage in patched:
                assert info == {"depth": 1, "is_original": False, "wraps_original": True}, (stage, site, info)
            else:  # switched off, or fixed upstream: Lightning's own function object, untouched
                assert info == {"depth": 0, "is_original": True, "wraps_original": True}, (stage, site, info)


def test_status_records(log):
    records = log["status"]
    assert {tuple(sorted(r)) for r in records} == {tuple(sorted(
        ("distribution", "release", "module", "method", "verdict", "reason", "variant")))}
    by_site = {"%s:%s" % (r["module"], r["method"]): r for r in records}
    dist, version = expectations.parse_target(TARGET)
    for site in log["enable_again"]:
        record = by_site[site]
        assert record["verdict"] == ("patched" if expected_patched(site) else "fixed upstream"), record
        assert record["release"] == str(version), record
        assert record["variant"]
    if expectations.has_trainer(TARGET) and not expectations.trainer_affected(TARGET):
        fixed = [r for r in records if r["verdict"] == "fixed upstream"]
        assert fixed and all(r["module"].startswith(("pytorch_lightning.", "lightning.pytorch.")) for r in fixed)


def test_cli_status_exit_codes_and_json():
    enabled = run(None, shim=True, args=["-m", "tpu_closure_fix", "status", "--json"])
    assert enabled.returncode == 0, enabled.stdout + enabled.stderr[-2000:]
    records = json.loads(enabled.stdout)
    patched = [r for r in records if r["verdict"] == "patched"]
    assert patched
    # The twin: the same environment with the switch off is reported, and gated, as unprotected.
    disabled = run(None, shim=False, args=["-m", "tpu_closure_fix", "status", "--json"])
    assert disabled.returncode == 1
    off = {(r["module"], r["method"]): r for r in json.loads(disabled.stdout)}
    for r in patched:
        assert off[(r["module"], r["method"])]["verdict"] == "disabled"
        assert "TPU_CLOSURE_FIX=0" in off[(r["module"], r["method"])]["reason"]



def test_cli_table_via_console_script():
    script = os.path.join(os.path.dirname(sys.executable), "tpu-closure-fix")
    args = [script, "status"] if os.path.exists(script) else None
    if args is None:  # running from a source checkout: the console script is not installed
        args = [sys.executable, "-c", "import sys; from tpu_closure_fix.cli import main; sys.exit(main())", "status"]
    proc = subprocess.run(args, env=child_env(True), capture_output=True, text=True, timeout=300, cwd=TESTS)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "patched" in proc.stdout and "OK:" in proc.stdout


UNKNOWN_RELEASE = textwrap.dedent(
    """
    import importlib, json, sys, warnings
    warnings.simplefilter("ignore")
    SITES = %r
    loaded = []
    for module_name, qualname in SITES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        cls = getattr(module, qualname.split(".")[0], None)
        if cls is not None and qualname.split(".")[1] in vars(cls):
            loaded.append((module_name, qualname, vars(cls)[qualname.split(".")[1]]))
    # A release newer than any row (what a user gets after upgrading Lightning past the table):
    for top in ("pytorch_lightning", "lightning", "lightning_lite", "lightning_fabric"):
        if top in sys.modules:
            sys.modules[top].__version__ = "99.0.0"
    import os
    os.environ["TPU_CLOSURE_FIX"] = "1"  # the parent set 0 to keep the .pth auto-enable out of the way so far
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        import tpu_closure_fix
        tpu_closure_fix.enable()
    untouched = all(vars(getattr(importlib.import_module(m), q.split(".")[0]))[q.split(".")[1]] is f
                    for m, q, f in loaded)
    print(json.dumps({"untouched": untouched, "loaded": len(loaded), "status": tpu_closure_fix.status(),
                      "warnings": [str(w.message) for w in seen if w.category.__name__ == "TPUClosureFixWarning"]}))
    """
)


def test_unknown_release_is_left_untouched_and_reported():
    from tpu_closure_fix import sites

    keys = sorted({(s.module, s.qualname) for s in sites.CALL_SITES if s.fix is not None and s.integration == "lightning"})
    env = child_env(True)
    env["TPU_CLOSURE_FIX"] = "0"  # keep the .pth auto-enable out of the way until the version is changed
    code = UNKNOWN_RELEASE % (keys,)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=TESTS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["loaded"] and out["untouched"], out
    skipped = [r for r in out["status"] if r["verdict"] == "skipped"]
    assert skipped and all("unknown release 99.0.0" in r["reason"] for r in skipped), out["status"]
    assert not [r for r in out["status"] if r["verdict"] == "patched"]
    assert out["warnings"] and all("unknown release 99.0.0" in w for w in out["warnings"])


def test_loaded_code_has_the_fingerprint_recorded_in_its_row():
    """The code-identity rule patches a release no row names only when its code's fingerprint equals one
    recorded in a row: those must be the fingerprints of the code this target really loads (checked by
    scripts/fingerprints.py against the table, in a subprocess with the target's code imported)."""
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "fingerprints.py"), "check", TARGET],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "fingerprints check: ok" in proc.stdout
